"""Drive the real Hermes Agent in hermetic child processes: tenant homes, child env, one-shot turns.

Every child sees a throw-away HOME (the real one is asserted untouched), HERMES_HOME under it, and no
credential-shaped variable from the caller. The launch tenant lives at HOME/.hermes, every other tenant
at HOME/.hermes/profiles/<name>; each has its own config.yaml, .env (the provider key under the SAME
variable name everywhere), memories/MEMORY.md and SOUL.md.
"""

from __future__ import annotations

import json
import os
import pwd
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.core.procs import ProcessSet
from harness.core.registry import Tenant, new_tag

PROVIDER_KEY_ENV = "TENANT_PROVIDER_KEY"
PROVIDER_ID = "tenantprov"
_STRIP_SUFFIXES = ("_API_KEY", "_TOKEN", "_BASE_URL", "_SECRET", "_ACCESS_KEY", "_KEY_ID", "_KEY", "_PASSWORD")
_STRIP_PREFIXES = (
    "HERMES_", "OPENAI", "ANTHROPIC", "OPENROUTER", "AWS_", "AZURE_", "GOOGLE_", "GEMINI", "PYTEST_", "NOUS_",
    "XAI_", "LLM_", "CUSTOM_", "TERMINAL_", "TENANT_", "API_SERVER_", "GITHUB_", "HF_", "MISTRAL", "GROQ",
    "DEEPSEEK", "TOGETHER", "COHERE", "SSH_", "GPG_", "VIRTUAL_ENV", "PYTHON", "CONDA", "MITMPROXY",
)
_STRIP_EXACT = {
    "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy", "NO_PROXY", "no_proxy",
    "XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR",
    "DBUS_SESSION_BUS_ADDRESS", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    "PYENV_VERSION", "KUBECONFIG", "DOCKER_HOST",
}


class HermesError(RuntimeError):
    """Hermes is missing, broken, or its sandbox would escape; the message is one line."""


def require_python(python: Path) -> None:
    """The Hermes install's python must exist (checked before anything is written)."""
    if not Path(python).exists():
        raise HermesError(f"Hermes python {python} does not exist (run ./tenancy once, or pass --hermes-python)")


def real_home() -> Path:
    return Path(pwd.getpwuid(os.getuid()).pw_dir).resolve()


def is_credential_shaped(name: str) -> bool:
    upper = name.upper()
    return name in _STRIP_EXACT or upper.endswith(_STRIP_SUFFIXES) or upper.startswith(_STRIP_PREFIXES)


def hermetic_env(home: Path, hermes_python: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a Hermes child: fake HOME, HERMES_HOME under it, nothing credential-shaped."""
    home = home.resolve()
    real = real_home()
    if home == real or home / ".hermes" == real / ".hermes" or real.is_relative_to(home):
        raise HermesError(f"sandbox HOME {home} is (or contains) the real home {real}")
    env = {k: v for k, v in os.environ.items() if not is_credential_shaped(k)}
    bindir = str(Path(hermes_python).parent)
    env.update(
        HOME=str(home),
        HERMES_HOME=str(home / ".hermes"),
        XDG_STATE_HOME=str(home / ".local" / "state"),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        PATH=os.pathsep.join([bindir, "/usr/local/bin", "/usr/bin", "/bin"]),
        NO_COLOR="1",
        TERM="dumb",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        # Hermes' live-DB guard treats $HOME/.hermes/state.db as production; this HOME is a sandbox.
        HERMES_STATE_DB_GUARD_BYPASS="1",
        HERMES_ACCEPT_HOOKS="1",
        # Seals the Hermes venv: no feature's package is pip-installed into it at run time (Hermes' lazy installs;
        # every profile also says `security.allow_lazy_installs: false`, but a process whose config it cannot read
        # installs anyway), so the venv stays exactly its lock and every run offers the same tools.
        HERMES_DISABLE_LAZY_INSTALLS="1",
    )
    env.update(extra or {})
    return env


@dataclass
class Sandbox:
    """The throw-away HOME every Hermes child of one run shares, plus the tenants' terminal cwds. HOME's name
    holds a random tag, so every tenant's home path is a canary (`home`) that no other text can hold."""

    root: Path
    launch: str = "default"
    tag: str = field(default_factory=new_tag)

    @property
    def home(self) -> Path:
        return self.root / f"home-{self.tag}"

    @property
    def hermes_root(self) -> Path:
        return self.home / ".hermes"

    def home_of(self, tenant: str) -> Path:
        return self.hermes_root if tenant == self.launch else self.hermes_root / "profiles" / tenant

    def profile_args(self, tenant: str) -> list[str]:
        return [] if tenant == self.launch else ["-p", tenant]


def tenant_config(tenant: Tenant, base_url: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """config.yaml of one tenant: a custom provider whose key comes from the profile's own .env."""
    cfg: dict[str, Any] = {
        "model": {"provider": f"custom:{PROVIDER_ID}", "default": tenant.model, "context_length": 128000},
        "providers": {
            PROVIDER_ID: {
                "name": PROVIDER_ID,
                "base_url": base_url,
                "key_env": PROVIDER_KEY_ENV,
                "default_model": tenant.model,
            }
        },
        # No toolchain probe: its line in the system prompt would depend on the machine's Python and pip (and it
        # runs pip twice in every Hermes process).
        "agent": {"api_max_retries": 1, "environment_probe": False},
        "terminal": {"backend": "local", "cwd": tenant.canaries["workdir"]},
        # No background review: it would run the stubs' scripted plan in a side conversation of its own.
        "memory": {"memory_enabled": True, "nudge_interval": 0},
        "skills": {"creation_nudge_interval": 0},
        "compression": {"enabled": False},
        # The scripted model's tool calls need no one to approve them: the API server has no one to ask.
        "approvals": {"mode": "off"},
    }
    for key, value in (extra or {}).items():
        base = cfg.get(key)
        cfg[key] = {**base, **value} if isinstance(base, dict) and isinstance(value, dict) else value
    return cfg


def tenant_dotenv(tenant: Tenant, *, launch: bool, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The profile's .env. Only the launch profile sets API_SERVER_KEY: Hermes' multiplexed gateway skips a
    profile whose .env sets it (it takes it for a profile running a gateway of its own). The others hold theirs as
    API_SERVER_PROFILE_KEY, the per-profile key of F4's fix (docs/fixes/F4.patch), which 0.19.0 ignores."""
    return {
        PROVIDER_KEY_ENV: tenant.key,
        "API_SERVER_KEY" if launch else "API_SERVER_PROFILE_KEY": tenant.canaries["api_server_key"],
        "TENANT_MARKER": tenant.canaries["env_marker"],
        **(extra or {}),
    }


def write_home(
    tenant: Tenant,
    home: Path,
    base_url: str,
    *,
    launch: bool,
    extra_config: dict[str, Any] | None = None,
    extra_env: dict[str, str] | None = None,
) -> None:
    """Lay down one tenant's Hermes home and its terminal cwd."""
    home.mkdir(parents=True, exist_ok=True)
    Path(tenant.canaries["workdir"]).mkdir(parents=True, exist_ok=True)
    cfg = tenant_config(tenant, base_url, extra_config)
    (home / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    env = tenant_dotenv(tenant, launch=launch, extra=extra_env)
    dotenv = home / ".env"
    dotenv.write_text("".join(f"{k}={v}\n" for k, v in env.items()), encoding="utf-8")
    dotenv.chmod(0o600)
    (home / "memories").mkdir(exist_ok=True)
    (home / "memories" / "MEMORY.md").write_text(f"{tenant.canaries['memory']}\n", encoding="utf-8")
    (home / "SOUL.md").write_text(f"You are {tenant.canaries['soul']}.\n", encoding="utf-8")


@dataclass
class TurnResult:
    """One driven turn: did it complete, and what did Hermes print."""

    tenant: str
    driver: str
    ok: bool
    seconds: float
    detail: str = ""
    log: Path | None = None
    usage: dict[str, Any] = field(default_factory=dict)


@dataclass
class Hermes:
    """The Hermes install under test (its own venv's python) and the sandbox its children share."""

    python: Path
    sandbox: Sandbox
    procs: ProcessSet
    logs: Path
    route_env: dict[str, str] = field(default_factory=dict)  # how children reach the proxy (forward topology)
    usage_file: bool = True  # `hermes -z --usage-file` exists (`features.probe`); else a turn is judged by rc

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return hermetic_env(self.sandbox.home, self.python, {**self.route_env, **(extra or {})})

    def check(self) -> str:
        """Hermes' version; proves the install works and the profile root resolves inside the sandbox."""
        require_python(self.python)
        self.sandbox.home.mkdir(parents=True, exist_ok=True)
        # Hermes' shells are login shells: /etc/profile sets PATH again, then the sandbox HOME's .bash_profile
        # puts the Hermes venv's bin/ first again, so its tools find the programs pinned in its lock
        # (`install.PROGRAMS`: ripgrep for search_files) on every machine, and the machine's own never.
        (self.sandbox.home / ".bash_profile").write_text(
            f'export PATH="{self.python.parent}:$PATH"\n', encoding="utf-8")
        code = (
            "import json, importlib.metadata as m; from hermes_cli.profiles import _get_profiles_root as r; "
            "print(json.dumps({'version': m.version('hermes-agent'), 'root': str(r())}))"
        )
        try:
            rc, out, err = self.procs.run([str(self.python), "-c", code], env=self.env(), cwd=self.sandbox.home,
                                          timeout=120)
        except OSError as exc:
            raise HermesError(f"Hermes python {self.python} cannot be run: {exc.strerror}") from None
        if rc != 0:
            last = (err.strip().splitlines() or ["no output"])[-1]
            raise HermesError(f"Hermes at {self.python} is broken: {last[:200]}")
        info = json.loads(out.strip().splitlines()[-1])
        root = Path(info["root"]).resolve()
        if not root.is_relative_to(self.sandbox.root.resolve()):
            raise HermesError(f"Hermes' profile root {root} escapes the sandbox {self.sandbox.root}")
        return str(info["version"])

    def oneshot(self, tenant: str, prompt: str, *, timeout: float = 180.0, extra_env: dict[str, str] | None = None,
                label: str = "oneshot") -> TurnResult:
        """`hermes [-p NAME] -z PROMPT`; completion is judged by --usage-file, not the exit code (by the exit code
        on a release without --usage-file: 0 once a final response was printed)."""
        self.logs.mkdir(parents=True, exist_ok=True)
        n = len(list(self.logs.glob(f"{label}-{tenant}-*.log")))
        log = self.logs / f"{label}-{tenant}-{n}.log"
        usage_path = self.logs / f"{label}-{tenant}-{n}.usage.json"
        argv = [str(self.python), "-m", "hermes_cli.main", *self.sandbox.profile_args(tenant), "-z", prompt]
        argv += ["--usage-file", str(usage_path)] if self.usage_file else []
        started = time.monotonic()
        rc, out, err = self.procs.run(argv, env=self.env(extra_env), cwd=self.sandbox.home, timeout=timeout)
        seconds = time.monotonic() - started
        log.write_text(f"$ hermes {' '.join(argv[3:])}\n[rc={rc}]\n--- stdout\n{out}\n--- stderr\n{err}\n")
        log.chmod(0o600)
        try:
            usage = json.loads(usage_path.read_text())
        except (OSError, ValueError):
            usage = {}
        completed = usage.get("completed") is True and not usage.get("failed") if self.usage_file else rc == 0
        ok = rc is not None and completed
        if rc is None:
            detail = f"killed after {timeout:.0f}s timeout"
        elif not ok:
            detail = (out.strip() or err.strip() or f"rc={rc}").splitlines()[-1][:200]
        else:
            detail = ""
        return TurnResult(tenant, label, ok, seconds, detail, log, usage)


def gateway_config(port: int, key: str) -> dict[str, Any]:
    """Launch-profile config that turns on the multiplexed gateway's API server on 127.0.0.1."""
    return {"gateway": {"multiplex_profiles": True},
            "platforms": {"api_server": {"enabled": True, "extra": {"host": "127.0.0.1", "port": port, "key": key}}}}

"""Hermes releases installed on demand into cached venvs, each exactly as its lock pins it; `PIN`, the release
audited by default.

Every release is installed from a lock with hashes (`--require-hashes --no-deps`): the one committed under `locks/`
(`./tenancy lock VERSION` writes it; the wheel ships them as `harness/drive/hermes/locks/`), else one made on its first
install with pip's resolver (`pip install --dry-run --report`) and kept beside the cached venvs. The lock holds
Hermes with the extras the audit's services need (`EXTRAS`: Hermes' own pins for them; a release without such an
extra installs without it and the service is `n/a` there).

The cache is `$XDG_CACHE_HOME/tenancy-audit/hermes/<version>-<lock key>/` (`~/.cache` without XDG_CACHE_HOME), the
key the first 12 hex digits of the lock's sha256: another lock is another folder. A cached venv is reused only
when its distributions are the lock's (else it is installed again). An install runs the stdlib `venv` and pip,
each in its own process group with a timeout, in a hidden temporary folder that is renamed into place only when
pip succeeded: a folder named after a version and key is always a complete install. The venv's scripts name the
final path in their `#!` line.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any

from harness.core.distributions import DistributionError, differences, installed, lock_digest, lock_versions
from harness.core.files import write_private
from harness.core.places import CHECKOUT, cache_dir
from harness.core.procs import ProcessSet
from harness.drive.hermes.agent import HermesError

#: The hermes-agent release audited by default (./tenancy bootstraps it into the checkout's `.hermes-venv/`; an
#: installed tenancy-audit into the cache).
PIN = "0.19.0"
#: Seconds pip may take for one release (its dependencies included).
INSTALL_TIMEOUT = 1200.0
#: A hidden temporary folder older than this is the leftover of a killed install.
STALE_SECONDS = 2 * INSTALL_TIMEOUT
#: Hex digits of the lock's sha256 in the name of a cached venv.
KEY_DIGITS = 12


#: Hermes' extras the audit needs in the Hermes venv: `mcp` (its MCP client) and `homeassistant` (only aiohttp,
#: which the gateway's API server needs: Hermes would otherwise install it at run time, and every profile of the
#: audit forbids that, `security.allow_lazy_installs: false`), and the SDKs of the memory providers Honcho
#: (`honcho`), Supermemory (`supermemory`) and Hindsight (`hindsight`), which Hermes would otherwise install on
#: first use, `acp` (the ACP adapter's `agent-client-protocol`, which the `acp` door drives) and `messaging` (the
#: SDKs of the gateway's Telegram, Discord and Slack adapters: python-telegram-bot, discord.py, slack-bolt and
#: slack-sdk, which the messaging platforms drive). mem0 in self-hosted mode and the web backend (Tavily) need none.
EXTRAS = ("mcp", "homeassistant", "honcho", "supermemory", "hindsight", "acp", "messaging")
#: Programs Hermes' tools look for on PATH, pinned in every Hermes venv (its bin/ is first on a Hermes child's
#: PATH), so that the tool surface is the same on every machine: `search_files` runs ripgrep when `rg` is found and
#: otherwise `grep --exclude-dir='.*'`, which skips every folder below a hidden one (`~/.hermes/...`), so without it
#: the tool never reaches another profile's files (docs/baselines.md, "What differed between machines").
PROGRAMS = ("ripgrep==14.1.0",)


def requirements(version: str) -> list[str]:
    """What a release's lock resolves: `hermes-agent[EXTRAS]==version` and `PROGRAMS` (`./tenancy lock` too)."""
    return [f"hermes-agent[{','.join(EXTRAS)}]=={version}", *PROGRAMS]


class InstallError(HermesError):
    """pip could not install a release; one line naming the release and pip's reason."""


@dataclass(frozen=True)
class Lock:
    """A release's lock: committed (shipped with tenancy-audit) or made on its first install (`committed` False)."""

    version: str
    path: Path
    committed: bool

    @cached_property
    def key(self) -> str:
        """What names its cached venv: the first `KEY_DIGITS` hex digits of the lock's sha256."""
        try:
            return lock_digest(self.path)[:KEY_DIGITS]
        except DistributionError as exc:
            raise InstallError(str(exc)) from None


def cache_root() -> Path:
    return cache_dir() / "hermes"


def committed_lock(version: str) -> Path | None:
    """The lock of a release committed under `locks/` (package data `harness/drive/hermes/locks/`), if there is one."""
    path = Path(str(resources.files("harness.drive.hermes") / "locks" / f"hermes-{version}.txt"))
    return path if path.is_file() else None


def made_lock(version: str, root: Path | None = None) -> Path:
    """Where the lock made on a release's first install is kept: beside the cached venvs."""
    return (root or cache_root()) / f"hermes-{version}.txt"


def find_lock(version: str, root: Path | None = None) -> Lock | None:
    """The release's lock: the committed one, else the one made on an earlier install; None before that."""
    committed = committed_lock(version)
    if committed is not None:
        return Lock(version, committed, True)
    made = made_lock(version, root)
    return Lock(version, made, False) if made.is_file() else None


def venv_dir(lock: Lock, root: Path | None = None) -> Path:
    """The cached venv of a release installed from `lock`: `<version>-<lock key>`."""
    return (root or cache_root()) / f"{lock.version}-{lock.key}"


def cached_python(version: str, root: Path | None = None) -> Path:
    """The python of the release's cached venv (which may not exist yet); InstallError when it has no lock yet."""
    lock = find_lock(version, root)
    if lock is None:
        raise InstallError(f"hermes-agent {version} has no lock yet: its first install makes one")
    return venv_dir(lock, root) / "bin" / "python"


def default_python(say: Callable[[str], None] | None = None) -> Path:
    """The Hermes audited without --hermes-python or $TENANCY_HERMES_PYTHON: in a checkout its `.hermes-venv/`,
    else `PIN` in the cache, installed first when `say` is given (a run; `--version` only names it)."""
    if CHECKOUT is not None:
        return CHECKOUT / ".hermes-venv" / "bin" / "python"
    return install(PIN, say) if say else cached_python(PIN)


def drift(python: Path, lock: Lock) -> str | None:
    """How the venv of `python` differs from `lock` (one line, pip and setuptools left out), None when it holds
    exactly the lock's distributions."""
    try:
        return differences(installed(python), lock_versions(lock.path), f"the hermes-agent {lock.version} venv")
    except DistributionError as exc:
        return str(exc)


def venv_record(python: Path, version: str | None) -> dict[str, Any]:
    """What an evidence folder records of the Hermes it audited: every distribution its venv holds and the lock of
    its release (file, sha256, committed or made, and one line saying how the venv differs from it, or None)."""
    try:
        found = installed(python)
    except DistributionError as exc:
        return {"installed": {}, "lock": None, "problem": str(exc)}
    lock = find_lock(version) if version else None
    if lock is None:
        return {"installed": found, "lock": None}
    try:
        differs = differences(found, lock_versions(lock.path), f"the hermes-agent {version} venv")
        digest = lock_digest(lock.path)
    except DistributionError as exc:
        differs, digest = str(exc), ""
    return {"installed": found, "lock": {"file": lock.path.name, "sha256": digest, "committed": lock.committed,
                                         "differs": differs}}


def cached(lock: Lock, say: Callable[[str], None], root: Path | None = None) -> Path | None:
    """The python of the release's cached venv when it holds exactly the lock's distributions; a cached venv that
    differs is removed (None, with one line saying how it differed)."""
    python = venv_dir(lock, root) / "bin" / "python"
    if not python.parent.parent.is_dir():
        return None
    problem = drift(python, lock) if python.exists() else "no bin/python"
    if problem is None:
        return python
    say(f"hermes-agent {lock.version}: {problem}; installing it again")
    shutil.rmtree(python.parent.parent, ignore_errors=True)
    return None


def _last_error(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR")]
    return ((errors or lines or ["no output"])[-1])[:240]


def _relink_scripts(venv: Path, final: Path) -> None:
    """Point the `#!` line of every script in the venv's bin/ at the place it is renamed to."""
    before, after = f"#!{venv}/".encode(), f"#!{final}/".encode()
    for script in (venv / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        data = script.read_bytes()
        if data.startswith(before):
            script.write_bytes(after + data[len(before):])


def _drop_stale(root: Path, version: str) -> None:
    for tmp in root.glob(f".{version}-tmp*"):
        if time.time() - tmp.stat().st_mtime > STALE_SECONDS:
            shutil.rmtree(tmp, ignore_errors=True)


def installer(python: Path, lock: Path) -> list[str]:
    """The command that installs exactly `lock` (hashes required, no dependency of its own) into the venv of
    `python`: uv of the harness venv when it has one (the `[test]` extra; about ten times faster than pip, which
    counts in CI), else that venv's pip."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    if uv is not None:
        return [uv, "pip", "install", "--quiet", "--no-config", "--python", str(python), "--require-hashes",
                "--no-deps", "-r", str(lock)]
    return [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--require-hashes",
            "--no-deps", "-r", str(lock)]


def lock_lines(version: str, report: dict[str, Any]) -> str:
    """A lock made from pip's installation report (`--dry-run --report`): one `name==version --hash` line per
    distribution pip chose for this interpreter, after a comment naming what was resolved, where and how."""
    lines = [f"# {' '.join(requirements(version))}: no committed lock, made by tenancy-audit with pip install "
             f"--dry-run --report on CPython {platform.python_version()} ({sys.platform}, {platform.machine()})"]
    for item in sorted(report.get("install", []), key=lambda i: i["metadata"]["name"].lower()):
        name, ver = item["metadata"]["name"], item["metadata"]["version"]
        digest = ((item.get("download_info") or {}).get("archive_info") or {}).get("hashes", {}).get("sha256")
        if not digest:
            raise InstallError(f"pip gave no sha256 for {name} {ver} of hermes-agent=={version}")
        lines.append(f"{name}=={ver} --hash=sha256:{digest}")
    return "\n".join(lines) + "\n"


def make_lock(version: str, python: Path, procs: ProcessSet, timeout: float, root: Path | None = None) -> Lock:
    """Resolve the release with the pip of `python` (nothing is installed) and keep the lock beside the cached
    venvs. InstallError when pip cannot resolve it; nothing is written then."""
    with tempfile.TemporaryDirectory(prefix="tenancy-lock-") as tmp:
        report = Path(tmp) / "report.json"
        rc, out, err = procs.run([str(python), "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                                  "--disable-pip-version-check", "--report", str(report), *requirements(version)],
                                 env=_child_env(), cwd=tmp, timeout=timeout)
        if rc is None:
            raise InstallError(f"resolving hermes-agent=={version} took longer than {timeout:.0f}s")
        if rc != 0:
            raise InstallError(f"pip cannot install hermes-agent=={version}: {_last_error(err or out)}")
        text = lock_lines(version, json.loads(report.read_text(encoding="utf-8")))
    path = made_lock(version, root)
    write_private(path, text.encode())
    return Lock(version, path, False)


def lock_for(version: str, say: Callable[[str], None], *, root: Path | None = None,
             timeout: float = INSTALL_TIMEOUT) -> Lock:
    """The release's lock (`find_lock`), made first with this interpreter's pip when there is none, which `say`
    reports (./tenancy's bootstrap)."""
    lock = find_lock(version, root)
    if lock is not None:
        return lock
    procs = ProcessSet()
    try:
        lock = make_lock(version, Path(sys.executable), procs, timeout, root)
    finally:
        procs.close()
    say(f"no committed lock for {version}: made one at {lock.path}")
    return lock


def _child_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}


def install(version: str, say: Callable[[str], None], *, root: Path | None = None,
            timeout: float = INSTALL_TIMEOUT) -> Path:
    """The python of `hermes-agent==version` in the cache, exactly as its lock pins it, installing it first if
    needed (one progress line; another when the lock had to be made). InstallError when venv or pip fail; nothing
    is left in the cache then."""
    root = root or cache_root()
    lock = find_lock(version, root)
    python = cached(lock, say, root) if lock else None
    if python is not None:
        say(f"hermes-agent {version}: cached at {python.parent.parent}")
        return python
    try:
        root.mkdir(parents=True, exist_ok=True)
        _drop_stale(root, version)
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{version}-tmp"))
    except OSError as exc:
        raise InstallError(f"cannot create the Hermes cache {root}: {exc.strerror or exc}") from None
    started = time.monotonic()
    procs = ProcessSet()
    made: Lock | None = None

    def left() -> float:
        return max(timeout - (time.monotonic() - started), 1.0)

    try:
        rc, out, err = procs.run([sys.executable, "-m", "venv", str(tmp)], env=_child_env(), cwd=tmp, timeout=left())
        if rc is None:
            raise InstallError(f"creating the venv of hermes-agent=={version} took longer than {timeout:.0f}s")
        if rc != 0:
            raise InstallError(f"cannot create a venv for hermes-agent=={version}: {_last_error(err or out)}")
        if lock is None:
            lock = made = make_lock(version, tmp / "bin" / "python", procs, left(), root)
            say(f"no committed lock for {version}: made one at {lock.path}")
        rc, out, err = procs.run(installer(tmp / "bin" / "python", lock.path), env=_child_env(), cwd=tmp,
                                 timeout=left())
        if rc is None:
            raise InstallError(f"installing hermes-agent=={version} took longer than {timeout:.0f}s")
        if rc != 0:
            raise InstallError(f"pip cannot install hermes-agent=={version}: {_last_error(err or out)}")
        final = venv_dir(lock, root)
        python = final / "bin" / "python"
        _relink_scripts(tmp, final)
        try:
            tmp.rename(final)
        except OSError:  # another run installed it meanwhile
            if not python.exists():
                raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if made is not None:
            made.path.unlink(missing_ok=True)
        raise
    finally:
        procs.close()
    shutil.rmtree(tmp, ignore_errors=True)  # only left when another run won the rename
    say(f"hermes-agent {version}: installed in {time.monotonic() - started:.0f}s at {final}")
    return python

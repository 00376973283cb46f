"""F55-F57 in Hermes' own config loading, on an install and on hard-linked copies with F55.patch and F57.patch: alpha's
gateway config loaded and its ntfy adapter built under alpha's runtime scope, the launch profile's `.env` in the
process environment (the loader of tests/test_ntfy.py). F56 and F57 need a launch profile that lacks an ntfy setting,
which no audit configures, so patch-check cannot show them (F55.result.md, F57.result.md).

    .venv/bin/python docs/fixes/ntfy_loading.py HERMES_PYTHON OUT
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from harness.core.registry import mint
from harness.drive import services
from harness.drive.hermes.agent import hermetic_env
from harness.drive.hermes.patched import patched_copy
from harness.drive.platforms.ntfy import configure
from harness.drive.surface import Where

FIXES = Path(__file__).resolve().parent
sys.path.insert(0, str(FIXES.parents[1] / "tests"))
from test_ntfy import LOAD  # noqa: E402  (the loader the tests use)


def load(python: Path, home: Path, launch: dict[str, str], alpha: dict[str, str], yaml: str) -> list[str] | None:
    """alpha's adapter (server, topic, token) as the multiplexed gateway builds it (None: no adapter)."""
    hermes = home / ".hermes"
    (hermes / "profiles" / "alpha").mkdir(parents=True)
    (hermes / "config.yaml").write_text("gateway:\n  multiplex_profiles: true\n")
    (hermes / ".env").write_text("".join(f"{k}={v}\n" for k, v in launch.items()))
    (hermes / "profiles" / "alpha" / ".env").write_text("".join(f"{k}={v}\n" for k, v in alpha.items()))
    (hermes / "profiles" / "alpha" / "config.yaml").write_text(yaml)
    done = subprocess.run([str(python), "-c", textwrap.dedent(LOAD)], capture_output=True, text=True, timeout=120,
                          env=hermetic_env(home, python, {}), cwd=home, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["adapter"]


def cases(out: Path) -> tuple[dict[str, tuple[dict[str, str], dict[str, str], str]], dict[str, str]]:
    """F55's, F56's and F57's (the launch profile's `.env`, alpha's `.env`, alpha's `config.yaml`), and whose each
    value is."""
    reg = mint(["default", "alpha"], out / "work", {"default": {"listen": 42000}, "alpha": {"listen": 42001}})
    services.mint(reg, ["ntfy"])
    for port, t in enumerate(reg, 42100):
        services.attach(reg, "ntfy", t.name, {"listen": port}, f"http://127.0.0.1:{port}")
    d, a = (configure(t, Where(f"http://127.0.0.1:{42100 + i}")).env for i, t in enumerate(reg))
    extra = f"platforms:\n  ntfy:\n    enabled: true\n    extra:\n      server: {a['NTFY_SERVER_URL']}\n"
    owner = {v: f"{name}'s" for name, env in (("default", d), ("alpha", a)) for v in env.values()}
    return {"F55": (d, a, ""),
            "F56": ({k: v for k, v in d.items() if k != "NTFY_TOKEN"}, {},
                    extra + f"      topic: {a['NTFY_TOPIC']}\n      token: {a['NTFY_TOKEN']}\n"),
            "F57": ({}, a, extra + f"      topic: {a['NTFY_TOPIC']}\n")}, owner


def alphas_adapter(python: Path, out: Path, case: str) -> str:
    """alpha's adapter in one case, each value named by its owner (`none`: no adapter)."""
    found, owner = cases(out)
    got = load(python, out / "home", *found[case])
    return ", ".join(owner.get(v, v) for v in got) if got else "none"


def main(base: Path, out: Path) -> None:
    pythons = {"0.19.0": base,
               "F55": patched_copy(base, [FIXES / "F55.patch"], out / "v55"),
               "F55+F57": patched_copy(base, [FIXES / "F55.patch", FIXES / "F57.patch"], out / "v57")}
    for label, python in pythons.items():
        for case in ("F55", "F56", "F57"):
            print(f"{label:8} {case}: {alphas_adapter(python, out / label.replace('+', '_') / case, case)}")

if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

"""tenancy-audit as a user who does not clone gets it: the project's wheel installed into a fresh venv, run from a
folder outside the checkout with a throw-away HOME (so its CA, evidence and Hermes cache go to the XDG folders
under it), against the Hermes of the other e2e tests.

Without a download (about 15 s in all): pip builds the wheel with the harness venv's setuptools (the [test]
extra; `--no-build-isolation --no-index`) from a copy of what the build reads (pyproject.toml, README.md,
harness/, docs/findings.md, which harness/core/findings.md links to, and locks/, which harness/drive/hermes/locks links
to); the venv is created without pip and
the harness venv's pip installs the wheel into it (`--python`, before anything else is in it). The wheel's
dependencies are not installed again: a `.pth` file names the harness venv's site-packages as a plain path (the
`.pth` files there, the checkout's editable install among them, are not processed), and mitmdump, which the
harness wants next to its python, is linked from the harness venv. What runs is the wheel's `harness`, in the
temporary venv (asserted), and the checkout's certs/ and evidence/ stay as they were.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

import harness
from harness.core.distributions import lock_digest
from harness.drive.hermes.install import PIN
from harness.report.sarif import remediation

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 300
VERSIONS = sorted(p.stem.removeprefix("hermes-") for p in (REPO / "locks").glob("hermes-*.txt"))


@dataclass
class Installed:
    venv: Path
    home: Path
    cwd: Path

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`tenancy-audit ARGS` from the working folder, with nothing of the checkout's environment."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "TENANCY_DOCS_URL")
               and not k.startswith(("XDG_", "TENANCY_HERMES_"))}
        env["HOME"] = str(self.home)
        return subprocess.run([str(self.venv / "bin" / "tenancy-audit"), *args], cwd=self.cwd, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT)

    @property
    def data(self) -> Path:
        return self.home / ".local" / "share" / "tenancy-audit"


def _build(tmp: Path) -> Path:
    """The wheel, built by pip from a copy of the sources it reads."""
    src = tmp / "src"
    shutil.copytree(REPO / "harness", src / "harness", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    (src / "docs").mkdir()
    for name in ("pyproject.toml", "README.md", "docs/findings.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "locks", src / "locks")
    env = {**os.environ, "HOME": str(tmp / "build-home")}
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "--no-index", "--no-cache-dir", "-w", str(tmp / "dist"), str(src)],
                          capture_output=True, text=True, env=env, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    (wheel,) = (tmp / "dist").glob("tenancy_audit-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    assert importlib.util.find_spec("setuptools"), "setuptools (the [test] extra) is missing: run ./tenancy test"
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = _build(tmp)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=TIMEOUT)
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                           "--no-deps", "--no-index", "--no-cache-dir", str(wheel)],
                          capture_output=True, text=True, env={**os.environ, "HOME": str(tmp)}, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    purelib = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    (purelib / "harness-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (venv / "bin" / "mitmdump").symlink_to(Path(sys.executable).parent / "mitmdump")
    (tmp / "home").mkdir()
    (tmp / "work").mkdir()
    return Installed(venv, tmp / "home", tmp / "work")


def test_the_installed_tool_names_itself_and_its_hermes(installed):
    done = installed.run("--version")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"tenancy-audit {harness.__version__}"
    # no checkout: the pinned Hermes a run would install into the cache under HOME, keyed by its lock
    key = lock_digest(REPO / "locks" / f"hermes-{PIN}.txt")[:12]
    assert f"{installed.home}/.cache/tenancy-audit/hermes/{PIN}-{key}/" in lines[2]
    # the addon script for `mitmdump -s` (there is no addons/tenancy.py), as mitmproxy's script loader loads it
    python = str(installed.venv / "bin" / "python")
    script = subprocess.run([python, "-m", "harness.capture.script"], capture_output=True, text=True,
                            cwd=installed.cwd, env={"HOME": str(installed.home)}, timeout=TIMEOUT).stdout.strip()
    loaded = subprocess.run([python, "-c", "import sys, harness.core.places as p; from mitmproxy.addons.script import "
                             "load_script; print([type(a).__name__ for a in load_script(sys.argv[1]).addons], "
                             "p.CHECKOUT, p.__file__)", script],
                            capture_output=True, text=True, cwd=installed.cwd, env={"HOME": str(installed.home)},
                            timeout=TIMEOUT)
    assert loaded.returncode == 0, loaded.stderr
    addons, checkout, module = loaded.stdout.split()
    assert (addons, checkout) == ("['Tenancy']", "None"), loaded.stderr
    assert Path(script).is_relative_to(installed.venv) and Path(module).is_relative_to(installed.venv)


def test_the_installed_tool_ships_every_committed_lock(installed):
    """What an installed tool installs Hermes from: the wheel's copies of locks/, each found as committed."""
    done = subprocess.run([str(installed.venv / "bin" / "python"), "-c", "import json, sys; "
                           "from harness.drive.hermes.install import find_lock; "
                           "print(json.dumps({v: [str(lk.path), lk.committed] for v in sys.argv[1:] "
                           "if (lk := find_lock(v))}))", *VERSIONS],
                          capture_output=True, text=True, cwd=installed.cwd, env={"HOME": str(installed.home)},
                          timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert sorted(found) == sorted(VERSIONS)
    for version, (path, committed) in found.items():
        assert committed and Path(path).is_relative_to(installed.venv) and not Path(path).is_symlink()
        assert Path(path).read_bytes() == (REPO / "locks" / f"hermes-{version}.txt").read_bytes()


def test_the_installed_tool_audits_and_reconciles(installed, hermes_python, tmp_path):
    before = {name: sorted(os.listdir(REPO / name)) if (REPO / name).is_dir() else None
              for name in ("certs", "evidence")}
    # a one-shot audit with a planted leak (so that the SARIF has rules), its evidence in the default folder
    done = installed.run("run", "--plant", "memory", "--tools", "none", "--services", "none", "--quiet",
                         "--hermes-python", str(hermes_python))
    assert done.returncode == 1, done.stdout + done.stderr
    (evidence,) = (installed.data / "evidence").iterdir()
    certs = installed.data / "certs"
    assert [stat.S_IMODE(p.stat().st_mode) for p in (certs, certs / "mitmproxy-ca.pem")] == [0o700, 0o600]
    assert {name: sorted(os.listdir(REPO / name)) if (REPO / name).is_dir() else None
            for name in ("certs", "evidence")} == before
    # the recorded evidence re-verified: the same verdict, and every SARIF rule's help is its docs/findings.md text
    done = installed.run("reconcile", str(evidence), "--out", str(tmp_path / "recheck"))
    assert done.returncode == 1, done.stdout + done.stderr
    sarif = json.loads((tmp_path / "recheck" / "findings.sarif").read_text())
    rules = sarif["runs"][0]["tool"]["driver"]["rules"]
    assert rules
    for rule in rules:
        kind = rule["id"].split("/")[0]
        assert rule["help"]["markdown"].startswith(remediation()[kind] + "\n\n"), rule["id"]
        assert rule["helpUri"].startswith(installed.venv.as_uri()), rule["helpUri"]

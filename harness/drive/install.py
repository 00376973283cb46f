"""Hermes releases installed on demand into cached venvs, one per version, reused across runs; `PIN`, the release
audited by default.

The cache is `$XDG_CACHE_HOME/tenancy-audit/hermes/<version>-<extras>/` (`~/.cache` without XDG_CACHE_HOME).
A release is installed with the extras the audit's services need (`EXTRAS`: Hermes' own pins for them, from
its metadata; a release without such an extra installs without it and the service is `n/a` there). It is
installed with the stdlib `venv` and pip, each in its own process group with a timeout, into a
hidden temporary folder that is renamed into place only when pip succeeded: a folder named after a version
is always a complete install. The venv's scripts name the final path in their `#!` line.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from harness.core.places import CHECKOUT, cache_dir
from harness.core.procs import ProcessSet
from harness.drive.hermes import HermesError

#: The hermes-agent release audited by default (./tenancy bootstraps it into the checkout's `.hermes-venv/`; an
#: installed tenancy-audit into the cache).
PIN = "0.19.0"
#: Seconds pip may take for one release (its dependencies included).
INSTALL_TIMEOUT = 1200.0
#: A hidden temporary folder older than this is the leftover of a killed install.
STALE_SECONDS = 2 * INSTALL_TIMEOUT


#: Hermes' extras the audit needs in the Hermes venv: `mcp` (its MCP client) and `homeassistant` (only aiohttp,
#: which the gateway's API server needs: Hermes would otherwise install it at run time, and every profile of the
#: audit forbids that, `security.allow_lazy_installs: false`). The memory provider (mem0 in self-hosted mode)
#: and the web backend (Tavily) need none.
EXTRAS = ("mcp", "homeassistant")


def requirement(version: str) -> str:
    """What pip installs for a release: `hermes-agent[EXTRAS]==version` (also the bootstrap's, `./tenancy`)."""
    return f"hermes-agent[{','.join(EXTRAS)}]=={version}"


class InstallError(HermesError):
    """pip could not install a release; one line naming the release and pip's reason."""


def cache_root() -> Path:
    return cache_dir() / "hermes"


def cached_python(version: str, root: Path | None = None) -> Path:
    return (root or cache_root()) / f"{version}-{'-'.join(EXTRAS)}" / "bin" / "python"


def default_python(say: Callable[[str], None] | None = None) -> Path:
    """The Hermes audited without --hermes-python or $TENANCY_HERMES_PYTHON: in a checkout its `.hermes-venv/`,
    else `PIN` in the cache, installed first when `say` is given (a run; `--version` only names it)."""
    if CHECKOUT is not None:
        return CHECKOUT / ".hermes-venv" / "bin" / "python"
    return install(PIN, say) if say else cached_python(PIN)


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


def install(version: str, say: Callable[[str], None], *, root: Path | None = None,
            timeout: float = INSTALL_TIMEOUT) -> Path:
    """The python of `hermes-agent==version` in the cache, installing it first if needed (one progress line).
    InstallError when venv or pip fail; nothing is left in the cache then."""
    root = root or cache_root()
    python = cached_python(version, root)
    if python.exists():
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
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
        steps = [[sys.executable, "-m", "venv", str(tmp)],
                 [str(tmp / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                  requirement(version)]]
        for argv in steps:
            left = timeout - (time.monotonic() - started)
            rc, out, err = procs.run(argv, env=env, cwd=tmp, timeout=max(left, 1.0))
            if rc is None:
                raise InstallError(f"installing hermes-agent=={version} took longer than {timeout:.0f}s")
            if rc != 0:
                raise InstallError(f"pip cannot install hermes-agent=={version}: {_last_error(err or out)}")
        final = python.parent.parent
        _relink_scripts(tmp, final)
        try:
            tmp.rename(final)
        except OSError:  # another run installed it meanwhile
            if not python.exists():
                raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        procs.close()
    shutil.rmtree(tmp, ignore_errors=True)  # only left when another run won the rename
    say(f"hermes-agent {version}: installed in {time.monotonic() - started:.0f}s at {final}")
    return python

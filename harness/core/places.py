"""Where tenancy-audit keeps its files: in the checkout it runs from, else in the user's XDG folders.

It runs from a checkout when the folder holding the `harness` package also holds `pyproject.toml` (./tenancy, the
editable install, `PYTHONPATH=<checkout>`): the CA is `certs/`, evidence goes to `evidence/` and the Hermes venv is
`.hermes-venv/`, all in the checkout. Installed (`pip install` of the project or of its wheel): the CA is
`$XDG_DATA_HOME/tenancy-audit/certs`, evidence goes to `$XDG_DATA_HOME/tenancy-audit/evidence`
(`~/.local/share` without XDG_DATA_HOME) and Hermes is installed into `$XDG_CACHE_HOME/tenancy-audit/hermes`
(`~/.cache`; see `drive.hermes.install`).
"""

from __future__ import annotations

import os
from pathlib import Path

#: The folder holding the `harness` package: a checkout, a worktree, or an environment's site-packages.
SOURCE = Path(__file__).resolve().parents[2]
#: The checkout tenancy-audit runs from, or None when it is installed.
CHECKOUT: Path | None = SOURCE if (SOURCE / "pyproject.toml").is_file() else None
APP = "tenancy-audit"


def xdg_home(variable: str, default: str) -> Path:
    """An XDG base folder: `$variable` when it is an absolute path (the spec ignores a relative one), else
    `~/default`."""
    value = os.environ.get(variable, "")
    return Path(value) if os.path.isabs(value) else Path.home() / default


def certs_dir() -> Path:
    """mitmproxy's configuration folder, where its CA lives."""
    return CHECKOUT / "certs" if CHECKOUT else xdg_home("XDG_DATA_HOME", ".local/share") / APP / "certs"


def evidence_root() -> Path:
    """Where evidence folders go unless `--out` names one."""
    return CHECKOUT / "evidence" if CHECKOUT else xdg_home("XDG_DATA_HOME", ".local/share") / APP / "evidence"


def cache_dir() -> Path:
    """tenancy-audit's cache (Hermes releases installed on demand)."""
    return xdg_home("XDG_CACHE_HOME", ".cache") / APP

"""Evidence written privately (files 0600, folders 0700), and the names of the evidence folder's files that more
than one module writes or reads."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

#: The tenants and their canaries, as the run minted them (`core.registry`).
REGISTRY = "registry.yaml"
#: Every flow mitmdump saw, as it saved them (mitmproxy's flow file).
FLOWS = "flows.mitm"
#: The run's record: phases, turns, what drivers saw live (what `judge.evaluate` reads).
RECORD = "timeline.json"
#: A copy of the baseline the run was judged against (`reconcile EVIDENCE` uses it by default).
BASELINE_COPY = "baseline.json"
#: The isolation policy the run was judged by (`reconcile EVIDENCE` uses it by default).
POLICY_COPY = "policy.yaml"
#: Where the harness names the current scenario/phase for the addon while the run goes on.
PHASE_FILE = "phase.json"
#: Every request every stub saw (what `reconcile` checks against the flows: nothing bypassed the proxy).
STUB_LOG = "stubs.jsonl"
#: The subfolder where servers that are not behind the proxy record themselves (stdio).
SERVICE_RECORDS = "services"
#: The folder's manifest: every other file's SHA-256 as an in-toto Statement, written last (`report.attestation`).
MANIFEST = "manifest.intoto.json"


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically with mode 0600: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def seal(out: Path) -> None:
    """Evidence is private: every file 0600, every folder 0700 (symlinks are left alone)."""
    for path in [out, *out.rglob("*")]:
        if path.is_symlink():
            continue
        path.chmod(0o700 if path.is_dir() else 0o600)

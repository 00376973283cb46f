"""Recorded evidence of every front door reconciles to the same findings, incidents and fingerprints, byte for
byte: a change to the harness that is not meant to change a verdict must leave these digests alone.

`tests/data/scenarios/<door>.tar.xz` are evidence folders of real audits (Hermes 0.19.0, the default battery and
services), without the reports, which reconcile writes again. `expected.json` holds, per door, the counts and a
SHA-256 of each part of the result as reconcile gave it when the folder was committed, and `<door>.manifest.intoto.json`
the folder's manifest as the tool writes it (every file's SHA-256, the verdict, incidents and fingerprints): the
folder with it verifies (`tenancy-audit verify`). Run `.venv/bin/python tests/test_recorded.py --write` only when the
detection is meant to change, and say why in the commit.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import pytest

from harness.core.files import MANIFEST
from harness.core.record import RunRecord
from harness.report.attestation import write_manifest
from harness.usecases import ReconcileOptions, reconcile_saved, verify

DATA = Path(__file__).resolve().parent / "data" / "scenarios"
EXPECTED = DATA / "expected.json"
DOORS = ("oneshot", "tui", "serve", "gateway")
#: The parts of a result compared (its timing and the evidence folder's own path are not).
PARTS = ("verdict", "reasons", "counts", "counts_by_kind", "inspected", "snapshots", "not_inspected", "incidents",
         "findings", "known", "allowed", "fixed", "coverage", "service_coverage")


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def extract(door: str, workdir: Path) -> Path:
    """The recorded folder of `door`, extracted into `workdir` (without its manifest)."""
    with tarfile.open(DATA / f"{door}.tar.xz") as archive:
        archive.extractall(workdir, filter="data")
    return workdir / door


def summary(door: str, workdir: Path) -> dict[str, Any]:
    """Reconcile the recorded folder of `door` in `workdir`: each part's size and digest."""
    doc = reconcile_saved(ReconcileOptions(evidence=extract(door, workdir)), lambda _: None).to_dict()
    return {part: {"size": len(doc[part]) if isinstance(doc[part], list | dict) else 1, "sha256": _digest(doc[part])}
            for part in PARTS}


@pytest.mark.parametrize("door", DOORS)
def test_recorded_evidence_reconciles_to_the_same_findings(door, tmp_path):
    expected = json.loads(EXPECTED.read_text())[door]
    got = summary(door, tmp_path)
    differ = {part: (expected[part], got[part]) for part in PARTS if expected[part] != got[part]}
    assert not differ, f"{door}: these parts changed (expected, got): {differ}"


@pytest.mark.parametrize("door", DOORS)
def test_recorded_evidence_verifies_against_its_committed_manifest(door, tmp_path):
    folder = extract(door, tmp_path)
    shutil.copyfile(DATA / f"{door}.{MANIFEST}", folder / MANIFEST)
    done = verify(folder, None)
    assert (done.problems, done.reconciled, done.signature) == ([], True, "unsigned")
    assert done.files == sum(1 for p in folder.rglob("*") if p.is_file()) - 1


def _write() -> None:
    doc = {}
    for door in DOORS:
        with tempfile.TemporaryDirectory() as tmp:
            doc[door] = summary(door, Path(tmp))
            folder = Path(tmp) / door
            result = reconcile_saved(ReconcileOptions(evidence=folder), lambda _: None)
            written = write_manifest(folder, result, RunRecord.read(folder).hermes_venv.get("lock"), None)
            shutil.copyfile(written, DATA / f"{door}.{MANIFEST}")
    EXPECTED.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    _write()

"""bench/repeat.py's reading of findings.json and its table, on synthetic evidence folders (no Hermes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.bench_modules import load_bench

repeat = load_bench("repeat")
TERMINAL = {"id": "b669160d1caca843", "entry": "tool terminal", "directions": [["default", "alpha"]],
            "documented": ["F2"], "new": False, "allowed": False}
FILES = {"id": "0a4be19d3c6f7712", "entry": "tool read_file", "directions": [["alpha", "default"]],
         "documented": [], "new": False, "allowed": True}
REQUEST = {"id": "25e26ebe7cc6b0ad", "entry": "request", "directions": [["default", "alpha"]], "documented": [],
           "new": True, "allowed": False}


def folder(tmp_path: Path, name: str, verdict: str, incidents: list[dict[str, Any]]) -> Path:
    """An evidence folder holding a findings.json with the fields repeat.py reads (and a few it does not)."""
    out = tmp_path / name
    out.mkdir()
    doc = {"verdict": verdict, "exit_code": {"clean": 0, "leak": 1}[verdict], "scenario": "oneshot",
           "incidents": [{**i, "kinds": ["wrong_cwd"], "severity": "medium", "classes": {}} for i in incidents]}
    (out / "findings.json").write_text(json.dumps(doc))
    return out


def test_runs_are_tallied_per_incident(tmp_path: Path) -> None:
    runs = [repeat.read_run(1, folder(tmp_path, "run-1", "clean", [TERMINAL, FILES]), 0, 61.0),
            repeat.read_run(2, folder(tmp_path, "run-2", "leak", [REQUEST, {**TERMINAL, "directions": [
                ["default", "alpha"], ["alpha", "default"]]}]), 1, 75.5),
            repeat.read_run(3, tmp_path / "run-3", 2, 3.0, "noise\ntenancy-audit: invalid baseline x.json\n")]
    assert [r.verdict for r in runs] == ["clean", "leak", "error"]
    assert runs[1].new == [REQUEST["id"]]
    assert runs[2].error == "tenancy-audit: invalid baseline x.json" and runs[2].incidents == []

    rows = {t.id: t for t in repeat.tally(runs)}
    assert list(rows) == [TERMINAL["id"], FILES["id"], REQUEST["id"]]  # the order first seen
    terminal, files, request = rows.values()
    assert (terminal.seen, terminal.new, terminal.label) == (2, 0, "F2")
    assert terminal.directions == ["default->alpha", "alpha->default"]
    assert (files.seen, files.label) == (1, "allowed")
    assert (request.seen, request.new, request.label) == (1, 1, "-")

    lines = repeat.table(runs, "baselines/oneshot.json")
    assert any(ln.startswith(TERMINAL["id"]) and " 2/3 " in ln and " 0/3 " in ln and "F2" in ln for ln in lines)
    assert any(ln.startswith(REQUEST["id"]) and " 1/3 " in ln and "request" in ln for ln in lines)
    assert any(ln.split()[:3] == ["2", "1", "leak"] and ln.endswith(REQUEST["id"]) for ln in lines)
    assert any(ln.split()[:3] == ["3", "2", "error"] and "[tenancy-audit: invalid baseline" in ln for ln in lines)
    assert lines[-1] == ("verdict against baselines/oneshot.json: differed: exit 0 (clean) in run 1; "
                         "exit 1 (leak) in run 2; exit 2 (error) in run 3")


def test_the_same_verdict_every_run(tmp_path: Path) -> None:
    runs = [repeat.read_run(i, folder(tmp_path, f"run-{i}", "leak", [REQUEST, TERMINAL]), 1, 80.0)
            for i in (1, 2, 3)]
    assert repeat.verdict_line(runs, "baselines/oneshot.json") == (
        "verdict against baselines/oneshot.json: the same in 3/3 runs (exit 1, leak)")
    doc = repeat.to_json(runs, {"baseline": "baselines/oneshot.json", "runs": 3}, 1)
    assert doc["same"] is True and doc["exit_code"] == 1
    assert [(i["id"], i["seen"], i["new"], i["runs"]) for i in doc["incidents"]] == [
        (REQUEST["id"], 3, 3, 3), (TERMINAL["id"], 3, 0, 3)]
    assert doc["runs"][0]["new"] == [REQUEST["id"]] and doc["runs"][0]["exit_code"] == 1
    json.dumps(doc)


def test_no_incident_in_any_run(tmp_path: Path) -> None:
    runs = [repeat.read_run(1, folder(tmp_path, "run-1", "clean", []), 0, 50.0)]
    lines = repeat.table(runs, "no baseline")
    assert "(no incident in any run)" in lines
    assert lines[-1] == "verdict against no baseline: the same in 1/1 runs (exit 0, clean)"

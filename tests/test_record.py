"""The run's record (`timeline.json`): typed, versioned, written and read back the same; an older folder's record
loads with the judge's defaults, and a committed version-1 evidence folder still reconciles to its verdict."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.core.findings import Finding
from harness.core.record import VERSION, EvidenceError, Phase, RunRecord
from harness.usecases import ReconcileOptions, reconcile_saved

V1 = Path(__file__).resolve().parent / "data" / "evidence-v1"

#: Every key a version-1 record could hold (what `run` wrote before the record had a version).
V1_KEYS = ["scenario", "hermes-agent", "phases", "turns", "findings", "reasons", "expect_snapshots", "log_owners",
           "plants", "homes", "tools", "services", "services_to_drive", "launch", "file_versions", "hermes_venv",
           "harness_venv"]


def full_record() -> RunRecord:
    leak = Finding("route_auth", "alpha", "beta", None, "request", "route", scenario="tui", phase="turns", time=5.0)
    turn = {"scenario": "tui", "phase": "turns", "tenant": "alpha", "driver": "tui", "ok": True, "seconds": 1.0,
            "detail": "", "flows": 2}
    return RunRecord(
        scenario="tui", hermes_agent="0.19.0", phases=[Phase("tui", "turns", 1.0, 2.0)], turns=[turn],
        findings=[leak], reasons=["mitmdump died"], expect_snapshots={"alpha": 1}, log_owners={"a.log": "alpha",
                                                                                             "b.log": None},
        plants={"memory": frozenset({"file_leak", "request_leak"})}, homes={"alpha": "sandbox/alpha"},
        tools=["terminal"], services={"mcp": "on", "web": "n/a: no tavily"}, services_to_drive=["mcp"],
        launch="default", file_versions={"mode": "inotify", "versions": 3}, hermes_venv={"installed": {"x": "1"}},
        harness_venv={"installed": {"y": "2"}}, doors={"tui": "on", "kanban": "out of scope: not yet"})


def test_a_record_round_trips_through_json_with_every_v1_key_and_its_version(tmp_path):
    record = full_record()
    record.write(tmp_path)
    data = json.loads((tmp_path / "timeline.json").read_text())
    assert list(data) == ["version", *V1_KEYS, "doors", "platforms", "unset"] and data["version"] == VERSION == 2
    assert data["plants"] == {"memory": ["file_leak", "request_leak"]}  # sorted, as before
    assert data["phases"] == [{"scenario": "tui", "name": "turns", "start": 1.0, "end": 2.0}]
    assert data["findings"][0]["fingerprint"] == record.findings[0].fingerprint()
    assert RunRecord.read(tmp_path) == record
    assert (tmp_path / "timeline.json").stat().st_mode & 0o777 == 0o600


def test_a_record_without_version_or_newer_keys_loads_with_the_judges_defaults():
    old = RunRecord.from_dict({"scenario": "tui", "phases": [], "turns": [], "findings": [], "reasons": []})
    assert old.version == 1
    assert old == RunRecord(scenario="tui", version=1)
    assert (old.hermes_agent, old.launch, old.expect_snapshots, old.homes, old.plants, old.tools) == (
        None, None, {}, {}, {}, [])
    assert (old.services, old.services_to_drive, old.hermes_venv, old.log_owners) == ({}, [], {}, {})
    assert RunRecord.from_dict({"homes": None, "plants": None}) == RunRecord(version=1)  # null: the default
    assert old.to_dict()["version"] == VERSION  # written again, it is a current record


def test_a_record_without_scenario_takes_it_from_findings_json(tmp_path):
    (tmp_path / "timeline.json").write_text(json.dumps({"phases": []}))
    (tmp_path / "findings.json").write_text(json.dumps({"scenario": "gateway"}))
    assert RunRecord.read(tmp_path).scenario == "gateway"
    (tmp_path / "findings.json").write_text("[1]")  # not an object: no scenario, no error
    assert RunRecord.read(tmp_path).scenario is None


@pytest.mark.parametrize(("data", "message"), [
    ("[]", "is not a JSON object"),
    ("{", "is not readable JSON (JSONDecodeError)"),
    ('{"homes": []}', "is malformed (homes: expected a JSON object)"),
    ('{"turns": {}}', "is malformed (turns: expected a JSON list)"),
    ('{"scenario": 3}', "is malformed (scenario: expected a JSON str)"),
    ('{"phases": [{"name": "x"}]}', "is malformed (TypeError: "),
    ('{"findings": [{"kind": "file_leak"}]}', "is malformed (TypeError: "),
    ('{"findings": ["x"]}', "is malformed (AttributeError: "),
    ('{"version": 3}', "has record version 3; this tenancy-audit reads 1 to 2"),
    ('{"version": "2"}', "has record version '2'"),
])
def test_a_malformed_record_is_one_line(tmp_path, data, message):
    (tmp_path / "timeline.json").write_text(data)
    with pytest.raises(EvidenceError) as err:
        RunRecord.read(tmp_path)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith(f"evidence: {tmp_path / 'timeline.json'} ")


def test_a_folder_without_a_record_is_one_line(tmp_path):
    with pytest.raises(EvidenceError, match=r"has no timeline\.json"):
        RunRecord.read(tmp_path)


def test_a_committed_v1_evidence_folder_still_reconciles(tmp_path):
    """A folder as `run` wrote it before the record had a version or the newer keys: default's memory reached
    alpha in tui/turns and beta in tui/resume, beta's resume turn failed, and a log serving every tenant (no
    `log_owners` then) holds alpha's key."""
    folder = shutil.copytree(V1, tmp_path / "evidence")
    assert "version" not in json.loads((folder / "timeline.json").read_text())
    result = reconcile_saved(ReconcileOptions(evidence=folder), lambda _: None)
    doc = result.to_dict()
    assert doc["verdict"] == "leak" and doc["scenario"] == "tui" and doc["reasons"] == []
    assert doc["counts_by_kind"] == {"request_leak": 3, "text_leak": 1, "shortfall": 1}
    assert [(f["kind"], f["victim"], f["seen_in"], f["phase"], f["fingerprint"]) for f in doc["findings"]] == [
        ("request_leak", "default", "alpha", "turns", "a406b5c073d81490"),
        ("request_leak", "default", "alpha", "turns", "a406b5c073d81490"),
        ("request_leak", "default", "beta", "resume", "18b4af3735be44bc"),
        ("text_leak", "alpha", None, "end", "b00f2d17685c26de"),
        ("shortfall", "beta", None, "resume", "a77e7c2eced7a503")]
    assert doc["findings"][-1]["time"] == 1001.5  # a failed turn is stamped with its phase's start
    assert [i["id"] for i in doc["incidents"]] == ["622e31a08c8663c7", "25e26ebe7cc6b0ad", "0c79832eef637ba7"]
    assert doc["versions"]["hermes-agent"] == "0.19.0" and doc["warnings"] == []

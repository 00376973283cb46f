"""What an evidence folder records of the Hermes venv it audited, and the one-line warnings a report, `reconcile`
and `baseline` give when that venv is not its lock's, or not the one that made the baseline."""

from __future__ import annotations

from pathlib import Path

from harness.core.record import VERSION, RunRecord
from harness.drive.hermes import install
from harness.judge import release_versions, venv_warnings
from harness.report.baseline import Baseline

PINNED = {"hermes-agent": "0.19.0", "openai": "2.21.0", "ripgrep": "14.1.0"}


def record(installed: dict[str, str], lock: dict | None, problem: str | None = None,
           services: dict[str, str] | None = None, doors: dict[str, str] | None = None) -> RunRecord:
    venv = {"installed": installed, "lock": lock, **({"problem": problem} if problem else {})}
    return RunRecord.from_dict({"version": VERSION, "hermes-agent": "0.19.0", "hermes_venv": venv,
                                "services": services or {}, "doors": doors or {}})


def lock(committed: bool = True, differs: str | None = None) -> dict:
    return {"file": "hermes-0.19.0.txt", "sha256": "2c31dc677ec2" + "0" * 52, "committed": committed,
            "differs": differs}


def test_a_venv_exactly_its_committed_lock_and_its_baselines_says_nothing():
    base = Baseline(Path("b.json"), made_with={"installed": dict(PINNED)})
    assert venv_warnings(record(dict(PINNED), lock()), base) == []
    lock_text = release_versions("0.19.0", record(PINNED, lock()).hermes_venv)["hermes-lock"]
    assert lock_text == "hermes-0.19.0.txt 2c31dc677ec2"


def test_each_way_a_venv_is_not_its_lock_is_one_line():
    differs = "the hermes-agent 0.19.0 venv differs from the lock: openai 2.24.0 (lock 2.21.0)"
    assert venv_warnings(record(PINNED, lock(differs=differs)), None) == [differs]
    made = venv_warnings(record(PINNED, lock(committed=False)), None)
    assert len(made) == 1 and "has no committed lock: one was made on its first install" in made[0]
    made_lock = release_versions("0.19.0", record(PINNED, lock(committed=False)).hermes_venv)["hermes-lock"]
    assert made_lock.endswith("(made)")
    assert venv_warnings(record(PINNED, None), None) == [
        "hermes-agent 0.19.0 was audited without a lock: its venv's versions are recorded, not pinned"]
    assert venv_warnings(record({}, None, problem="cannot run /x/python: No such file"), None) == [
        "cannot run /x/python: No such file"]


def test_a_venv_other_than_the_baselines_is_named_in_one_line():
    base = Baseline(Path("b.json"), made_with={"installed": {**PINNED, "openai": "2.24.0", "httpx": "0.28.1"}})
    [line] = venv_warnings(record(dict(PINNED), lock()), base)
    assert line == ("the Hermes venv differs from the one that made the baseline: httpx missing (baseline 0.28.1), "
                    "openai 2.21.0 (baseline 2.24.0)")


def test_a_distribution_only_an_undriven_services_sdk_brings_is_no_difference_from_the_baseline():
    """The baselines were made before the memory providers' SDKs joined the lock: a run that did not drive those
    services cannot have used them; one that drove a service whose SDK the baseline's venv lacked still warns."""
    base = Baseline(Path("b.json"), made_with={"installed": dict(PINNED)})
    with_sdk = {**PINNED, "honcho-ai": "2.2.0"}
    undriven = record(with_sdk, lock(), services={"honcho": "not driven: --services honcho"})
    assert venv_warnings(undriven, base) == []
    [line] = venv_warnings(record(with_sdk, lock(), services={"honcho": "on"}), base)
    assert line == "the Hermes venv differs from the one that made the baseline: honcho-ai 2.2.0 (not in the one " \
                   "that made the baseline)"


def test_a_distribution_only_an_undriven_door_uses_is_no_difference_from_the_baseline():
    """The baselines were made before the ACP package joined the lock: a run that did not drive the `acp` door
    cannot have used it (its baseline stays valid); one that drove it, against such a baseline, warns."""
    base = Baseline(Path("b.json"), made_with={"installed": dict(PINNED)})
    with_acp = {**PINNED, "agent-client-protocol": "0.9.0"}
    assert venv_warnings(record(with_acp, lock(), doors={"oneshot": "on", "acp": "not driven: --scenario acp"}),
                         base) == []
    [line] = venv_warnings(record(with_acp, lock(), doors={"acp": "on"}), base)
    assert line == "the Hermes venv differs from the one that made the baseline: agent-client-protocol 0.9.0 (not in " \
                   "the one that made the baseline)"


def test_a_folder_from_before_venvs_were_recorded_warns_of_nothing():
    assert venv_warnings(RunRecord.from_dict({"hermes-agent": "0.19.0"}), None) == []


def test_the_record_of_the_venv_that_runs_the_tests_names_its_committed_lock():
    """The Hermes venv ./tenancy built: every distribution it holds, the committed lock of its release, no
    difference (the same check as `test_the_hermes_venv_holds_exactly_its_releases_lock`, through the record)."""
    python = install.default_python()
    found = install.venv_record(python, install.PIN)
    assert found["installed"]["hermes-agent"] == install.PIN and found["installed"]["ripgrep"]
    assert found["lock"]["file"] == f"hermes-{install.PIN}.txt" and found["lock"]["committed"]
    assert found["lock"]["differs"] is None
    assert (python.parent / "rg").exists(), "the pinned ripgrep's rg is in the venv's bin/ (install.PROGRAMS)"


def test_a_distribution_two_services_bring_is_compared_while_either_is_driven(monkeypatch):
    """The SDKs of one Hermes extra serve several services (the messaging extra: Telegram, Slack, Discord): a
    distribution they share is left out only when none of them ran."""
    import dataclasses

    from harness import judge

    for name in ("web", "aux"):
        monkeypatch.setitem(judge.SERVICES, name, dataclasses.replace(judge.SERVICES[name], packages=("shared-sdk",)))
    base = Baseline(Path("b.json"), made_with={"installed": dict(PINNED)})
    with_sdk = {**PINNED, "shared-sdk": "1.0"}
    assert venv_warnings(record(with_sdk, lock(), services={"web": "not driven", "aux": "not driven"}), base) == []
    [line] = venv_warnings(record(with_sdk, lock(), services={"web": "not driven", "aux": "on"}), base)
    assert "shared-sdk 1.0" in line

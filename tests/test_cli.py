"""The CLI's promises without Hermes: the exit-code contract (1 is a leak and nothing else; every folder,
registry and evidence problem is one line and exit 2), --version, --fail-on, the GitHub step summary,
`reconcile EVIDENCE` with its baseline, and version-2 baselines (a v1 one is read with a warning)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mitmproxy import http, io
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import tflow

import harness
from harness import arguments, cli, judge
from harness.core import evidence as evidence_module
from harness.core.evidence import EvidenceFolder
from harness.core.files import RECORD
from harness.core.findings import Finding, Verdict
from harness.core.record import RunRecord
from harness.core.registry import Registry, mint
from harness.drive.phases import ALL_PHASES, DEFAULT_PHASES
from harness.options import UsageError
from harness.report import baseline, baseline_classes

CLI = [sys.executable, "-m", "harness.cli"]
ROOT = Path(__file__).resolve().parent.parent
PORTS = {"default": 18201, "alpha": 18202, "beta": 18203}


def cli_run(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TENANCY_HERMES_PYTHON": sys.executable}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=base | (env or {}))


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("tenancy-audit: "), done.stderr
    return done.stderr.strip()


# --- exit codes ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["file-parent", "proc"])
def test_an_output_folder_that_cannot_be_made_is_one_line_and_exit_2(tmp_path, where):
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" / "out" if where == "file-parent" else Path("/proc/tenancy-audit-x")
    line = one_line_error(cli_run(tmp_path, "run", "--out", str(out)))
    assert str(out) in line and "cannot create a writable folder" in line
    assert not out.exists()


def test_an_output_folder_that_cannot_be_listed_or_emptied_says_which(tmp_path, monkeypatch):
    out = tmp_path / "evidence"
    out.mkdir()
    (out / "registry.yaml").write_text("x")

    def refuse(*_: object, **__: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(evidence_module.shutil, "rmtree", refuse)
    with pytest.raises(UsageError, match=r"cannot empty it \(Permission denied\)"):
        EvidenceFolder.for_run(out, force=True)
    monkeypatch.setattr(Path, "iterdir", refuse)
    with pytest.raises(UsageError, match=r"cannot list it \(Permission denied\)"):
        EvidenceFolder.for_run(out, force=True)
    assert (out / "registry.yaml").exists()  # nothing was removed


def test_a_baseline_that_cannot_be_written_fails_before_any_run(tmp_path):
    line = one_line_error(cli_run(tmp_path, "baseline", "--runs", "5", "--out", "/proc/x/tui.json"))
    assert "cannot write --out /proc/x/tui.json" in line


def test_version_names_this_tool_mitmproxy_and_the_hermes_it_would_audit(tmp_path):
    done = cli_run(tmp_path, "--version", env={"TENANCY_HERMES_PYTHON": str(tmp_path / "nope" / "python")})
    assert done.returncode == 0, done
    lines = done.stdout.splitlines()
    assert lines[0] == f"tenancy-audit {harness.__version__}"
    assert lines[1].startswith("mitmproxy 12.")
    assert lines[2].startswith("hermes-agent not installed") and str(tmp_path / "nope" / "python") in lines[2]


def test_version_reports_an_installed_hermes(tmp_path):
    """A python that has hermes-agent's metadata (a fake distribution here) is reported with its version."""
    site = tmp_path / "site"
    dist = site / "hermes_agent-9.8.7.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hermes-agent\nVersion: 9.8.7\n")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    done = cli_run(tmp_path, "--version", env={"TENANCY_HERMES_PYTHON": str(python)})
    assert done.returncode == 0 and done.stdout.splitlines()[2] == f"hermes-agent 9.8.7 ({python})", done


def test_an_unexpected_exception_is_one_line_and_exit_2_never_1(monkeypatch, capsys):
    def boom(_):
        raise RuntimeError("a bug\nwith two lines")

    monkeypatch.setattr(cli, "cmd_cleanup", boom)
    assert cli.main(["cleanup"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: RuntimeError: a bug with two lines" in err


def test_an_unwritable_export_is_one_line_and_exit_2(tmp_path, evidence):
    line = one_line_error(cli_run(tmp_path, "export", str(evidence), "--har", "/proc/x/y.har"))
    assert "/proc/x" in line


@pytest.mark.parametrize("args", [["reconcile", "{tmp}/missing"], ["reconcile", "{tmp}"],
                                  ["reconcile", "{ev}", "--baseline", "{tmp}/nope.json"],
                                  ["reconcile", "{ev}", "--out", "{ev}"], ["reconcile", "--flows", "{ev}/flows.mitm"]])
def test_evidence_problems_are_one_line_and_exit_2(tmp_path, evidence, args):
    argv = [a.format(tmp=tmp_path, ev=evidence) for a in args]
    one_line_error(cli_run(tmp_path, *argv))


@pytest.mark.parametrize(("verdict", "fail_on", "code"), [
    ("leak", "inconclusive", 1), ("leak", "leak", 1), ("leak", "never", 0),
    ("inconclusive", "inconclusive", 3), ("inconclusive", "leak", 0), ("inconclusive", "never", 0),
    ("clean", "inconclusive", 0), ("clean", "leak", 0), ("clean", "never", 0)])
def test_fail_on(verdict, fail_on, code):
    leak = [Finding("file_leak", "a", "b", "memory", "file", "x")]
    v = {"leak": Verdict(leak), "inconclusive": Verdict([], reasons=["why"]), "clean": Verdict([])}[verdict]
    assert v.status == verdict
    assert cli._exit_code(v, fail_on) == code


# --- an evidence folder without Hermes: reconcile it as `run` would -------------------------------------------


def flow(reg: Registry, tenant: str, body: dict, label: tuple[str, str] | None) -> http.HTTPFlow:
    port = PORTS[tenant]
    f = tflow.tflow(req=http.Request.make("POST", f"http://127.0.0.1:{port + 1000}/v1/chat/completions",
                                          json.dumps(body).encode(),
                                          {"content-type": "application/json",
                                           "authorization": f"Bearer {reg[tenant].key}"}), resp=True)
    f.client_conn.proxy_mode = ProxyMode.parse(f"reverse:http://127.0.0.1:{port + 1000}@{port}")
    f.metadata["tenancy"] = {"tenant": tenant, "scenario": label[0], "phase": label[1]} if label else {}
    return f


@pytest.fixture
def evidence(tmp_path: Path) -> Path:
    """A folder as `run` leaves it: default's memory went to alpha in phase turns, to beta in phase resume."""
    out = tmp_path / "ev"
    (out / "logs").mkdir(parents=True)
    reg = mint(list(PORTS), out / "sandbox" / "work", {n: {"listen": p} for n, p in PORTS.items()})
    reg.save(out / "registry.yaml")
    memory = reg["default"].canaries["memory"]
    flows = [flow(reg, "alpha", {"messages": [{"content": memory}]}, ("tui", "turns")),
             flow(reg, "alpha", {"messages": [{"content": memory + " again"}]}, ("tui", "turns")),
             flow(reg, "beta", {"messages": [{"content": memory}]}, ("tui", "resume"))]
    with (out / "flows.mitm").open("wb") as fh:
        writer = io.FlowWriter(fh)
        for f in flows:
            writer.add(f)
    (out / "stubs.jsonl").write_text("")
    (out / RECORD).write_text(json.dumps({"scenario": "tui", "hermes-agent": "0.19.0", "phases": [],
                                          "turns": [], "findings": [], "reasons": [], "expect_snapshots": {},
                                          "log_owners": {}, "plants": {}, "homes": {}}))
    return out


def reconcile_json(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    done = cli_run(tmp_path, "reconcile", *args, "--json", env=env)
    assert done.returncode in (0, 1, 3), done
    return done.returncode, json.loads(done.stdout)


def test_reconcile_folder_json_has_counts_by_kind_versions_and_the_run_labels(tmp_path, evidence):
    code, doc = reconcile_json(tmp_path, str(evidence))
    assert code == 1 and doc["verdict"] == "leak" and doc["counts_by_kind"] == {"request_leak": 3}
    assert doc["versions"]["hermes-agent"] == "0.19.0" and doc["versions"]["tenancy-audit"] == harness.__version__
    assert doc["fingerprint_version"] == 3
    labels = {(f["seen_in"], f["scenario"], f["phase"]) for f in doc["findings"]}
    assert labels == {("alpha", "tui", "turns"), ("beta", "tui", "resume")}
    assert len({f["fingerprint"] for f in doc["findings"]}) == 2


def test_a_v2_baseline_of_one_direction_does_not_hide_a_new_one(tmp_path, evidence):
    _, doc = reconcile_json(tmp_path, str(evidence))
    alpha = [Finding.from_dict(f) for f in doc["findings"] if f["seen_in"] == "alpha"]
    baseline.write(tmp_path / "b2.json", [alpha])
    code, doc = reconcile_json(tmp_path, str(evidence), "--baseline", str(tmp_path / "b2.json"))
    assert code == 1 and [f["seen_in"] for f in doc["findings"]] == ["beta"] and len(doc["known"]) == 2
    assert doc["warnings"] == []


def test_a_v1_baseline_is_read_with_a_warning_and_upgraded(tmp_path, evidence):
    """A v1 entry (no victim, no carrier) hides the new beta direction too: that is why it warns."""
    _, doc = reconcile_json(tmp_path, str(evidence))
    alpha = Finding.from_dict(next(f for f in doc["findings"] if f["seen_in"] == "alpha"))
    v1 = {"version": 1, "tool": "tenancy-audit", "note": "old", "entries": [
        {"fingerprint": alpha.fingerprint_v1(), "kind": alpha.kind, "canary": alpha.canary, "channel": alpha.channel,
         "scenario": "tui", "phase": "turns", "intermittent": False, "example": alpha.summary()},
        {"fingerprint": "0" * 16, "kind": "request_leak", "canary": "memory", "channel": "request",
         "scenario": "tui", "phase": "resume", "intermittent": False, "example": "garbled"}]}
    (tmp_path / "b1.json").write_text(json.dumps(v1))
    code, doc = reconcile_json(tmp_path, str(evidence), "--baseline", str(tmp_path / "b1.json"))
    assert code == 1 and len(doc["known"]) == 2 and len(doc["findings"]) == 1  # resume: a different v1 class
    assert "version 1" in doc["warnings"][0] and "--upgrade" in doc["warnings"][0]
    done = cli_run(tmp_path, "baseline", "--upgrade", str(tmp_path / "b1.json"), "--out", str(tmp_path / "b2.json"))
    assert done.returncode == 0 and "1 entries" in done.stdout and "1 dropped" in done.stdout, done
    up = baseline.load(tmp_path / "b2.json")
    assert up.version == 3 and list(up.entries) == [alpha.fingerprint()]
    assert up.entries[alpha.fingerprint()]["victim"] == "default"
    assert up.entries[alpha.fingerprint()]["seen_in"] == "alpha"
    code, doc = reconcile_json(tmp_path, str(evidence), "--baseline", str(tmp_path / "b2.json"))
    assert code == 1 and [f["seen_in"] for f in doc["findings"]] == ["beta"]
    assert doc["warnings"] == [
        f"baseline {tmp_path / 'b2.json'} is version 3: it lists finding classes, not incidents, so a known root cause "
        "whose spread grows (one more file, canary kind or phase) is reported as new; regenerate it as incidents "
        "(tenancy-audit baseline --runs N)"]


def test_reconcile_uses_the_runs_baseline_copy_and_writes_the_step_summary(tmp_path, evidence):
    _, doc = reconcile_json(tmp_path, str(evidence))
    baseline.write(evidence / "baseline.json", [[Finding.from_dict(f) for f in doc["findings"]]])
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    out = tmp_path / "recheck"
    done = cli_run(tmp_path, "reconcile", str(evidence), "--out", str(out),
                   env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert done.returncode == 0, done
    assert "judged against the run's baseline" in done.stderr
    assert "verdict: clean (0 new incident(s); 0 new in 0 class(es), 3 known" in done.stdout
    text = summary.read_text()
    assert text.startswith("earlier step\n# tenancy-audit: **CLEAN**") and "3 known finding(s) in 2 class(es)" in text


def test_loose_files_take_scenario_and_phase_from_the_options(tmp_path, evidence):
    code, doc = reconcile_json(tmp_path, "--registry", str(evidence / "registry.yaml"), "--flows",
                               str(evidence / "flows.mitm"), "--scenario", "tui", "--phase", "turns")
    assert code == 1 and doc["scenario"] == "tui"
    # a flow's own label (stamped live by the addon) wins over the options
    assert {(f["seen_in"], f["phase"]) for f in doc["findings"]} == {("alpha", "turns"), ("beta", "resume")}


def test_terminal_prints_one_line_per_incident(tmp_path, evidence):
    """default's memory in alpha's prompt (then re-sent) and in beta's: one entry point, one incident, linked to F60
    by its copy in beta's request at resume (the launch profile's memory in another profile's resumed prompt)."""
    done = cli_run(tmp_path, "reconcile", str(evidence))
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    [incident] = [line for line in lines if line.startswith("high ")]
    assert incident.startswith("high     F60     default -> alpha (+1) request: request_leak at tui/turns, "
                               "1 canary kind(s), first at flow:") and "; spread: request 1 [" in incident
    assert "3 new finding(s) in 2 class(es) under 1 incident(s)" in done.stdout
    assert lines[-1].startswith("what each finding means and how to fix it: ") and lines[-1].endswith("findings.md")


def tool_turn(calls: list[tuple[str, str, str]]) -> dict:
    """A chat request whose conversation holds these tool calls (id, tool, result)."""
    messages: list[dict] = [{"role": "user", "content": "look it up"}]
    for call_id, tool, result in calls:
        messages += [{"role": "assistant", "content": None, "tool_calls": [
                         {"id": call_id, "type": "function", "function": {"name": tool, "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": call_id, "content": result}]
    return {"messages": messages}


@pytest.fixture
def two_tools(tmp_path: Path) -> Path:
    """Two root causes that share victim, canary and phase: default's memory reaches alpha in tui/lookups in
    session_search's result, then (that result re-sent) in process's result too."""
    out = tmp_path / "two"
    (out / "logs").mkdir(parents=True)
    reg = mint(list(PORTS), out / "sandbox" / "work", {n: {"listen": p} for n, p in PORTS.items()})
    reg.save(out / "registry.yaml")
    memory = reg["default"].canaries["memory"]
    search = ("c1", "session_search", f"transcript: {memory}")
    flows = [flow(reg, "alpha", tool_turn([search]), ("tui", "lookups")),
             flow(reg, "alpha", tool_turn([search, ("c2", "process", f"output: {memory}")]), ("tui", "lookups"))]
    with (out / "flows.mitm").open("wb") as fh:
        writer = io.FlowWriter(fh)
        for n, f in enumerate(flows):
            f.request.timestamp_start = 1000.0 + n
            writer.add(f)
    (out / "stubs.jsonl").write_text("")
    (out / RECORD).write_text(json.dumps({"scenario": "tui", "hermes-agent": "0.19.0", "phases": [], "turns": [],
                                          "findings": [], "reasons": [], "homes": {}}))
    return out


def test_two_tools_that_leak_the_same_data_in_the_same_phase_are_two_incidents(tmp_path, two_tools):
    code, doc = reconcile_json(tmp_path, str(two_tools))
    assert code == 1
    incidents = {i["entry"]: i for i in doc["incidents"]}
    assert set(incidents) == {"tool session_search", "tool process"}
    search, process = incidents["tool session_search"], incidents["tool process"]
    assert (search["crossings"], search["spread"]) == (1, {"request": 1})
    assert (process["crossings"], process["spread"]) == (1, {})
    assert search["documented"] == ["F8"] and process["documented"] == ["F9"] and search["new"] and process["new"]
    assert search["first"]["time"] == 1000.0 and process["first"]["time"] == 1001.0
    assert {f["incident"] for f in doc["findings"]} == {search["id"], process["id"]}
    # the v2 fingerprint cannot tell them apart, the v3 one can
    found = [Finding.from_dict(f) for f in doc["findings"]]
    assert len({f.fingerprint_v2() for f in found}) == 1 and len({f.fingerprint() for f in found}) == 2


def test_reconcile_of_a_folder_gives_the_same_incidents_every_time(two_tools):
    record = RunRecord.read(two_tools)
    first, again = (judge.evaluate(two_tools, record, None).to_dict() for _ in range(2))
    assert first["incidents"] == again["incidents"] and first["findings"] == again["findings"]
    assert len(first["incidents"]) == 2


def test_upgrading_a_v2_baseline_keeps_each_entrys_tool_and_service_and_drops_a_malformed_one(tmp_path):
    tooled = Finding("request_leak", "default", "alpha", "memory", "request", "x", scenario="tui", phase="turns",
                     tool="process")
    plain = Finding("wrong_key", "default", "alpha", "key", "request", "x", scenario="tui", phase="turns")
    # before entries kept them
    older = {k: v for k, v in baseline_classes.entry_of(plain).items() if k not in ("tool", "service")}
    entries = [{**baseline_classes.entry_of(tooled), "fingerprint": tooled.fingerprint_v2()},
               {**older, "fingerprint": plain.fingerprint_v2()}, {"fingerprint": "0" * 16, "kind": "bogus"}]
    (tmp_path / "b2.json").write_text(json.dumps({"version": 2, "entries": entries}))
    assert baseline_classes.upgrade(tmp_path / "b2.json", tmp_path / "b3.json") == baseline_classes.Upgrade(2, 1, 1)
    up = baseline.load(tmp_path / "b3.json")
    assert up.version == 3 and set(up.entries) == {tooled.fingerprint(), plain.fingerprint()}
    assert up.entries[tooled.fingerprint()]["tool"] == "process" and "upgraded from version 2 (inexact" in \
        json.loads((tmp_path / "b3.json").read_text())["note"]
    done = cli_run(tmp_path, "baseline", "--upgrade", str(tmp_path / "b2.json"), "--out", str(tmp_path / "b5.json"))
    assert done.returncode == 0 and "1 entries name no tool or service" in done.stderr, done
    with pytest.raises(baseline.BaselineError, match="already version 3"):
        baseline_classes.upgrade(tmp_path / "b3.json", tmp_path / "b4.json")


def test_a_baseline_of_one_tools_incident_reports_the_other_tools_as_new(tmp_path, two_tools):
    _, doc = reconcile_json(tmp_path, str(two_tools))
    searched = [Finding.from_dict(f) for f in doc["findings"] if f["tool"] == "session_search"]
    baseline.write(tmp_path / "b3.json", [searched])
    code, doc = reconcile_json(tmp_path, str(two_tools), "--baseline", str(tmp_path / "b3.json"))
    assert code == 1 and [f["tool"] for f in doc["findings"]] == ["process"] and len(doc["known"]) == 2
    assert {i["entry"]: i["new"] for i in doc["incidents"]} == {"tool session_search": False, "tool process": True}
    assert doc["warnings"] == []


def test_a_v2_baseline_hides_a_new_tool_with_a_warning_and_upgrades_exactly(tmp_path, two_tools):
    _, doc = reconcile_json(tmp_path, str(two_tools))
    searched = Finding.from_dict(next(f for f in doc["findings"] if f["tool"] == "session_search"))
    entry = {**baseline_classes.entry_of(searched), "fingerprint": searched.fingerprint_v2(), "intermittent": False,
             "seen": 3, "runs": 3}
    (tmp_path / "b2.json").write_text(json.dumps({"version": 2, "tool": "tenancy-audit", "note": "v2",
                                                  "entries": [entry]}))
    code, doc = reconcile_json(tmp_path, str(two_tools), "--baseline", str(tmp_path / "b2.json"))
    assert code == 0 and doc["findings"] == [] and len(doc["known"]) == 3  # process is absorbed: the v2 blind spot
    assert "version 2" in doc["warnings"][0] and "tool or service" in doc["warnings"][0]
    done = cli_run(tmp_path, "baseline", "--upgrade", str(tmp_path / "b2.json"), "--out", str(tmp_path / "b3.json"))
    assert done.returncode == 0 and "1 entries (version 3, from version 2)" in done.stdout and not done.stderr, done
    up = baseline.load(tmp_path / "b3.json")
    assert up.version == 3 and list(up.entries) == [searched.fingerprint()]
    assert (up.entries[searched.fingerprint()]["seen"], up.entries[searched.fingerprint()]["runs"]) == (3, 3)
    code, doc = reconcile_json(tmp_path, str(two_tools), "--baseline", str(tmp_path / "b3.json"))
    assert code == 1 and [f["tool"] for f in doc["findings"]] == ["process"] and "version 3" in doc["warnings"][0]


def test_phases_all_is_every_phase_cron_included_and_an_opt_in_phase_only_when_named():
    assert arguments.phases("all") == list(ALL_PHASES) and "cron" in arguments.phases("all")
    assert arguments.phases(None) == [] and arguments.phases("turns,cron") == ["turns", "cron"]
    assert "approvals" not in arguments.phases("all") and "approvals" not in DEFAULT_PHASES
    assert arguments.phases("all,approvals") == [*ALL_PHASES, "approvals"]
    assert arguments.phases("all,cron") == list(ALL_PHASES)  # named twice: once
    assert "cron" not in DEFAULT_PHASES

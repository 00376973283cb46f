"""The tool battery's parts without Hermes: the stubs' scripted plans, observe/strict keys, tool attribution
of findings, the coverage table, and the plants of the tools' stores."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from harness.capture.stubs.provider import StubProvider, ToolStep, answer_for, fit, probe_step
from harness.core.findings import Finding
from harness.core.protocol import PROBE_BEGIN, PROMPT, probe_code
from harness.core.registry import Registry, mint
from harness.detect import snapshots
from harness.detect.checks import RawRequest
from harness.detect.engine.matcher import Matcher
from harness.detect.flows import Route, inspect_request
from harness.detect.tools import Coverage, message_spans, tool_for_file
from harness.drive import plants
from harness.judge import check_plants

TOOLS = [
    {"type": "function", "function": {"name": "terminal", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}, "background": {"type": "boolean"}},
        "required": ["command"]}}},
    {"type": "function", "function": {"name": "memory", "parameters": {
        "type": "object", "properties": {"action": {}, "target": {}, "content": {}}, "required": ["target"]}}},
]


@pytest.fixture
def reg(tmp_path: Path) -> Registry:
    registry = mint(["alpha", "beta"], tmp_path / "work", {"alpha": {"listen": 18101}, "beta": {"listen": 18102}})
    for t in registry:
        registry.add_canary(t.name, "tool_memory", f"toolmem-{t.name}-qxcvyb{'a' * 11}{len(t.name)}")
    return registry


def _call(message: dict) -> tuple[str, dict]:
    fn = message["tool_calls"][0]["function"]
    return fn["name"], json.loads(fn["arguments"])


def test_fit_follows_the_advertised_schema():
    assert fit(ToolStep("terminal", {"command": "ls", "bogus": 1}), TOOLS) == {"command": "ls"}
    assert fit(ToolStep("memory", {"action": "add"}), TOOLS) is None  # required `target` missing
    assert fit(ToolStep("cronjob", {"action": "list"}), TOOLS) is None  # not offered


def test_the_stub_answers_each_step_then_text(reg):
    alpha = reg["alpha"]
    plan = [[probe_step(alpha)], [ToolStep("cronjob", {"action": "list"})],  # not offered: skipped
            [ToolStep("memory", {"action": "add", "target": "memory", "content": "x"}),
             ToolStep("terminal", {"command": "true"})]]
    convo = [{"role": "system", "content": "s"}, {"role": "user", "content": f"{PROMPT} and more"}]
    name, args = _call(answer_for(alpha, {"tools": TOOLS, "messages": convo}, plan))
    assert name == "terminal" and PROBE_BEGIN in args["command"]
    convo += [{"role": "assistant", "tool_calls": [{"id": "c1"}]}, {"role": "tool", "tool_call_id": "c1"}]
    message = answer_for(alpha, {"tools": TOOLS, "messages": convo}, plan)
    assert _call(message) == ("memory", {"action": "add", "target": "memory", "content": "x"})
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["memory", "terminal"]  # one round
    convo += [{"role": "assistant", "tool_calls": [{"id": "c2"}, {"id": "c3"}]},
              {"role": "tool", "tool_call_id": "c2"}, {"role": "tool", "tool_call_id": "c3"}]
    assert "tool_calls" not in answer_for(alpha, {"tools": TOOLS, "messages": convo}, plan)
    convo += [{"role": "assistant", "content": "done"}, {"role": "user", "content": PROMPT}]  # a new turn
    assert _call(answer_for(alpha, {"tools": TOOLS, "messages": convo}, plan))[0] == "terminal"
    assert answer_for(alpha, {"messages": convo}, plan, aux_text="Title T")["content"] == "Title T"


def test_a_conversation_hermes_started_never_runs_the_plan(reg):
    """A subagent's task gets the env probe; a background result re-entering, or a memory recall quoting the
    prompt, gets text: not the driver's conversation, so not the plan (it would run the tenant's writes twice)."""
    alpha = reg["alpha"]
    plan = [[ToolStep("memory", {"action": "add", "target": "memory", "content": "x"})]]
    name, args = _call(answer_for(alpha, {"tools": TOOLS, "messages": [
        {"role": "user", "content": "Subagent of alpha: run the environment probe"}]}, plan))
    assert name == "terminal" and PROBE_BEGIN in args["command"]
    for text in ("[ASYNC DELEGATION BATCH COMPLETE] done", f"recall <memory-context>{PROMPT}</memory-context>"):
        message = answer_for(alpha, {"tools": TOOLS, "messages": [{"role": "user", "content": text}]}, plan)
        assert "tool_calls" not in message, text


def test_the_drivers_prompt_behind_the_task_list_hermes_kept_over_a_compression_runs_the_plan(reg):
    """Once Hermes compressed a session it puts the open tasks in front of the next user message (the `generated`
    phase compresses before the opt-in phases' turns): the driver's prompt after them still runs the plan. Near
    misses: the task list alone, and the prompt inside a task of the list, are not the driver's turn."""
    alpha = reg["alpha"]
    plan = [[ToolStep("memory", {"action": "add", "target": "memory", "content": "x"})]]
    kept = "[Your active task list was preserved across context compression]\n- [ ] t-1. todo-alpha (pending)"
    message = answer_for(alpha, {"tools": TOOLS, "messages": [{"role": "user", "content": f"{kept}\n\n{PROMPT}"}]},
                         plan)
    assert _call(message)[0] == "memory"
    for text in (kept, f"{kept} {PROMPT}"):
        message = answer_for(alpha, {"tools": TOOLS, "messages": [{"role": "user", "content": text}]}, plan)
        assert "tool_calls" not in message, text


@pytest.mark.parametrize(("mode", "status"), [("observe", 200), ("strict", 401)])
def test_a_foreign_key_is_recorded_and_answered_only_in_observe_mode(reg, mode, status):
    stub = StubProvider(reg["alpha"], mode=mode).start()
    try:
        body = json.dumps({"model": reg["alpha"].model, "messages": [{"role": "user", "content": "hi"}]}).encode()
        req = urllib.request.Request(f"{stub.url}/v1/chat/completions", body, method="POST",
                                     headers={"authorization": f"Bearer {reg['beta'].key}",
                                              "content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                got = resp.status
        except urllib.error.HTTPError as exc:
            got = exc.code
            exc.close()
        assert got == status
        assert [(r.status, r.wrong_key) for r in stub.snapshot()] == [(status, True)]
    finally:
        stub.stop()


def _request(reg: Registry, messages: list[dict]) -> list[Finding]:
    body = json.dumps({"model": reg["beta"].model, "messages": messages, "tools": TOOLS}, indent=1).encode()
    report = inspect_request(reg, Matcher.for_registry(reg), Route("reverse", 18102),
                             RawRequest("f1", "POST", "/v1/chat/completions",
                                        [("authorization", f"Bearer {reg['beta'].key}")], body))
    return report.findings


def test_a_leak_in_a_tool_result_is_attributed_to_the_tool(reg):
    alpha = reg["alpha"].canaries["tool_memory"]
    messages = [{"role": "system", "content": f"prompt {reg['alpha'].canaries['soul']}"},
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c9", "type": "function", "function": {"name": "memory", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c9", "content": json.dumps({"current_entries": [alpha]})}]
    found = {(f.canary, f.tool) for f in _request(reg, messages)}
    assert ("tool_memory", "memory") in found
    assert ("soul", None) in found  # near miss: the system prompt is no tool's result


def test_an_own_canary_in_a_tool_result_is_no_finding(reg):
    own = reg["beta"].canaries["tool_memory"]
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "memory", "arguments": ""}}]},
                {"role": "tool", "tool_call_id": "c1", "content": own}]
    assert _request(reg, messages) == []


def test_message_spans_are_byte_spans():
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "é"}, {"role": "tool"}]},
                      ensure_ascii=False).encode()
    spans = message_spans(body)
    assert [json.loads(body[a:b]) for a, b in spans] == [{"role": "user", "content": "é"}, {"role": "tool"}]
    assert message_spans(b"not json") == () and message_spans(b'{"messages": 3}') == ()


def test_files_are_attributed_to_their_tool_store():
    assert tool_for_file("memories/MEMORY.md@4") == "memory"
    assert tool_for_file("skills/x/SKILL.md@0") == "skill_manage"
    assert tool_for_file("cron/jobs.json@9") == "cronjob"
    assert tool_for_file("state.db:sqlite:sessions.title#1@0") is None


def test_coverage_table():
    cov = Coverage()
    doc = {"tools": TOOLS, "messages": [
        {"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "terminal"}},
                                            {"id": "b", "function": {"name": "memory"}}]},
        {"role": "tool", "tool_call_id": "a", "content": '{"output": "x", "error": null}'},
        {"role": "tool", "tool_call_id": "b", "content": '{"success": false, "error": "no"}'}]}
    cov.add("tui", doc)
    cov.add("tui", doc)  # a re-sent conversation counts once
    leak = Finding("request_leak", "a", "b", "bg_process", "request", "x", scenario="tui", tool="process")
    table = cov.table(["terminal", "memory", "process", "cronjob"], [leak])
    assert table == {"tui": {"terminal": "driven", "memory": "failed", "process": "leak", "cronjob": "not offered"}}


def test_snapshots_come_only_from_terminal_results(reg):
    probe = f"{PROBE_BEGIN}\nCWD=/x\nSNAPSHOT-END"
    body = {"messages": [
        {"role": "assistant", "tool_calls": [{"id": "t", "function": {"name": "terminal"}},
                                            {"id": "s", "function": {"name": "session_search"}}]},
        {"role": "tool", "tool_call_id": "t", "content": probe},
        {"role": "tool", "tool_call_id": "s", "content": json.dumps({"messages": [probe]})}]}
    assert [s.tool_call_id for s in snapshots.extract(reg["alpha"], "f", body)] == ["t"]


def test_a_python_probe_is_a_snapshot_but_its_quoted_code_is_not(reg):
    """execute_code's output is a snapshot of its subprocess; a reply that quotes the probe's code (Hermes asking
    for approval) holds the markers inside lines, never alone on one: no snapshot, so no false wrong_cwd."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(probe_code(), {})
    asking = json.dumps({"status": "error", "error": f"Asking the user for approval. Code: {probe_code()}"})
    body = {"messages": [
        {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "execute_code"}},
                                            {"id": "q", "function": {"name": "execute_code"}}]},
        {"role": "tool", "tool_call_id": "c", "content": json.dumps({"status": "success", "output": out.getvalue()})},
        {"role": "tool", "tool_call_id": "q", "content": asking}]}
    (snap,) = snapshots.extract(reg["alpha"], "f", body)
    assert snap.tool_call_id == "c" and snap.tool == "execute_code" and snap.cwd == os.getcwd()
    assert snapshots.shows_home(snap) == ("HERMES_HOME" in os.environ)


@pytest.mark.parametrize("name", sorted(plants.TOOL_PLANTS))
def test_a_tool_plant_needs_a_finding_through_its_tool(name):
    kinds = plants.PLANTS[name].expects
    untagged = [Finding(k, "a", "b", "x", "request" if k == "request_leak" else "file", "l") for k in kinds]
    assert check_plants({name: kinds}, untagged)  # the file scan alone does not count
    tool = sorted(plants.TOOL_PLANTS[name])[0]
    tagged = [*untagged, Finding("request_leak", "a", "b", "x", "request", "l", tool=tool)]
    assert check_plants({name: kinds}, tagged) == []


def test_a_service_plant_that_defeats_the_proof_needs_no_finding_through_its_service():
    """Discord's token plant: the target's bot never signs in (a shortfall, which names no service); a plant that
    must show a crossing (the media plant) still needs one through its service."""
    missing = Finding("shortfall", "alpha", None, None, "env", "discord:messaging-connect:discord")
    assert check_plants({"discord-token": frozenset({"shortfall"})}, [missing]) == []
    leak = Finding("request_leak", "default", "alpha", "discord_file", "file", "tenancy-discord-media.txt@0")
    assert check_plants({"discord-media": frozenset({"request_leak"})}, [leak]) == [
        "plant discord-media was not caught through its service discord"]


def test_the_reports_show_the_coverage_table():
    from harness.core.findings import Verdict
    from harness.report import html
    from harness.report.markdown import markdown
    from harness.report.result import AuditResult, summary_table

    cov = {"oneshot": {"memory": "driven", "cronjob": "not offered"}, "tui": {"memory": "leak", "cronjob": "failed"}}
    leak = Finding("request_leak", "a", "b", "tool_memory", "request", "flow:x:request.body@1", tool="memory")
    result = AuditResult(Verdict([leak]), ["a", "b"], "all", {}, coverage=cov)
    assert result.to_dict()["coverage"] == cov and result.to_dict()["findings"][0]["tool"] == "memory"
    md = markdown(result)
    assert "## Tool coverage" in md and "(tool `memory`)" in md
    assert "| tool | oneshot | tui | why |" in md and "| `cronjob` | not offered | failed |  |" in md
    page = html.render(result)
    assert 'data-scenario="oneshot" data-tool="cronjob" data-status="not offered"' in page
    rows = {line.split()[0]: re.split(r"\s{2,}", line.strip()) for line in summary_table(result).splitlines()}
    assert rows["tools"] == ["tools", "oneshot", "tui"] and rows["cronjob"] == ["cronjob", "not offered", "failed"]


def test_a_plant_runs_the_battery_groups_of_its_tools_only():
    assert plants.battery_for("memory-entry") == ["memory"]
    assert plants.battery_for("skill") == ["skills"]
    assert plants.battery_for("cronjob") == ["cronjob"]
    assert plants.battery_for("memory-key") == ["mem0"]  # a service's plant: the group that drives the service
    assert plants.battery_for("aux-key") == ["vision"]
    assert plants.battery_for("delegate-model") == ["delegate"]  # the subagent's own requests show it
    assert plants.battery_for("code-env") == ["code"] and plants.battery_for("home-path") == ["terminal", "code"]
    for name in set(plants.PLANTS) - set(plants.TOOL_PLANTS) - set(plants.SERVICE_PLANTS) - set(plants.DRIVEN_BY):
        assert plants.battery_for(name) == [], name  # the detectors' plants: the env probe only

"""Incidents grouped by their carrier: another tenant's conversation sent whole to a tenant's provider (F18's shape)
is one incident, whatever tools it held, and not one per tool; a tenant's own tool calls stay incidents of their
tools (the near miss), baselines written per tool still know it, and fingerprints do not move."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from mitmproxy import http, io
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import tflow

from harness import judge
from harness.core.files import RECORD
from harness.core.findings import Finding
from harness.core.record import RunRecord
from harness.core.registry import Registry, mint
from harness.detect.carriers import CONVERSATION, Conversations
from harness.detect.incidents import build, explains, own_entry
from harness.report import baseline
from harness.report.documented import documented
from harness.report.result import AuditResult, IncidentRow

PORTS = {"default": 18301, "alpha": 18302, "beta": 18303}


def turn(calls: list[tuple[str, str, str]]) -> dict:
    """A chat request whose conversation holds these tool calls (id, tool, result), each in its own round."""
    messages: list[dict] = [{"role": "user", "content": "run the battery"}]
    for call_id, tool, result in calls:
        messages += [{"role": "assistant", "content": None, "tool_calls": [
                         {"id": call_id, "type": "function", "function": {"name": tool, "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": call_id, "content": result}]
    return {"messages": messages}


def parallel(calls: list[tuple[str, str, str]]) -> dict:
    """One round of parallel tool calls (a lookup round): one assistant message, then every result."""
    return {"messages": [
        {"role": "user", "content": "look it up"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": c, "type": "function", "function": {"name": tool, "arguments": "{}"}} for c, tool, _ in calls]},
        *({"role": "tool", "tool_call_id": c, "content": result} for c, _, result in calls)]}


def found_in(flow_id: str, body: dict, canary: str, tool: str, victim: str = "beta", seen_in: str = "default",
             t: float = 2.0) -> Finding:
    """The request_leak a scan reports for `canary` in `body` (its offset there), given its message's tool."""
    offset = json.dumps(body).encode().index(canary.encode())
    return Finding("request_leak", victim, seen_in, canary.split("-")[0], "request",
                   f"flow:{flow_id}:request.body@{offset}", scenario="api_server", phase="lookups", tool=tool, time=t)


# --- the carrier, from the requests alone -----------------------------------------------------------------------------


def test_a_conversation_of_another_tenant_is_one_incident_of_every_tool_it_held():
    """Default's request holds beta's conversation (beta's memory and todo calls, first sent by beta) and default's
    own session_search, which also returned beta's data: the carried tools are one incident, `conversation`;
    default's own call is another (two carriers, two incidents)."""
    beta_turn = turn([("c1", "memory", "saved memory-B"), ("c2", "todo", "todo-B")])
    carried = turn([("c1", "memory", "saved memory-B"), ("c2", "todo", "todo-B"),
                    ("c3", "session_search", "transcript soul-B")])
    chats = Conversations()
    chats.add(2.0, "f-default", "default", json.dumps(carried).encode(), carried)  # read out of order: by time
    chats.add(1.0, "f-beta", "beta", json.dumps(beta_turn).encode(), beta_turn)
    assert chats.owners() == {"c1": "beta", "c2": "beta", "c3": "default"}
    plain = [found_in("f-default", carried, "memory-B", "memory"), found_in("f-default", carried, "todo-B", "todo"),
             found_in("f-default", carried, "soul-B", "session_search")]
    marked = chats.carried(plain)
    assert [f.carrier for f in marked] == [CONVERSATION, CONVERSATION, None]
    assert [f.fingerprint() for f in marked] == [f.fingerprint() for f in plain]  # a class does not move
    conversation, search = build(marked)
    assert (conversation.entry, conversation.tools, conversation.carrier) == ("conversation", ["memory", "todo"],
                                                                              CONVERSATION)
    assert conversation.first == marked[0] and len(conversation.crossings) == 2
    assert (search.entry, search.carrier) == ("tool session_search", None)
    assert conversation.summary()["tools"] == ["memory", "todo"] and "tools" not in search.summary()
    assert documented(conversation) == ["F18"] and documented(search) == ["F8"]
    assert "conversation (2 tool(s)): request_leak at api_server/lookups" in IncidentRow(conversation, True,
                                                                                          ["F18"]).line()


def test_a_tenants_own_parallel_calls_stay_one_incident_per_tool():
    """Near miss: alpha's own lookup round returns beta's data through two tools in one request. The calls are
    alpha's (first held by alpha's request): no carrier, two root causes, two incidents."""
    body = parallel([("c7", "memory", "memory-B"), ("c8", "todo", "todo-B")])
    chats = Conversations()
    chats.add(1.0, "f-alpha", "alpha", json.dumps(body).encode(), body)
    plain = [found_in("f-alpha", body, "memory-B", "memory", seen_in="alpha"),
             found_in("f-alpha", body, "todo-B", "todo", seen_in="alpha")]
    assert chats.carried(plain) == plain
    assert [i.entry for i in build(plain)] == ["tool memory", "tool todo"]


def test_an_env_snapshot_of_a_carried_tool_result_is_carried_too():
    """A probe's output in beta's conversation, sent to default's provider, is beta's snapshot, not default's."""
    body = turn([("c1", "terminal", "SNAPSHOT-BEGIN")])
    chats = Conversations()
    chats.add(1.0, "f-beta", "beta", json.dumps(body).encode(), body)
    chats.add(2.0, "f-default", "default", json.dumps(body).encode(), body)
    env = Finding("env_leak", "alpha", "default", "shell_state", "env", "flow:f-default:tool:c1", tool="terminal",
                  time=2.0)
    own = replace(env, location="flow:f-beta:tool:c1", seen_in="beta")
    assert [f.carrier for f in chats.carried([env, own])] == [CONVERSATION, None]


def test_the_same_canary_through_two_carried_tools_keeps_each_tools_crossing():
    """Inside a carrier a copy still needs its own tool: an isolation policy allows a tool (the file tools), and
    what it allows must not explain another tool's crossing the conversation also held."""
    first = Finding("request_leak", "beta", "default", "home", "request", "flow:f:request.body@10", tool="patch",
                    time=1.0, carrier=CONVERSATION)
    other = replace(first, location="flow:f:request.body@90", tool="memory")
    again = replace(first, location="flow:g:request.body@10", time=2.0)
    assert not explains(first, other) and explains(first, again)
    [incident] = build([first, other, again])
    assert incident.crossings == [first, other] and incident.spread == [again]


# --- the whole reconciliation of a folder -----------------------------------------------------------------------------


def flow(reg: Registry, tenant: str, body: dict, start: float) -> http.HTTPFlow:
    port = PORTS[tenant]
    f = tflow.tflow(req=http.Request.make("POST", f"http://127.0.0.1:{port + 1000}/v1/chat/completions",
                                          json.dumps(body).encode(),
                                          {"content-type": "application/json",
                                           "authorization": f"Bearer {reg[tenant].key}"}), resp=True)
    f.client_conn.proxy_mode = ProxyMode.parse(f"reverse:http://127.0.0.1:{port + 1000}@{port}")
    f.metadata["tenancy"] = {"tenant": tenant, "scenario": "api_server", "phase": "lookups"}
    f.request.timestamp_start = start
    return f


@pytest.fixture
def continued(tmp_path: Path) -> Path:
    """An evidence folder where default continued beta's stored response: beta's conversation (its memory and todo
    calls, its own data) reached default's provider; alpha's own lookup returned beta's memory through session_search
    and process in one round."""
    out = tmp_path / "ev"
    (out / "logs").mkdir(parents=True)
    reg = mint(list(PORTS), out / "sandbox" / "work", {n: {"listen": p} for n, p in PORTS.items()})
    reg.save(out / "registry.yaml")
    beta = reg["beta"].canaries
    beta_turn = turn([("c1", "memory", f"saved {beta['memory']}"), ("c2", "todo", f"todo {beta['soul']}")])
    lookups = parallel([("c5", "session_search", f"transcript {beta['memory']}"),
                        ("c6", "process", f"output {beta['soul']}")])
    flows = [flow(reg, "beta", beta_turn, 1000.0), flow(reg, "default", beta_turn, 1001.0),
             flow(reg, "alpha", lookups, 1002.0)]
    with (out / "flows.mitm").open("wb") as fh:
        writer = io.FlowWriter(fh)
        for f in flows:
            writer.add(f)
    (out / "stubs.jsonl").write_text("")
    (out / RECORD).write_text(json.dumps({"scenario": "api_server", "hermes-agent": "0.19.0", "phases": [],
                                          "turns": [], "findings": [], "reasons": [], "homes": {}}))
    return out


def evaluate(folder: Path, base: baseline.AnyBaseline | None = None) -> AuditResult:
    return judge.evaluate(folder, RunRecord.read(folder), base)


def test_reconcile_groups_a_carried_conversation_and_keeps_own_calls_apart(continued):
    result = evaluate(continued)
    doc = result.to_dict()
    incidents = {i["entry"]: i for i in doc["incidents"]}
    assert set(incidents) == {"conversation", "tool session_search", "tool process"}
    assert incidents["conversation"]["tools"] == ["memory", "todo"]
    assert incidents["conversation"]["directions"] == [["beta", "default"]]
    assert incidents["conversation"]["documented"] == ["F18"]
    carried = [f for f in doc["findings"] if f["seen_in"] == "default"]
    assert carried and all(f["carrier"] == CONVERSATION for f in carried)
    assert all("carrier" not in f for f in doc["findings"] if f["seen_in"] == "alpha")


def test_a_baseline_written_per_tool_still_knows_a_carried_tool(continued, tmp_path):
    """A baseline made before carriers were told apart holds `tool memory | beta -> default`: the same findings,
    now through `conversation`, are known, and its incidents are not reported fixed."""
    found = evaluate(continued).verdict.findings
    per_tool = [replace(f, carrier=None) for f in found]
    assert {own_entry(f) for f in found} == {i.entry for i in build(per_tool)}
    baseline.write(tmp_path / "old.json", [per_tool])
    old = baseline.load(tmp_path / "old.json")
    assert not any(h.startswith("conversation") for h in old.hops)
    new, known, fixed = baseline.split(found, old)
    assert (new, len(known), fixed) == ([], len(found), [])
    # and one written now names the carrier, and knows the same findings
    baseline.write(tmp_path / "now.json", [found])
    assert baseline.split(found, baseline.load(tmp_path / "now.json")) == ([], found, [])


def test_a_carried_conversation_in_a_new_direction_is_new_against_a_per_tool_baseline(continued, tmp_path):
    found = evaluate(continued).verdict.findings
    baseline.write(tmp_path / "old.json", [[replace(f, carrier=None) for f in found]])
    moved = replace(next(f for f in found if f.carrier), seen_in="alpha")
    new, _, _ = baseline.split([*found, moved], baseline.load(tmp_path / "old.json"))
    assert new == [moved]

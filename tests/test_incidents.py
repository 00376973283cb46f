"""Incidents from findings: the first hop through each entry point, and the copies it explains (each rule with a
case it must join and a near miss it must not)."""

from __future__ import annotations

import random

from harness.core.findings import Finding
from harness.detect.incidents import build, entry_point, explains

FLOW = "flow:0b7e2c1a-1111-2222-3333-44445555666{}:request.body@{}"


def leak(canary: str = "key", *, tool: str | None = "session_search", t: float | None = 1.0, flow: int = 1,
         kind: str = "request_leak", channel: str = "request", victim: str = "default", seen_in: str = "alpha",
         scenario: str = "oneshot", phase: str = "lookups", service: str | None = None,
         location: str | None = None) -> Finding:
    where = location or FLOW.format(flow, len(canary))
    return Finding(kind, victim, seen_in, canary, channel, where, scenario=scenario, phase=phase, tool=tool,
                   service=service, time=t)


def state_db(canary: str, seen_in: str = "alpha", victim: str = "default", tool: str | None = None) -> Finding:
    return leak(canary, kind="file_leak", channel="file", location=f"state.db@{len(canary)}", t=None, tool=tool,
                victim=victim, seen_in=seen_in, scenario="oneshot", phase="end")


def test_entry_points():
    assert entry_point(leak()) == "tool session_search"
    assert entry_point(leak(service="mcp", tool="mcp__tenancy_stdio__remember")) == "service mcp"
    assert entry_point(leak(kind="wrong_key", tool=None)) == "provider"
    assert entry_point(leak(kind="wrong_key", tool=None, service="memory")) == "service memory"
    assert entry_point(leak(kind="route_auth", tool=None)) == "route"
    assert entry_point(state_db("key")) == "file state.db"
    assert entry_point(leak(kind="file_leak", channel="file", tool=None, location="logs/agent.log@3")) == \
        "file logs/agent.log"
    assert entry_point(leak(kind="text_leak", channel="rpc", tool=None, location="rpc-tui.jsonl#7@1")) == "rpc"
    assert entry_point(leak(kind="profile_bleed", channel="file", tool=None, location="config.yaml of default")) == \
        "file"


def test_a_database_and_its_wal_or_journal_are_one_entry_point():
    """Which file holds a page when the homes are read is SQLite's checkpoint timing, not another crossing: the
    same copy in `state.db-wal` in one run and in `state.db` in the next is the same hop (found by patch-check
    as a `new` hop of an unchanged root cause). Near misses keep their own names."""
    def copy_in(path: str) -> str:
        return entry_point(leak(kind="file_leak", channel="file", tool=None, location=f"{path}@9", t=None))
    for companion in ("state.db-wal", "state.db-shm", "state.db-journal", "state.db"):
        assert copy_in(companion) == "file state.db", companion
    assert copy_in("sessions/a.db-wal") == "file sessions/a.db"
    for other in ("state.db-walrus", "notes-wal.txt", "state.dbwal", "wal"):
        assert copy_in(other) == f"file {other}", other


def test_a_tool_result_re_sent_by_later_requests_is_one_incident_with_its_first_hop():
    """F8's shape: alpha's session_search returns default's transcript (two canaries) in one flow; every later
    request re-sends it and alpha's state.db stores it."""
    first = [leak("key", flow=1, t=1.0), leak("memory", flow=1, t=1.0)]
    later = [leak("key", flow=2, t=2.0), leak("memory", flow=3, t=3.0), state_db("key"), state_db("memory")]
    [incident] = build(later + first)
    assert incident.first == first[0] and incident.crossings == first
    assert incident.spread == [later[0], later[1], later[2], later[3]]
    assert incident.entry == "tool session_search" and incident.kinds == ["request_leak"]
    assert incident.directions == [("default", "alpha")] and incident.canaries == ["key", "memory"]
    assert incident.severity == "critical"


def test_the_same_data_through_another_tool_is_another_incident():
    """Near miss of the re-send: same victim, recipient, canary and phase, but the later request carries it in
    another tool's result: a second root cause, not a copy."""
    incidents = build([leak("memory", tool="session_search", t=1.0), leak("memory", tool="process", flow=2, t=2.0)])
    assert [i.entry for i in incidents] == ["tool session_search", "tool process"]
    assert len({i.id for i in incidents}) == 2


def test_an_env_leak_explains_the_tool_result_that_carries_it_to_the_provider():
    env = leak("key", kind="env_leak", channel="env", tool="terminal", t=5.0)
    sent = leak("key", tool="terminal", t=5.0)  # the same flow: the env probe's output in the request
    [incident] = build([sent, env])
    assert incident.crossings == [env] and incident.spread == [sent] and incident.entry == "tool terminal"


def test_a_copy_needs_the_same_victim_recipient_and_canary():
    first = leak("key", t=1.0)
    for near in (leak("memory", flow=2, t=2.0), leak("key", flow=2, t=2.0, seen_in="beta"),
                 leak("key", flow=2, t=2.0, victim="beta")):
        assert not explains(first, near)
        assert [len(i.crossings) for i in build([first, near])] == [2]  # one entry point, two crossings
    assert explains(first, leak("key", flow=2, t=2.0))


def test_a_request_copy_is_explained_only_by_its_scenario_and_not_by_a_later_crossing():
    first = leak("key", t=10.0, scenario="tui", phase="turns")
    assert explains(first, leak("key", flow=2, t=11.0, scenario="tui", phase="resume"))
    assert not explains(first, leak("key", flow=2, t=11.0, scenario="serve", phase="turns"))  # another backend
    assert not explains(first, leak("key", flow=2, t=9.0, scenario="tui", phase="turns"))  # before it


def test_a_service_keeps_what_it_was_given_across_scenarios():
    """alpha's note reached default's MCP server in tui; default's server answering it in serve is a copy."""
    note = leak("mcp_note", tool=None, service="mcp", victim="alpha", seen_in="default", scenario="tui", t=1.0)
    answer = leak("mcp_note", tool=None, service="mcp", victim="alpha", seen_in="default", scenario="serve", t=9.0,
                  kind="response_leak", channel="response", flow=2)
    other = leak("mcp_note", tool=None, service="web", victim="alpha", seen_in="default", scenario="serve", t=9.0,
                 kind="response_leak", channel="response", flow=3)
    assert explains(note, answer) and not explains(note, other)


def test_an_rpc_frame_may_relay_a_result_before_the_provider_sees_it():
    crossing = leak("key", t=10.0, scenario="tui", phase="lookups")
    frame = leak("key", kind="text_leak", channel="rpc", tool=None, t=9.9, scenario="tui", phase="lookups",
                 location="rpc-tui.jsonl#40@9")
    assert explains(crossing, frame)
    elsewhere = leak("key", kind="text_leak", channel="rpc", tool=None, t=9.9, scenario="serve", phase="lookups",
                     location="rpc-serve.jsonl#40@9")
    earlier_phase = leak("key", kind="text_leak", channel="rpc", tool=None, t=5.0, scenario="tui", phase="turns",
                         location="rpc-tui.jsonl#4@9")
    assert not explains(crossing, elsewhere) and not explains(crossing, earlier_phase)
    [incident] = build([crossing, frame])
    assert incident.spread == [frame]


def test_a_file_copy_is_explained_by_any_crossing_but_a_tools_store_only_by_that_tool():
    crossing = leak("memory", t=1.0)
    assert explains(crossing, state_db("memory"))
    store = leak("memory", kind="file_leak", channel="file", tool="memory", t=None, location="memories/MEMORY.md@4",
                 phase="end")
    assert not explains(crossing, store)
    incidents = build([crossing, state_db("memory"), store])
    assert [(i.entry, len(i.crossings), len(i.spread)) for i in incidents] == [
        ("tool session_search", 1, 1), ("tool memory", 1, 0)]


def test_a_copy_no_crossing_explains_is_its_own_incident_where_it_was_found():
    log = leak("model", kind="file_leak", channel="file", tool=None, t=None, location="logs/agent.log@186",
               victim="alpha", seen_in="default", phase="end")
    title = state_db("title", victim="alpha", seen_in="default")
    again = leak("title", kind="file_leak", channel="file", tool=None, t=None, location="state.db@900",
                 victim="alpha", seen_in="default", phase="end")
    incidents = build([log, title, again])
    assert [(i.entry, i.crossings, i.spread) for i in incidents] == [
        ("file logs/agent.log", [log], []), ("file state.db", [title], [again])]


def test_crossings_without_time_or_canary_are_incidents_too():
    bleed = leak("settings", kind="profile_bleed", channel="file", tool=None, t=None,
                 location="config.yaml of default", victim="alpha", seen_in="default", phase="settings")
    short = Finding("shortfall", "alpha", None, None, "env", "oneshot:turns", scenario="oneshot", phase="turns")
    incidents = build([short, bleed])
    assert [i.entry for i in incidents] == ["file", "shortfall"] and incidents[1].canaries == []


def test_incidents_do_not_depend_on_the_order_of_the_findings():
    found = [leak("key", flow=1, t=1.0), leak("key", flow=2, t=2.0), leak("memory", tool="process", t=1.5),
             leak("key", kind="env_leak", channel="env", tool="terminal", t=0.5), state_db("key"), state_db("memory"),
             leak("key", tool="terminal", t=0.5)]
    want = [(i.id, i.crossings, i.spread) for i in build(found)]
    for seed in range(5):
        shuffled = found[:]
        random.Random(seed).shuffle(shuffled)
        assert [(i.id, i.crossings, i.spread) for i in build(shuffled)] == want
    assert [i.entry for i in build(found)] == ["tool terminal", "tool session_search", "tool process"]


def test_an_incident_summary_lists_its_classes_under_it():
    first, again = leak("key", t=1.0), leak("key", flow=2, t=2.0)
    summary = build([first, again, state_db("key")])[0].summary()
    assert summary["first"]["location"] == first.location and summary["crossings"] == 1
    assert summary["spread"] == {"request": 1, "file": 1}
    assert summary["classes"] == {first.fingerprint(): {"crossings": 1, "spread": 1},
                                  state_db("key").fingerprint(): {"crossings": 0, "spread": 1}}

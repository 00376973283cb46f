"""The `kanban` phase's judgement without Hermes: a card that landed on another tenant's board is a finding from
the tenant whose switch pointed there (the plant); a card on its own board is not (the near miss); a card is found
on a board by its canary in the title, never by a canary one character short; the finding is a root cause of its
own (entry `kanban board`, F34); the cards in the launch profile's kanban databases are allowed by the `hermes`
policy, the bleed is not. A card worked by Hermes' dispatcher in a profile other than its assignee's is a finding,
as its assignee it is not."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from types import SimpleNamespace

from harness.capture.stubs.base import StubRequest
from harness.core.findings import Finding
from harness.detect.incidents import build, entry_point
from harness.detect.tools import tool_for_file
from harness.drive import doors
from harness.drive.phases.kanban import bleeds, board_of, boards
from harness.drive.phases.kanban_workers import Card, cards, misrouted, prompt, workers_seen
from harness.report import policy
from harness.report.documented import documented

OWN = {"default": "tenancy-default-x", "alpha": "tenancy-alpha-x", "beta": "tenancy-beta-x"}


def _board(db: Path, *titles: str) -> None:
    db.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE tasks (id TEXT, title TEXT)")
        conn.executemany("INSERT INTO tasks VALUES (?, ?)", [(f"t_{n}", t) for n, t in enumerate(titles)])
    conn.close()


def test_a_card_on_another_tenants_board_is_a_finding_and_on_its_own_board_is_not():
    landed = {"default": "tenancy-beta-x", "alpha": "tenancy-beta-x", "beta": "tenancy-beta-x"}
    found = bleeds(landed, OWN, "tui", "tui")
    assert sorted((f.kind, f.victim, f.seen_in, f.canary, f.tool) for f in found) == [
        ("profile_bleed", "beta", "alpha", "kanban_board", "kanban_create"),
        ("profile_bleed", "beta", "default", "kanban_board", "kanban_create")]
    assert {(f.scenario, f.phase) for f in found} == {("tui", "kanban")}
    # every card on its own board, or on no tenant's board (Hermes' default board): nothing
    assert bleeds({n: s for n, s in OWN.items()}, OWN, "serve", "serve") == []
    assert bleeds({"alpha": "default", "beta": None}, OWN, "serve", "serve") == []


def test_a_card_is_found_on_its_board_by_its_title_and_never_by_a_near_miss(tmp_path):
    card = "kanbancard-alpha-qxcvyb0123456789ab"
    _board(tmp_path / "kanban.db", "a card of nobody")
    _board(tmp_path / "kanban" / "boards" / "tenancy-beta-x" / "kanban.db", f"{card} card")
    _board(tmp_path / "kanban" / "boards" / "tenancy-alpha-x" / "kanban.db", f"{card[:-1]} card")
    assert set(boards(tmp_path)) == {"default", "tenancy-beta-x", "tenancy-alpha-x"}
    assert board_of(tmp_path, card) == "tenancy-beta-x"
    assert board_of(tmp_path, card[:-1] + "c") is None  # one character changed
    assert board_of(tmp_path / "nowhere", card) is None


def test_a_board_bleed_enters_through_its_own_entry_point_and_is_f34():
    found = bleeds({"alpha": "tenancy-beta-x"}, OWN, "serve", "serve")
    assert {entry_point(f) for f in found} == {"kanban board"}
    assert [(i.entry, documented(i)) for i in build(found)] == [("kanban board", ["F34"])]


def test_the_shared_board_is_allowed_by_the_hermes_policy_and_the_bleed_is_not():
    assert tool_for_file("kanban/boards/tenancy-beta-x/kanban.db@8082") == "kanban_create"
    assert tool_for_file("kanban.db-wal@12") == "kanban_create"
    card = Finding("file_leak", "beta", "default", "kanban_card", "file", "kanban/boards/tenancy-beta-x/kanban.db@8",
                   tool="kanban_create", scenario="tui", phase="end")
    into_profile = Finding("file_leak", "alpha", "beta", "kanban_card", "file", "kanban.db@8",
                           tool="kanban_create", scenario="tui", phase="end")
    bled = bleeds({"alpha": "tenancy-beta-x"}, OWN, "tui", "tui")
    kept, allowed = policy.load("hermes").apply([card, into_profile, *bled], "default")
    assert [f.scope for f in allowed] == ["allowed:hermes/kanban-board"]
    assert {f.kind for f in kept} == {"profile_bleed", "file_leak"}  # the bleed, and a card in a profile's home


def test_the_phase_is_a_way_in_of_tui_and_serve_only():
    assert doors.door_states("serve", ["turns", "kanban"])["kanban"] == "phase kanban"
    assert doors.door_states("tui")["kanban"] == "not driven: --phases kanban"  # the phase did not run
    assert doors.door_states("gateway", ["kanban"])["kanban"] == (  # not its phase
        "not driven: --phases kanban (with --scenario tui or --scenario serve or all)")


def test_a_card_worked_in_another_profile_is_a_finding_and_as_its_assignee_is_not():
    worked = [Card("tenancy-beta-x", "t_1", "alpha", 11), Card("tenancy-beta-x", "t_2", "default", 12),
              Card("tenancy-beta-x", "t_3", "beta", 13)]
    seen = {"t_1": {"alpha"}, "t_2": {"beta"}, "t_3": {"beta"}}  # t_2, assigned to default, ran as beta
    found = misrouted(worked, seen, "serve", "serve", "kanban")
    assert [(f.kind, f.victim, f.seen_in, f.canary) for f in found] == [
        ("profile_bleed", "default", "beta", "kanban_worker")]
    assert {entry_point(f) for f in found} == {"kanban worker"}
    assert misrouted(worked, {"t_1": {"alpha"}, "t_2": {"default"}, "t_3": {"beta"}}, "tui", "tui", "kanban") == []


def test_a_workers_prompt_is_told_from_its_card_id_in_a_tool_result():
    """The assigner's provider receives the new card's id in kanban_create's result: not a worker. A request before
    the step is not one either."""
    def request(at: float, *messages: dict[str, str]) -> StubRequest:
        return StubRequest(0, "POST", "/v1/chat/completions", {}, json.dumps({"messages": list(messages)}).encode(),
                           200, at)

    result = {"role": "tool", "tool_call_id": "c1", "content": json.dumps({"task_id": "t_1"})}
    worker = {"role": "user", "content": "work kanban task t_1"}
    stubs = {"alpha": SimpleNamespace(snapshot=lambda: [request(5.0, result)]),
             "beta": SimpleNamespace(snapshot=lambda: [request(5.0, worker)]),
             "default": SimpleNamespace(snapshot=lambda: [request(1.0, worker)])}
    assert prompt("t_1") == "work kanban task t_1"
    assert workers_seen(SimpleNamespace(stubs=stubs), ["t_1", "t_2"], 2.0) == {"t_1": {"beta"}, "t_2": set()}


def test_the_cards_of_the_phase_are_read_with_their_worker(tmp_path):
    db = tmp_path / "kanban.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE tasks (id TEXT, title TEXT, assignee TEXT, worker_pid INTEGER)")
        conn.executemany("INSERT INTO tasks VALUES (?, ?, ?, ?)", [
            ("t_1", "tenancy-card-x-alpha-to-beta", "beta", 7), ("t_2", "tenancy-card-x card", "alpha", None),
            ("t_3", "tenancy-card-y card", "alpha", 9)])
    conn.close()
    assert cards({"b": db}, "tenancy-card-x") == [Card("b", "t_1", "beta", 7), Card("b", "t_2", "alpha", None)]
    assert cards({"b": tmp_path / "missing.db"}, "tenancy-card-x") == []

"""The `kanban` phase against real Hermes 0.19.0: after every profile switched to a board of its own, every
profile's next card lands on the board the last one switched to (F34); each profile's card right after its own
switch lands on its own board (the near miss, never reported); Hermes' dispatcher works every card as its assignee;
every profile's cards in the launch profile's kanban databases are allowed by the `hermes` policy."""

from __future__ import annotations

import pytest

from harness.pytest_plugin import assert_reproduced
from tests.e2e.phase_checks import assert_one_incident, phase_steps

pytestmark = pytest.mark.e2e


def test_one_profiles_board_switch_moves_every_profiles_next_card(tenancy_audit):
    audit = tenancy_audit(scenario="tui", tenants=3, phases=["kanban"], tools=[], services=[])
    steps = phase_steps(audit, "kanban")
    assert all(t["ok"] for t in steps), [t for t in steps if not t["ok"]]
    assert [t["tenant"] for t in steps if t["driver"] == "tui-kanban-switch"] == ["default", "alpha", "beta"]
    # the dispatcher worked the cards on beta's board (its own, and the three addressed to a neighbour) each as
    # its assignee: a worker's prompt at another profile's provider would be a finding of canary kanban_worker
    workers = sorted(t["tenant"] for t in steps if t["driver"] == "tui-kanban-worker")
    assert workers == ["alpha", "beta", "beta", "default"], workers
    bled = [f for f in audit.doc["findings"] if f["phase"] == "kanban" and f["kind"] == "profile_bleed"]
    assert {(f["victim"], f["seen_in"], f["canary"]) for f in bled} == {
        ("beta", "alpha", "kanban_board"), ("beta", "default", "kanban_board")}, bled
    assert_one_incident(audit, "kanban board", "F34")
    # the cards in the shared root (the launch profile's home) are shared by design, and so is the path of a board
    # there that `/kanban boards create` answers with; none is reported
    shared = {"allowed:hermes/kanban-board", "allowed:hermes/kanban-board-path"}
    assert {f["scope"] for f in audit.doc["allowed"]} <= shared
    assert not [f for f in audit.doc["findings"] if f.get("store") == "kanban_create"]
    assert not [f for f in audit.doc["findings"] if f["canary"] and f["canary"].startswith("kanban_card")]
    assert audit.doc["door_coverage"]["kanban"] == "leak"  # a way in the phase drove, not out of scope
    assert audit.code == 1 and audit.verdict == "leak"
    assert_reproduced(audit)

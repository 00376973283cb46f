"""The `acp` door's cross-profile moves (`doors.acp._across`) judged on the adapter's replies, and the `acp-session`
plant's copy of one profile's ACP sessions into another's store: each with the near miss it must not report."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from harness.core.registry import mint
from harness.drive import plants
from harness.drive.doors.acp import _across

OWN, OTHER = "own-session", "other-session"
#: What Hermes 0.19.0 answers when alpha's process names default's session (tests/e2e/test_acp_door.py).
REFUSED = {"session/load": {}, "session/resume": {"_meta": {"hermes": {"sessionProvenance": {"acpSessionId": "new"}}}},
           "session/fork": {"sessionId": ""}, "session/list": {"sessions": [{"sessionId": OWN}]},
           "session/prompt": {"stopReason": "refusal"}}
#: What a process that found the other profile's session would answer.
FOUND = {"session/load": {"models": {}}, "session/resume": {}, "session/fork": {"sessionId": "forked"},
         "session/list": {"sessions": [{"sessionId": OWN}, {"sessionId": OTHER}]},
         "session/prompt": {"stopReason": "end_turn"}}


class _Client:
    """Stands in for `AcpClient`: answers each method from a table; its own session's load from `own_load`."""

    def __init__(self, replies: dict[str, dict[str, Any]], own_load: dict[str, Any], updated: set[str]) -> None:
        self.tenant, self.log_path, self.updated = "alpha", Path("acp-alpha.log"), updated
        self.replies, self.own_load = replies, own_load

    def call(self, method: str, params: dict[str, Any], timeout: float = 90.0) -> dict[str, Any]:
        if params.get("sessionId") == OWN:
            return {"result": self.own_load}
        return {"result": self.replies[method]}


def _ctx(tmp_path: Path) -> SimpleNamespace:
    registry = mint(["default", "alpha"], tmp_path / "work", {"default": {"listen": 1}, "alpha": {"listen": 2}})
    steps: list[tuple[Any, str]] = []
    return SimpleNamespace(registry=registry, findings=[], scenario="acp", current_phase="resume", steps=steps,
                           opts=SimpleNamespace(timeout=5.0), record=lambda r, phase, **_: steps.append((r, phase)))


def test_every_move_the_adapter_refuses_is_no_finding_and_its_own_load_is_the_near_miss(tmp_path):
    ctx = _ctx(tmp_path)
    _across(ctx, _Client(REFUSED, {"models": {}}, {OWN, "new"}), OWN, OTHER, "default")
    assert ctx.findings == []
    [(step, phase)] = ctx.steps
    assert phase == "resume" and step.ok and step.tenant == "alpha"


def test_every_move_that_reaches_the_other_profile_s_session_is_a_profile_bleed(tmp_path):
    ctx = _ctx(tmp_path)
    _across(ctx, _Client(FOUND, {"models": {}}, {OWN, OTHER}), OWN, OTHER, "default")
    where = {f.location for f in ctx.findings}
    assert where == {"acp:session/load", "acp:session/fork", "acp:session/list", "acp:session/prompt",
                     "acp:session/update"}
    assert {(f.kind, f.victim, f.seen_in, f.canary, f.channel) for f in ctx.findings} == {
        ("profile_bleed", "default", "alpha", "acp_session", "rpc")}


def test_a_refused_load_of_its_own_session_is_a_failed_step(tmp_path):
    ctx = _ctx(tmp_path)
    _across(ctx, _Client(REFUSED, {}, {OWN}), OWN, OTHER, "default")
    [(step, _)] = ctx.steps
    assert not step.ok and "its own session refused" in step.detail and ctx.findings == []


SCHEMA = ("CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, message_count INTEGER DEFAULT 0);"
          "CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, content TEXT);")


def _db(path: Path, sessions: list[tuple[str, str]], messages: list[tuple[str, str]]) -> Path:
    with sqlite3.connect(path) as conn:
        conn.executescript(SCHEMA)
        conn.executemany("INSERT INTO sessions (id, source) VALUES (?, ?)", sessions)
        conn.executemany("INSERT INTO messages (session_id, content) VALUES (?, ?)", messages)
    return path


def test_the_plant_copies_the_donor_s_acp_sessions_only_and_each_message_once(tmp_path):
    donor = _db(tmp_path / "donor.db", [("d-acp", "acp"), ("d-cli", "cli")], [("d-acp", "one"), ("d-cli", "cli")])
    target = _db(tmp_path / "target.db", [("t-acp", "acp")], [("t-acp", "mine")])
    copied: set[int] = set()
    assert plants._copy_acp_sessions(donor, target, copied)
    with sqlite3.connect(donor) as conn:
        conn.execute("INSERT INTO messages (session_id, content) VALUES ('d-acp', 'two')")
    assert plants._copy_acp_sessions(donor, target, copied)
    assert not plants._copy_acp_sessions(donor, target, copied)  # nothing new: the writer is quiet
    with sqlite3.connect(target) as conn:
        assert sorted(conn.execute("SELECT id, source FROM sessions")) == [("d-acp", "acp"), ("t-acp", "acp")]
        assert sorted(conn.execute("SELECT session_id, content FROM messages")) == [
            ("d-acp", "one"), ("d-acp", "two"), ("t-acp", "mine")]  # the donor's other session stays its own


def test_a_door_plant_runs_the_phases_it_needs():
    assert plants.SCENARIO["acp-session"] == "acp"
    assert plants.phases_for("acp-session") == ["turns", "resume"]
    assert plants.phases_for("cronjob") == ["turns"] and plants.phases_for("memory") == []

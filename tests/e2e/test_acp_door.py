"""The `acp` front door against real Hermes: `hermes [-p NAME] acp` for two profiles, each driven over the Agent
Client Protocol, then the second profile's process asked for the first's session (load, resume, fork, list,
prompt). Hermes 0.19.0 keeps each process to its own profile's store: the run is clean, the refusals are in the
frames, and the second profile loading its own session (the near miss) is never reported."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.e2e


def _frames(audit) -> list[dict]:
    return [json.loads(line) for line in (audit.out / "logs" / "rpc-acp.jsonl").read_text().splitlines()]


def _reply(frames: list[dict], method: str, session: str) -> dict:
    """The reply alpha's process gave to the first `method` naming `session`."""
    [rid] = [r["frame"]["id"] for r in frames if r["dir"] == "out" and r["tenant"] == "alpha"
             and r["frame"].get("method") == method and r["frame"]["params"].get("sessionId") == session][:1]
    return next(r["frame"] for r in frames if r["dir"] == "in" and r["tenant"] == "alpha"
                and "method" not in r["frame"] and r["frame"].get("id") == rid)


def test_each_profile_s_acp_process_keeps_to_its_own_sessions(tenancy_audit):
    audit = tenancy_audit(scenario="acp", tenants=2, tools=[], services=[])
    doc = audit.doc
    assert doc["reasons"] == [] and doc["findings"] == [], (doc["reasons"], doc["findings"][:3])
    assert audit.code == 0 and audit.verdict == "clean"
    assert [(t["phase"], t["tenant"], t["driver"], t["ok"]) for t in doc["timeline"]] == [
        ("turns", "default", "acp", True), ("turns", "alpha", "acp", True), ("resume", "alpha", "acp", True)]
    assert doc["inspected"]["rpc"] == 1 and doc["inspected"]["env"] >= 2
    assert doc["door_coverage"]["acp"] == "driven" and doc["door_coverage"]["oneshot"].startswith("not driven")
    frames = _frames(audit)
    sessions = {r["tenant"]: r["frame"]["result"]["sessionId"] for r in frames
                if r["dir"] == "in" and "sessionId" in (r["frame"].get("result") or {})
                and r["frame"]["id"] == 2}  # each process' `session/new`, after `initialize`
    assert set(sessions) == {"default", "alpha"}
    other, own = sessions["default"], sessions["alpha"]
    assert _reply(frames, "session/load", other)["result"] == {}  # not found in alpha's store
    resumed = _reply(frames, "session/resume", other)["result"]["_meta"]["hermes"]["sessionProvenance"]
    assert resumed["acpSessionId"] not in (other, own)  # a new session of alpha's
    assert _reply(frames, "session/fork", other)["result"] == {"sessionId": ""}
    assert _reply(frames, "session/prompt", other)["result"] == {"stopReason": "refusal"}
    listed = next(r["frame"]["result"]["sessions"] for r in frames if r["tenant"] == "alpha" and r["dir"] == "in"
                  and "sessions" in (r["frame"].get("result") or {}))
    assert {s["sessionId"] for s in listed} <= {own, resumed["acpSessionId"]}
    # the near miss: alpha's own session loads, and is not reported
    assert _reply(frames, "session/load", own)["result"]["_meta"]["hermes"]["sessionProvenance"]["acpSessionId"] == own

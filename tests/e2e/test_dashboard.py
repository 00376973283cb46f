"""The `dashboard` door against real Hermes: `hermes dashboard` on loopback, every data route of its route table
asked without its session token, with each tenant's keys, with a wrong token and from a foreign host. Hermes
0.19.0 answers any caller with a profile's model and home (F33); the plant (the first tenant's env marker served
as the second's provider by the public `/api/model/info`) must be caught; the session token's answers (every
tenant's data, shared by design) are the near miss: the positive control, never a finding."""

from __future__ import annotations

import json

import pytest

from harness.core.protocol import placeholder

pytestmark = pytest.mark.e2e


def test_the_dashboard_answers_without_its_token_and_the_plant_and_the_near_miss_hold(tenancy_audit):
    audit = tenancy_audit(scenario="dashboard", tenants=2, tools=[], services=[], plants=["dashboard"])
    doc = audit.doc
    assert audit.code == 1 and doc["reasons"] == [], doc["reasons"]  # a leak, the plant caught, the proof held
    assert [(t["tenant"], t["driver"], t["ok"]) for t in doc["timeline"]] == [
        ("default", "dashboard", True), ("alpha", "dashboard", True)], doc["timeline"]
    routed = [f for f in doc["findings"] if f["kind"] == "route_auth"]
    # the plant: default's env marker, served as alpha's provider to a caller with no credential
    assert any(f["victim"] == "default" and f["canary"] == "env_marker" and f["seen_in"] is None
               and f["location"] == "dashboard:GET /api/model/info?profile=alpha" for f in routed), routed
    # F33: each profile's model, and its home (loopback), to a caller with no credential
    got = {(f["victim"], f["seen_in"], f["canary"], f["location"].split("?")[0]) for f in routed}
    assert {(t, None, kind, f"dashboard:GET {route}") for t in ("default", "alpha")
            for kind, route in (("model", "/api/model/info"), ("home", "/api/status"))} <= got, got
    assert {f["seen_in"] for f in routed} == {None}  # the dashboard's caller, not a tenant's Hermes
    incidents = {i["entry"]: i["documented"] for i in doc["incidents"]}
    assert incidents.get("route dashboard") == ["F33"], incidents
    # the near miss: nothing read with the session token is a finding, though it read every tenant's data
    assert not any(f["evidence"].startswith("the session token ->") for f in routed)
    assert not any("foreign host" in f["evidence"] for f in routed)  # and the Host check refused the rest
    frames = [json.loads(line)["frame"] for line in (audit.out / "logs" / "rpc-dashboard.jsonl").open()]
    carried = {c for f in frames for c in f.get("carried", [])}
    assert {placeholder("default", "memory"), placeholder("alpha", "memory")} <= carried, sorted(carried)
    assert doc["door_coverage"]["dashboard"] == "leak" and "dashboard" not in doc["door_coverage"]["kanban"]

"""The `api_server` front door against real Hermes: every tenant's stored response and run through the gateway's
API server, then each tenant naming its ring neighbour's objects on its own route. Hermes 0.19.0 shares them
(F18): the audit must find it in every direction, link every incident to a documented finding, and show the
store in the launch profile's home."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e

#: Whose objects each tenant names in `lookups` (its ring neighbour): (victim, recipient).
LOOKUPS = {("beta", "default"), ("default", "alpha"), ("alpha", "beta")}


def test_api_server_objects_cross_profiles_and_every_incident_is_documented(tenancy_audit):
    audit = tenancy_audit(scenario="api_server", tenants=3, tools=["memory"], services=[])
    doc = audit.doc
    assert audit.code == 1 and doc["reasons"] == [], doc["reasons"]
    assert all(t["ok"] for t in doc["timeline"]), [t for t in doc["timeline"] if not t["ok"]]
    drivers = {t["driver"] for t in doc["timeline"]}
    assert {"api-server-responses", "api-server-runs", "api-server-lookup", "api-server-chat",
            "api-server-control"} <= drivers, drivers
    new = [i for i in doc["incidents"] if not i["documented"] and not i["allowed"]]
    assert new == [], [(i["entry"], i["kinds"], i["directions"]) for i in new]
    f18 = [i for i in doc["incidents"] if "F18" in i["documented"]]
    assert {tuple(d) for i in f18 for d in i["directions"]} >= LOOKUPS, [(i["entry"], i["directions"]) for i in f18]
    lookups = [f for f in doc["findings"] if f["phase"] == "lookups"]
    # read by id: another tenant's stored response in the asking tenant's reply
    assert {(f["victim"], f["seen_in"]) for f in lookups if f["channel"] == "rpc"} >= LOOKUPS
    # continued: another tenant's tool results (its memory entry) in the asking tenant's provider request
    assert {(f["victim"], f["seen_in"]) for f in lookups
            if f["kind"] == "request_leak" and f["tool"] == "memory"} >= LOOKUPS
    # run control: alpha's runs, waiting for their approval, answered and stopped on beta's route (the tenant that
    # looks up alpha's objects); alpha's own answer to its third run is the near miss
    control = [t for t in doc["timeline"] if t["driver"] == "api-server-control"]
    assert len(control) == 6 and {t["tenant"] for t in control} == {"alpha"}, control
    taken = {f["location"] for f in doc["findings"] if f["canary"] == "run_control"}
    assert taken == {"api-server:/v1/runs/{id}/approval", "api-server:/v1/runs/{id}/stop"}, taken
    assert {(f["victim"], f["seen_in"]) for f in doc["findings"] if f["canary"] == "run_control"} == {
        ("alpha", "beta")}
    assert [i["documented"] for i in doc["incidents"] if i["entry"] == "run"] == [["F18"]]
    rpc = (audit.out / "logs" / "rpc-api-server.jsonl").read_text()
    assert '"X-Hermes-Session-Id"' in rpc and "/events" in rpc  # a session continued by id, a run's event stream
    # every profile's conversations stored in the launch profile's home
    stored = {f["victim"] for f in doc["findings"] if f["location"].startswith("response_store.db")}
    assert {"alpha", "beta"} <= stored, stored
    # the door's own coverage row, and every way in it does not drive said so
    coverage = doc["door_coverage"]
    assert coverage["api_server"] == "leak" and coverage["oneshot"] == "not driven: --scenario oneshot or all"
    assert coverage["kanban"] == "not driven: --phases kanban (with --scenario tui or --scenario serve or all)", \
        coverage

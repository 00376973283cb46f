"""The services chosen by name only against real Hermes 0.19.0, in the tui backend (every profile in one process):
each finding they found holds on every CI run. Supermemory and the browser share a run (the browser holds no
profile slot); Honcho and Hindsight each take the memory provider slot and run alone. The one-shot CLI keeps
each profile's service to itself (`tests/test_services.py` runs Hermes' own clients against the stubs)."""

from __future__ import annotations

import json

import pytest

from harness.pytest_plugin import assert_reproduced

pytestmark = pytest.mark.e2e

RUNS = {  # services (each its battery group) -> the findings the run must link
    ("supermemory", "browser"): {"F20", "F23"},
    ("honcho",): {"F21"},
    ("hindsight",): {"F22"},
}


@pytest.mark.parametrize("services", list(RUNS), ids=["+".join(s) for s in RUNS])
def test_a_service_chosen_by_name_crosses_profiles_in_one_process(tenancy_audit, services):
    audit = tenancy_audit(scenario="tui", tenants=2, phases=["turns"], tools=list(services), services=list(services))
    documented = {n for i in audit.doc["incidents"] for n in i["documented"]}
    assert RUNS[services] <= documented, json.dumps(audit.doc["incidents"])[:800]
    coverage = audit.doc["service_coverage"]["tui"]
    assert {coverage[s] for s in services} == {"leak"}, coverage
    assert coverage["memory"].startswith("not driven: --services memory"), coverage  # the slot's default holder
    assert audit.code == 1 and audit.verdict == "leak" and audit.doc["reasons"] == []
    assert_reproduced(audit)

"""The `redaction` phase against real Hermes 0.19.0 (`hermes serve`): the launch profile's
`security.redact_secrets: false` governs every profile of the process, so a profile that says `true` hands its
model its own key-shaped secret whole (F26); the launch profile's own secret whole, under its own setting, is the
near miss and is not reported."""

from __future__ import annotations

import pytest

from harness.pytest_plugin import assert_reproduced
from tests.e2e.phase_checks import assert_one_incident, phase_steps, profile_configs

pytestmark = pytest.mark.e2e


def test_the_launch_profiles_redaction_setting_governs_every_profile(tenancy_audit):
    audit = tenancy_audit(scenario="serve", tenants=3, phases=["turns", "redaction"], tools=[], services=[])
    turns = phase_steps(audit, "redaction")
    assert sorted(t["tenant"] for t in turns) == ["alpha", "beta", "default"] and all(t["ok"] for t in turns)
    bled = [f for f in audit.doc["findings"] if f["canary"] == "redaction"]
    assert {(f["kind"], f["victim"], f["seen_in"]) for f in bled} == {
        ("profile_bleed", "default", "alpha"), ("profile_bleed", "default", "beta")}, bled
    assert_one_incident(audit, "redaction", "F26")
    configs = profile_configs(audit)
    assert "redact_secrets: true" in configs["alpha"]  # what alpha asked for
    assert audit.doc["door_coverage"]["log redaction"] == "leak"
    assert audit.code == 1 and audit.verdict == "leak"
    assert_reproduced(audit)

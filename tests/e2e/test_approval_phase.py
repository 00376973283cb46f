"""The `approvals` phase against real Hermes 0.19.0: one tenant's "always" approval of a recursive delete lets
every other profile's recursive delete run unasked in the same process (F19), and the tenant's own next one runs
unasked on its own approval without being reported; the same tenant's `command_allowlist` does the same for the
command it names."""

from __future__ import annotations

import pytest

from harness.pytest_plugin import assert_reproduced
from tests.e2e.phase_checks import assert_one_incident, phase_steps, profile_configs

pytestmark = pytest.mark.e2e


def test_an_always_approval_of_one_profile_approves_the_others_commands(tenancy_audit):
    audit = tenancy_audit(scenario="tui", tenants=3, phases=["turns", "approvals"], tools=[], services=[])
    turns = phase_steps(audit, "approvals")
    # alpha (asked, answers "always"), beta and default (each must be asked), alpha again (its own approval); then
    # beta and default (each must be asked), alpha (its own allowlist: not asked, or the turn fails)
    assert [t["tenant"] for t in turns] == ["alpha", "beta", "default", "alpha", "beta", "default", "alpha"]
    assert all(t["ok"] for t in turns), turns
    for canary in ("approval", "command_allowlist"):
        bled = [f for f in audit.doc["findings"] if f["phase"] == "approvals" and f["canary"] == canary]
        assert {(f["kind"], f["victim"], f["seen_in"]) for f in bled} == {
            ("profile_bleed", "alpha", "beta"), ("profile_bleed", "alpha", "default")}, bled
    assert_one_incident(audit, "approval", "F19")
    # Hermes asked alpha (the phase proved something) and kept alpha's "always" in alpha's own config
    allowlists = profile_configs(audit)
    assert "command_allowlist" in allowlists["alpha"] and "command_allowlist" not in allowlists["beta"]
    assert "allowlisted-" in allowlists["alpha"]  # its seeded allowlist, kept
    assert "mode: 'off'" in allowlists["beta"] or "mode: off" in allowlists["beta"]  # the phase set it back
    assert audit.doc["door_coverage"]["tool approvals"] == "leak"  # a way in the phase drove, not out of scope
    assert audit.code == 1 and audit.verdict == "leak"
    assert_reproduced(audit)

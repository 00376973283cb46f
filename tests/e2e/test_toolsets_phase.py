"""The `toolsets` phase against real Hermes 0.19.0 (tui): the launch profile's `toolsets` setting decides which
tools every profile's model is offered (F35); the launch profile's own tools are its own setting at work."""

from __future__ import annotations

import pytest

from harness.pytest_plugin import assert_reproduced
from tests.e2e.phase_checks import assert_one_incident, phase_steps, profile_configs

pytestmark = pytest.mark.e2e


def test_the_launch_profiles_toolsets_decide_every_profiles_tools(tenancy_audit):
    audit = tenancy_audit(scenario="tui", tenants=3, phases=["turns", "toolsets"], tools=[], services=[])
    turns = phase_steps(audit, "toolsets")
    # one turn per profile, each reaching its provider; the launch profile offered its own toolset (no failed step)
    assert [t["tenant"] for t in turns] == ["default", "alpha", "beta"] and all(t["ok"] for t in turns), turns
    bled = [f for f in audit.doc["findings"] if f["canary"] == "toolsets"]
    assert {(f["kind"], f["victim"], f["seen_in"]) for f in bled} == {
        ("profile_bleed", "default", "alpha"), ("profile_bleed", "default", "beta")}, bled
    assert_one_incident(audit, "toolsets", "F35")
    configs = profile_configs(audit)
    assert "kanban" not in configs["alpha"] and "kanban" not in configs["beta"]  # neither enables it
    assert audit.code == 1 and audit.verdict == "leak"
    assert_reproduced(audit)

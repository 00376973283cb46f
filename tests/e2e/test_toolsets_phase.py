"""The `toolsets` phase against real Hermes 0.19.0 (tui): the launch profile's `toolsets` setting decides which
tools every profile's model is offered (F35); the launch profile's own tools are its own setting at work."""

from __future__ import annotations

import json

import pytest

from harness.pytest_plugin import assert_reproduced

pytestmark = pytest.mark.e2e


def test_the_launch_profiles_toolsets_decide_every_profiles_tools(tenancy_audit):
    audit = tenancy_audit(scenario="tui", tenants=3, phases=["turns", "toolsets"], tools=[], services=[])
    turns = [t for t in audit.doc["timeline"] if t["phase"] == "toolsets"]
    # one turn per profile, each reaching its provider; the launch profile offered its own toolset (no failed step)
    assert [t["tenant"] for t in turns] == ["default", "alpha", "beta"] and all(t["ok"] for t in turns), turns
    bled = [f for f in audit.doc["findings"] if f["canary"] == "toolsets"]
    assert {(f["kind"], f["victim"], f["seen_in"]) for f in bled} == {
        ("profile_bleed", "default", "alpha"), ("profile_bleed", "default", "beta")}, bled
    f35 = [i for i in audit.doc["incidents"] if i["entry"] == "toolsets"]
    assert len(f35) == 1 and f35[0]["documented"] == ["F35"], json.dumps(audit.doc["incidents"])[:500]
    home = audit.out / "sandbox"
    configs = {p.parent.name: p.read_text() for p in home.glob("*/.hermes/profiles/*/config.yaml")}
    assert "kanban" not in configs["alpha"] and "kanban" not in configs["beta"]  # neither enables it
    assert audit.code == 1 and audit.verdict == "leak"
    assert_reproduced(audit)

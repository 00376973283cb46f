"""The gateway door's `messaging` phase against real Hermes 0.19.0, a Mattermost bot per profile: every bot signs
in with its own token; the secondary bots answer in a channel only the launch profile allows (F24); after the
first secondary turn the launch profile's bot authorizes by that profile's allowlist (F25). Strangers and the
other profiles' leads get no turn through a secondary bot (the refusals that hold)."""

from __future__ import annotations

import pytest

from harness.pytest_plugin import assert_reproduced

pytestmark = pytest.mark.e2e


def test_every_profile_has_its_bot_but_the_process_environment_decides_who_it_answers(tenancy_audit):
    audit = tenancy_audit(scenario="gateway", tenants=3, phases=["route-auth", "turns"], tools=[],
                          services=["mattermost"])
    found = [f for f in audit.doc["findings"] if f.get("service") == "mattermost"]
    assert not [f for f in found if f["kind"] in ("wrong_key", "route_auth")], found  # own tokens; no stranger
    bled = {(f["victim"], f["seen_in"], f["canary"]) for f in found if f["kind"] == "profile_bleed"}
    assert {("alpha", "default", "allowed_channels"), ("beta", "default", "allowed_channels")} <= bled, bled
    first = {s for v, s, c in bled if v == "default" and c == "allowed_users"}  # the profile that took over
    assert len(first) == 1 and first <= {"alpha", "beta"}, bled
    documented = {d for i in audit.doc["incidents"] for d in i["documented"]}
    assert {"F24", "F25"} <= documented
    assert audit.code == 1 and audit.verdict == "leak"
    assert_reproduced(audit)

"""Tenants that differ against real Hermes 0.19.0: alpha leaves its Mattermost allowlist unset while the launch
profile and beta set theirs. Alpha's bot then admits the lead of whichever profile's allowlist the process
environment holds (the launch profile's before any turn) while strangers stay refused (F58); its own users are not
owed a turn, as its allowlist names none. The near misses: no stranger gets a turn through alpha's bot, and beta,
which sets its allowlist, is answered as ever."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e


def test_a_profile_without_its_own_allowlist_admits_another_profiles_users(tenancy_audit):
    audit = tenancy_audit(scenario="gateway", tenants=3, phases=["route-auth", "turns"], tools=[],
                          services=["mattermost"], unset=["mattermost.allowed_users"])
    assert audit.doc["unset"] == {"alpha": ["mattermost.allowed_users"]}
    found = [f for f in audit.doc["findings"] if f.get("service") == "mattermost"]
    fallback = {(f["victim"], f["seen_in"]) for f in found if f["canary"] == "allowed_users_fallback"}
    assert ("alpha", "default") in fallback, found  # the launch profile's allowlist, before any turn
    assert not [f for f in found if f["kind"] == "route_auth"], found  # strangers refused: not an open bot
    steps = [t for t in audit.doc["timeline"] if t["phase"] == "messaging" and t["driver"] == "mattermost"]
    assert all(t["ok"] for t in steps if t["tenant"] == "alpha"), steps  # its own users are not owed a turn
    assert any("not answered, as it leaves mattermost.allowed_users unset" in t["detail"] for t in steps)
    assert [t for t in steps if t["tenant"] == "beta" and t["ok"] and "request(s)" not in t["detail"]], steps
    documented = {d for i in audit.doc["incidents"] for d in i["documented"]}
    assert "F58" in documented
    assert audit.code == 1 and audit.verdict == "leak"

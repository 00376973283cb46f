"""The gateway door's `messaging` phase against real Hermes 0.19.0, a Mattermost bot per profile, in one audit:
every bot signs in with its own token; the secondary bots answer in a channel only the launch profile allows
(F24); after the first secondary turn the launch profile's bot authorizes by that profile's allowlist (F25).
Strangers and the other profiles' leads get no turn through a secondary bot (the refusals that hold). Every reply
names files to attach (`MEDIA:`): each tenant's own arrives through its own bot (the near miss), its neighbour's
file and `.env` go up through it too, but for the launch profile's `.env`, which Hermes' denylist knows (F31). The
launch profile's cron job, due at the ticker's second tick (after the messages, so F25 still shows), posts its
output in its own home channel through its own bot; the others' never fire (F6)."""

from __future__ import annotations

import pytest

from harness.pytest_plugin import assert_reproduced

pytestmark = pytest.mark.e2e


def test_every_profile_has_its_bot_but_the_process_environment_decides_who_it_answers(tenancy_audit):
    audit = tenancy_audit(scenario="gateway", tenants=3, phases=["cron", "route-auth", "turns"], tools=[],
                          services=["mattermost"], cron_wait=80.0)
    found = [f for f in audit.doc["findings"] if f.get("service") == "mattermost"]
    assert not [f for f in found if f["kind"] in ("wrong_key", "route_auth")], found  # own tokens; no stranger
    bled = {(f["victim"], f["seen_in"], f["canary"]) for f in found if f["kind"] == "profile_bleed"}
    assert {("alpha", "default", "allowed_channels"), ("beta", "default", "allowed_channels")} <= bled, bled
    first = {s for v, s, c in bled if v == "default" and c == "allowed_users"}  # the profile that took over
    assert len(first) == 1 and first <= {"alpha", "beta"}, bled
    assert not [c for c in bled if c[2] == "cron_delivery"], bled
    # MEDIA: every tenant that replied (F25 may refuse the launch profile's own messages) attached its own file
    # (the near miss: a `media` step, never a finding) and its neighbour's file and `.env` through its bot
    steps = {(t["tenant"], t["driver"]): t["ok"] for t in audit.doc["timeline"] if t["phase"] == "messaging"}
    attached = [n for n in ("default", "alpha", "beta") if steps.get((n, "media"))]
    assert len(attached) >= 2 and all(steps.get((n, "media"), True) for n in ("default", "alpha", "beta")), steps
    uploaded = {(f["victim"], f["seen_in"], f["canary"]) for f in found if f["kind"] == "request_leak"}
    neighbour = {"default": "beta", "alpha": "default", "beta": "alpha"}
    assert {(neighbour[n], n, "mattermost_file") for n in attached} <= uploaded, uploaded
    assert {(neighbour[n], n, "mattermost_key") for n in attached if neighbour[n] != "default"} <= uploaded, uploaded
    assert not [u for u in uploaded if u[0] == "default" and u[2] != "mattermost_file"]  # Hermes denies its .env
    assert steps[("default", "cron-delivery")], steps
    fired = {t["tenant"]: t["ok"] for t in audit.doc["timeline"] if t["phase"] == "cron"}
    assert fired == {"default": True, "alpha": False, "beta": False}  # F6
    documented = {d for i in audit.doc["incidents"] for d in i["documented"]}
    assert {"F6", "F24", "F25", "F31"} <= documented
    assert audit.doc["door_coverage"]["messaging platforms"] == "leak"
    assert audit.code == 1 and audit.verdict == "leak"
    assert_reproduced(audit)

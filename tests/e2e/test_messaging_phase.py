"""The gateway door's `messaging` phase against real Hermes 0.19.0, a Mattermost bot and a Slack bot per profile, in
one audit: every bot signs in with its own token (Slack's at `slack.com` through the proxy, its Socket Mode websocket
at its own workspace, the frames inspected); the secondary bots answer in a channel only the launch profile allows
(F24 on Mattermost, F43 on Slack); after the first secondary turn the launch profile's bots authorize by that
profile's allowlist (F25).
Strangers and the other profiles' leads get no turn through a secondary bot (the refusals that hold). Every reply
names files to attach (`MEDIA:`): each tenant's own arrives through its own bot (the near miss), its neighbour's
file and `.env` go up through it too, but for the launch profile's `.env`, which Hermes' denylist knows (F31). The
launch profile's cron job, due at the ticker's second tick (after the messages, so F25 still shows), posts its
output in its own home channel through its own bot (Mattermost's, the first platform); the others' never fire (F6).
One audit for both platforms: a second costs CI a whole gateway start and cron wait (measured on 2 cores,
2026-12-07: 98 s of audit for both, 94 s for Mattermost alone)."""

from __future__ import annotations

import json

import pytest

from harness.pytest_plugin import assert_reproduced

pytestmark = pytest.mark.e2e


def test_every_profile_has_its_bot_but_the_process_environment_decides_who_it_answers(tenancy_audit):
    audit = tenancy_audit(scenario="gateway", tenants=3, phases=["cron", "route-auth", "turns"], tools=[],
                          services=["mattermost", "slack"], cron_wait=80.0)
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
    media = ("mattermost_file", "slack_file")  # every platform's media file is named in every reply
    assert not [u for u in uploaded if u[0] == "default" and u[2] not in media]  # Hermes denies its .env
    assert steps[("default", "cron-delivery")], steps
    fired = {t["tenant"]: t["ok"] for t in audit.doc["timeline"] if t["phase"] == "cron"}
    assert fired == {"default": True, "alpha": False, "beta": False}  # F6
    _slack(audit, first)
    documented = {d for i in audit.doc["incidents"] for d in i["documented"]}
    assert {"F6", "F24", "F25", "F31", "F43"} <= documented
    assert audit.doc["door_coverage"]["messaging platforms"] == "leak"
    assert audit.code == 1 and audit.verdict == "leak"
    assert_reproduced(audit)


def _slack(audit, first: set[str]) -> None:
    """Every Slack bot signed in with its own tokens at `slack.com` and opened its websocket at its own workspace
    (each frame inspected, none flagged); the bots answer in the process environment's channels (F43) and the
    launch profile's bot authorizes by the profile that took over the process (F25, the same one as on Mattermost);
    no stranger got a turn; the replies' files go up to the upload URL each bot's own workspace issued (F31)."""
    names = ("default", "alpha", "beta")
    lines = [json.loads(x) for x in (audit.out / "ledger.jsonl").read_text().splitlines()]
    slack = [x for x in lines if (x.get("service") or "").startswith("slack")]
    assert {x["tenant"] for x in slack} == set(names)
    signed = {(x["tenant"], x["path"].split("?")[0]) for x in slack if x["bearer"] == "own"}
    assert {(n, p) for n in names for p in ("/api/auth.test", "/api/apps.connections.open")} <= signed, signed
    sockets = {x["tenant"]: x["websocket"]["messages"] for x in slack if x.get("websocket")}
    assert set(sockets) == set(names) and all(m["server->client"] >= 2 for m in sockets.values()), sockets
    assert not [x for x in slack if x.get("websocket") and x["findings"]]
    assert not [x for x in slack if x["bearer"] in ("foreign", "unknown")]
    assert not [t for t in audit.doc["timeline"] if t["phase"] == "messaging-connect"]  # every bot signed in
    assert not [t for t in audit.doc["timeline"] if t["driver"] == "unknown-request"]  # every request known
    found = [f for f in audit.doc["findings"] if (f.get("service") or "").startswith("slack")]
    assert not [f for f in found if f["kind"] in ("wrong_key", "route_auth")], found
    bled = {(f["victim"], f["seen_in"], f["canary"]) for f in found if f["kind"] == "profile_bleed"}
    # F43: a bot answers in the channels of the process environment: the launch profile's, or once a turn took it
    # over (F25; Mattermost's crossings run in the same rounds and may take it first) that profile's
    channels = {(v, s) for v, s, c in bled if c == "allowed_channels"}
    assert channels and all(s in {"default", *first} and v != s for v, s in channels), bled
    assert {s for v, s, c in bled if v == "default" and c == "allowed_users"} == first, bled  # F25
    uploaders = {x["tenant"] for x in slack if x["path"].startswith("/upload/v1/")}  # whose replies named files
    uploaded = {(f["victim"], f["seen_in"], f["canary"]) for f in found
                if f["kind"] == "request_leak" and f["service"] == "slack_issued"}
    neighbour = {"default": "beta", "alpha": "default", "beta": "alpha"}
    assert "alpha" in uploaders and {(neighbour[n], n, "slack_file") for n in uploaders} <= uploaded, uploaded

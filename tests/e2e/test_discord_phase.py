"""Discord in the gateway door's `messaging` phase against real Hermes 0.19.0: a Discord bot per profile, in an audit
of its own (55-65 s). Beside the other platforms in the shared audit of tests/e2e/test_messaging_phase.py its
crossings give the secondary profiles turns in every refused round (F47), which delay the others' turns past their
rounds (measured 2026-12-07: three of its seven tests then failed, all pass without Discord).

Every bot signs in with its own token at `discord.com` and on the gateway (`gateway.discord.gg`), both hosts every
tenant shares through the proxy's regular listener: each REST request is its token's tenant's, each gateway
connection claimed by its IDENTIFY for its own tenant (its frames, zlib-stream and fragmented, inspected); no
request the stub does not know, no stranger answered. Every bot admits by the launch profile's allowed users and,
the launch profile setting allowed roles, skips its own profile's allowlist (F47): the launch profile's lead gets a
turn through the secondary bots, whose own users and leads get none. After the first secondary turn the launch
profile's bot answers in that profile's lead channel (F48); its replies attach its neighbour's file and `.env` (F31).
"""

from __future__ import annotations

import json

import pytest

from harness.pytest_plugin import assert_reproduced

pytestmark = pytest.mark.e2e
NAMES = ("default", "alpha", "beta")


def _answered(step: dict) -> bool:
    """A step of a message that must be answered (ok: its reply came; failed: how many came), not of a refused one."""
    detail = step.get("detail") or ""
    return (step["ok"] and not detail) or "reply(ies)" in detail


def test_every_discord_bot_signs_in_with_its_own_token_but_admits_by_the_launch_profiles_allowlists(tenancy_audit):
    audit = tenancy_audit(scenario="gateway", tenants=3, phases=["turns"], tools=[], services=["discord"])
    lines = [json.loads(x) for x in (audit.out / "ledger.jsonl").read_text().splitlines() if x]
    discord = [x for x in lines if (x.get("service") or "").startswith("discord")]
    rest = [x for x in discord if x["service"] == "discord"]  # each request its token's tenant's, with its own token
    assert {x["tenant"] for x in rest} == set(NAMES) and {x["bearer"] for x in rest} == {"own"}, rest
    # each gateway connection claimed by its IDENTIFY for its own tenant (a bot Hermes' liveness probe reconnects
    # opens another, claimed alike); no finding in any frame
    claimed = [x["websocket"]["claimed"] for x in discord if x["service"] == "discord_gateway"]
    assert set(claimed) == set(NAMES) and len(claimed) >= 3, claimed
    assert all(x["websocket"]["messages"]["server->client"] >= 3 for x in discord if x.get("websocket"))
    assert not [x for x in discord if x.get("websocket") and x["findings"]]
    timeline = [t for t in audit.doc["timeline"] if t["phase"].startswith("messaging")]
    assert not [t for t in timeline if t["phase"] in ("messaging-connect:discord", "messaging-api")], timeline
    found = [f for f in audit.doc["findings"] if (f.get("service") or "").startswith("discord")]
    assert not [f for f in found if f["kind"] in ("wrong_key", "route_auth")], found  # own tokens; no stranger
    bled = {(f["victim"], f["seen_in"], f["canary"]) for f in found if f["kind"] == "profile_bleed"}
    assert {("alpha", "default", "allowed_users"), ("beta", "default", "allowed_users")} <= bled, bled  # F47
    assert not [b for b in bled if b[2] == "allowed_users" and b[1] != "default"], bled  # only the launch's list
    for n in ("alpha", "beta"):  # F47: their own users and leads refused, by the launch profile's allowlist
        answered = [t["ok"] for t in timeline if t["tenant"] == n and t["driver"] == "discord" and _answered(t)]
        assert answered == [False] * 3, timeline
    took = {s for v, s, c in bled if v == "default" and c == "allowed_channels"}  # F48, after F25's takeover
    assert len(took) == 1 and took <= {"alpha", "beta"}, bled
    media = {t["tenant"]: t["ok"] for t in audit.doc["timeline"] if t["driver"] == "discord media"}
    assert media == {"default": True}, media  # the launch profile's own file, through its own bot (the near miss)
    uploaded = {(f["victim"], f["seen_in"], f["canary"]) for f in found if f["kind"] == "request_leak"}
    assert {("beta", "default", "discord_file"), ("beta", "default", "discord_key")} <= uploaded, uploaded  # F31
    # none of the launch profile's own (text a model derived from its data is the spread of F47's turns: a secondary
    # bot's reply to a message the launch profile's allowlist admitted)
    assert not [u for u in uploaded if u[0] == "default" and not u[2].startswith("derived_")], uploaded
    documented = {d for i in audit.doc["incidents"] for d in i["documented"]}
    assert {"F31", "F47", "F48"} <= documented, documented
    assert not [i for i in audit.doc["incidents"] if not i["documented"] and "discord" in i["entry"]]
    assert audit.doc["platform_coverage"]["discord"] == "leak"
    assert audit.code == 1 and audit.verdict == "leak"
    assert_reproduced(audit)

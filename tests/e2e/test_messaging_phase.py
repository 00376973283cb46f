"""The gateway door's `messaging` phase against real Hermes 0.19.0, a Mattermost bot and a Telegram bot per profile,
in one audit: every bot signs in with its own token at its own server (Telegram's token in the URL path, never a
DNS-over-HTTPS lookup); the secondary Mattermost bots answer in a channel only the launch profile allows (F24); after
the first secondary turn the launch profile's bots authorize by that profile's allowlist (F25), on both platforms.
Strangers and the other profiles' leads get no turn through a secondary bot (the refusals that hold). A secondary
Telegram bot filters its users by the process environment's allowlist (F36): the secondary that did not take it
over refuses its own users. Every reply names files to attach (`MEDIA:`): each tenant's own arrives through its own
bot (the near miss), its neighbour's files and `.env` go up through it too, but for the launch profile's `.env`,
which Hermes' denylist knows (F31). The launch profile's cron job, due at the ticker's second tick (after the
messages, so F25 still shows), posts its output in its own home channel through its own bot; the others' never fire
(F6)."""

from __future__ import annotations

import pytest

from harness.pytest_plugin import assert_reproduced

pytestmark = pytest.mark.e2e
NEIGHBOUR = {"default": "beta", "alpha": "default", "beta": "alpha"}
MEDIA_FILES = {"mattermost_file", "telegram_file"}


def _answered(step: dict) -> bool:
    """A step of a message that must be answered (ok: its reply came; failed: how many came), not of a refused one."""
    detail = step.get("detail") or ""
    return (step["ok"] and not detail) or "reply(ies)" in detail


def test_every_profile_has_its_bots_but_the_process_environment_decides_who_they_answer(tenancy_audit):
    audit = tenancy_audit(scenario="gateway", tenants=3, phases=["cron", "route-auth", "turns"], tools=[],
                          services=["mattermost", "telegram"], cron_wait=80.0)
    on = {p: [f for f in audit.doc["findings"] if f.get("service") == p] for p in ("mattermost", "telegram")}
    for found in on.values():  # own tokens at their own servers, no stranger answered
        assert not [f for f in found if f["kind"] in ("wrong_key", "route_auth")], found
    bled = {p: {(f["victim"], f["seen_in"], f["canary"]) for f in found if f["kind"] == "profile_bleed"}
            for p, found in on.items()}
    assert {("alpha", "default", "allowed_channels"), ("beta", "default", "allowed_channels")} <= bled["mattermost"]
    first = {s for v, s, c in bled["mattermost"] if v == "default" and c == "allowed_users"}  # who took over
    assert len(first) == 1 and first <= {"alpha", "beta"}, bled
    assert bled["telegram"] == {("default", *first, "allowed_users")}, bled  # F25; its chat allowlists held
    assert not [c for b in bled.values() for c in b if c[2] == "cron_delivery"], bled
    timeline = [t for t in audit.doc["timeline"] if t["phase"] == "messaging"]
    steps = {(t["tenant"], t["driver"]): t["ok"] for t in timeline}
    other = ({"alpha", "beta"} - first).pop()  # its Telegram bot filters by the launch's list, then first's (F36)
    answered = [t["ok"] for t in timeline if t["tenant"] == other and t["driver"] == "telegram" and _answered(t)]
    assert answered == [False] * 3, timeline
    assert not [t for t in audit.doc["timeline"] if t["phase"] in ("messaging-connect", "messaging-api")]
    # MEDIA: every tenant that replied on a platform (F25 may refuse the launch profile's own messages) attached its
    # own file there (the near miss: a step, never a finding) and its neighbour's files and `.env` through its bot
    for platform, found in on.items():
        attached = [n for n in NEIGHBOUR if steps.get((n, f"{platform} media"))]
        assert all(steps.get((n, f"{platform} media"), True) for n in NEIGHBOUR), steps
        uploaded = {(f["victim"], f["seen_in"], f["canary"]) for f in found if f["kind"] == "request_leak"}
        assert {(NEIGHBOUR[n], n, f"{platform}_file") for n in attached} <= uploaded, uploaded
        assert {(NEIGHBOUR[n], n, f"{platform}_key") for n in attached if NEIGHBOUR[n] != "default"} <= uploaded
        assert not [u for u in uploaded if u[0] == "default" and u[2] not in MEDIA_FILES]  # Hermes denies its .env
    assert len([n for n in NEIGHBOUR if steps.get((n, "mattermost media"))]) >= 2, steps
    assert steps[("default", "mattermost cron-delivery")], steps  # the jobs deliver on the first platform
    fired = {t["tenant"]: t["ok"] for t in audit.doc["timeline"] if t["phase"] == "cron"}
    assert fired == {"default": True, "alpha": False, "beta": False}  # F6
    documented = {d for i in audit.doc["incidents"] for d in i["documented"]}
    assert {"F6", "F24", "F25", "F31", "F36"} <= documented
    assert not [i for i in audit.doc["incidents"] if not i["documented"] and "telegram" in i["entry"]]
    assert "DNS-over-HTTPS" not in (audit.out / "logs" / "backend-gateway.log").read_text()
    assert audit.doc["door_coverage"]["messaging platforms"] == "leak"
    assert audit.code == 1 and audit.verdict == "leak"
    assert_reproduced(audit)

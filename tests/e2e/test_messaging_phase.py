"""The gateway door's `messaging` phase against real Hermes 0.19.0 in one audit (shared by the tests below, each a
platform's): a bot per profile on Mattermost, Telegram, Slack, Signal, ntfy, email and IRC, driven in the same rounds.

Mattermost: every bot signs in with its own token; the secondary bots answer in a channel only the launch profile
allows (F24); after the first secondary turn the launch profile's bot authorizes by that profile's allowlist
(F25). Strangers and the other profiles' leads get no turn through a secondary bot (the refusals that hold). Every
reply names files to attach (`MEDIA:`): each tenant's own arrives through its own bot (the near miss), its
neighbour's file and `.env` go up through it too, but for the launch profile's `.env`, which Hermes' denylist knows
(F31). The launch profile's cron job, due at the ticker's second tick (after the messages, so F25 still shows),
posts its output in its own home channel through its own bot; the others' never fire (F6).

Telegram: every bot signs in with its own token in the URL path at its own server, never a DNS-over-HTTPS lookup;
after F25 the launch profile's bot admits the first secondary's lead; a secondary Telegram bot filters its users by
the process environment's allowlist (F36): the secondary that did not take it over refuses its own users.

Slack: every bot signs in with its own tokens at `slack.com` through the proxy and opens its Socket Mode websocket
at its own workspace (the frames inspected); the secondary bots answer in the process environment's channels (F43);
the launch profile's bot authorizes by the profile that took over the process (F25); the replies' files go up to
the upload URL each bot's own workspace issued (F31).

Signal: every bot streams with its own account; the secondary bots answer in a group only the launch profile
allows (F40) and put their 👀 on the launch profile's lead's messages, which they refuse (F41); the daemon reads the
neighbour's file a reply attaches by path (F31 through Signal). ntfy: the secondary profiles' bots are built from the
launch profile's settings and refused as its duplicate, so they never subscribe (F55); the launch profile's bot
receives over the proxied NDJSON stream (a turn after F25).

Email and IRC, over raw TCP listeners of the proxy (every connection a TCP flow, inspected in clear): the secondary
profiles' bots are built from the launch profile's settings, so they sign in to the launch profile's mailbox and
server with its password and never at their own (F51, F52); every email and IRC flow is the launch profile's.

Webhooks (the `webhooks` phase, last): the launch profile's listener runs every tenant's own route in its own profile,
but also every tenant's route under its neighbour's URL, in that profile (F62); the secondary profiles' replies go out
through the launch profile's Mattermost bot (F63), the launch profile's own through its own bot (the near miss)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.options import RunOptions
from harness.options import hermes_python as resolve_hermes_python
from harness.pytest_plugin import Audit, assert_reproduced
from harness.run import run_audit

pytestmark = pytest.mark.e2e
NEIGHBOUR = {"default": "beta", "alpha": "default", "beta": "alpha"}


@pytest.fixture(scope="module")
def audit(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Audit:
    """The one audit of the module (`tenancy_audit`'s, for the module)."""
    opt = request.config.getoption("--hermes-python")
    out = tmp_path_factory.mktemp("messaging") / "evidence"
    result = run_audit(RunOptions(out=out, hermes_python=resolve_hermes_python(Path(opt) if opt else None),
                                  quiet=True, scenario="gateway", tenants=3,
                                  phases=["cron", "route-auth", "turns", "webhooks"],
                                  tools=[], services=["mattermost", "telegram", "slack", "signal", "ntfy", "email",
                                                      "irc"], cron_wait=80.0))
    assert result.out is not None
    return Audit(result.verdict.exit_code, result.out, result.to_dict())


def _bled(audit: Audit, service: str) -> set[tuple[str, str, str]]:
    return {(f["victim"], f["seen_in"], f["canary"]) for f in audit.doc["findings"]
            if f.get("service") == service and f["kind"] == "profile_bleed"}


def _took_over(audit: Audit) -> set[str]:
    """The secondary profile whose first turn took over the process environment (F25), as any platform shows it: the
    launch profile's bot admitted that profile's lead."""
    every = ("mattermost", "telegram", "slack", "signal", "ntfy", "email", "irc")
    return {s for p in every for v, s, c in _bled(audit, p) if v == "default" and c == "allowed_users"}


def _media(audit: Audit, platform: str) -> dict[str, bool]:
    """Each tenant's `media` step on `platform` (a tenant with no reply then has none)."""
    return {t["tenant"]: t["ok"] for t in audit.doc["timeline"]
            if t["phase"] == "messaging" and t["driver"] == f"{platform} media"}


def _answered(step: dict) -> bool:
    """A step of a message that must be answered (ok: its reply came; failed: how many came), not of a refused one."""
    detail = step.get("detail") or ""
    return (step["ok"] and not detail) or "reply(ies)" in detail


def _uploaded(audit: Audit, service: str) -> set[tuple[str, str, str]]:
    return {(f["victim"], f["seen_in"], f["canary"]) for f in audit.doc["findings"]
            if f.get("service") == service and f["kind"] == "request_leak"}


def _made_of(canary: str, suffix: str) -> bool:
    """Whether a canary that reached a platform is one of the launch profile's files (`suffix`) or text a model derived
    from the launch profile's data (`derived_*`: a secondary bot's reply to a message in the launch profile's channel
    (F24, F40, F47) carries it, that crossing's spread, not Hermes' `.env` denylist at work)."""
    return canary.endswith(suffix) or canary.startswith("derived_")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def test_every_profile_has_its_bot_but_the_process_environment_decides_who_it_answers(audit):
    found = [f for f in audit.doc["findings"] if f.get("service") == "mattermost"]
    assert not [f for f in found if f["kind"] in ("wrong_key", "route_auth")], found  # own tokens; no stranger
    bled = _bled(audit, "mattermost")
    first = _took_over(audit)  # the profile that took over (on whichever platform its lead came first)
    assert len(first) == 1 and first <= {"alpha", "beta"}, bled
    # F24: each secondary bot answers in a channel only the process environment's allowlist names: the launch
    # profile's, or after F25 the profile that took over (whose message comes first is the gateway's race)
    channels = {(v, s) for v, s, c in bled if c == "allowed_channels"}
    assert {v for v, s in channels if s in {"default", *first} and s != v} == {"alpha", "beta"}, bled
    assert {s for v, s, c in bled if v == "default" and c == "allowed_users"} <= first, bled
    assert not [c for c in bled if c[2] == "cron_delivery"], bled
    # MEDIA: every tenant that replied (F25 may refuse the launch profile's own messages) attached its own file
    # (the near miss: a `media` step, never a finding) and its neighbour's file and `.env` through its bot
    steps = _media(audit, "mattermost")
    attached = [n for n, ok in steps.items() if ok]
    assert len(attached) >= 2 and all(steps.values()), steps
    uploaded = _uploaded(audit, "mattermost")
    assert {(NEIGHBOUR[n], n, "mattermost_file") for n in attached} <= uploaded, uploaded
    assert {(NEIGHBOUR[n], n, "mattermost_key") for n in attached if NEIGHBOUR[n] != "default"} <= uploaded, uploaded
    assert not [u for u in uploaded if u[0] == "default" and not _made_of(u[2], "_file")]  # Hermes denies its .env
    cron = {(t["tenant"], t["driver"]): t["ok"] for t in audit.doc["timeline"] if t["phase"] == "messaging"}
    assert cron[("default", "mattermost cron-delivery")], cron  # the jobs deliver on the first platform
    fired = {t["tenant"]: t["ok"] for t in audit.doc["timeline"] if t["phase"] == "cron"}
    assert fired == {"default": True, "alpha": False, "beta": False}  # F6
    documented = {d for i in audit.doc["incidents"] for d in i["documented"]}
    assert {"F6", "F24", "F25", "F31"} <= documented
    assert audit.doc["door_coverage"]["messaging platforms"] == "leak"
    assert audit.code == 1 and audit.verdict == "leak"
    assert_reproduced(audit)


def test_every_telegram_bot_signs_in_at_its_own_server_but_a_secondary_filters_by_the_process_environment(audit):
    found = [f for f in audit.doc["findings"] if f.get("service") == "telegram"]
    assert not [f for f in found if f["kind"] in ("wrong_key", "route_auth")], found  # own tokens; no stranger
    first = _took_over(audit)
    assert _bled(audit, "telegram") <= {("default", *first, "allowed_users")}  # F25 at most; its chat allowlists held
    other = ({"alpha", "beta"} - first).pop()  # its Telegram bot filters by the launch's list, then first's (F36)
    timeline = [t for t in audit.doc["timeline"] if t["phase"] == "messaging"]
    answered = [t["ok"] for t in timeline if t["tenant"] == other and t["driver"] == "telegram" and _answered(t)]
    assert answered == [False] * 3, timeline
    assert not [t for t in audit.doc["timeline"] if t["phase"] in ("messaging-connect:telegram", "messaging-api")]
    steps = _media(audit, "telegram")
    uploaded = _uploaded(audit, "telegram")
    assert {(NEIGHBOUR[n], n, "telegram_file") for n, ok in steps.items() if ok} <= uploaded, uploaded
    assert not [u for u in uploaded if u[0] == "default" and not _made_of(u[2], "_file")]  # Hermes denies its .env
    documented = {d for i in audit.doc["incidents"] for d in i["documented"]}
    assert {"F25", "F31", "F36"} <= documented, documented
    assert not [i for i in audit.doc["incidents"] if not i["documented"] and "telegram" in i["entry"]]
    assert "DNS-over-HTTPS" not in (audit.out / "logs" / "backend-gateway.log").read_text()


def test_every_signal_bot_streams_its_own_account_but_takes_the_launch_profiles_groups_and_reactions(audit):
    found = [f for f in audit.doc["findings"] if f.get("service") == "signal"]
    assert not [f for f in found if f["kind"] in ("wrong_key", "route_auth")], found  # own accounts; no stranger
    bled = _bled(audit, "signal")
    assert {("alpha", "default", "allowed_channels"), ("beta", "default", "allowed_channels")} <= bled, bled  # F40
    assert {("alpha", "default", "reactions"), ("beta", "default", "reactions")} <= bled, bled  # F41
    assert not [c for c in bled if c[2] == "reactions" and c[0] == "default"], bled  # the launch's list is its own
    steps = _media(audit, "signal")  # by path: the daemon (the stub) read each file a reply named
    attached = [n for n, ok in steps.items() if ok]
    assert attached and all(steps.values()), steps
    read = _uploaded(audit, "signal")
    assert {(NEIGHBOUR[n], n, "signal_file") for n in attached} <= read, read
    # default's media files and home (the path names it), never its `.env` (Hermes' denylist, F31)
    assert not [u for u in read if u[0] == "default" and not (_made_of(u[2], "_file") or u[2] == "home")], read
    documented = {d for i in audit.doc["incidents"] if i["entry"] == "service signal" for d in i["documented"]}
    assert {"F25", "F31", "F40", "F41"} <= documented, documented


def test_no_secondary_ntfy_bot_starts_and_the_launch_profiles_streams_through_the_proxy(audit):
    connect = {(t["tenant"], t["ok"]) for t in audit.doc["timeline"] if t["phase"] == "messaging-connect:ntfy"}
    assert connect == {("alpha", False), ("beta", False)}, connect  # F55: refused as the launch's duplicate
    log = (audit.out / "logs" / "backend-gateway.log").read_text()
    assert all(f"Profile 'default' and '{n}' both configure ntfy with the same credential" in log
               for n in ("alpha", "beta")), log[-2000:]
    # the launch profile's bot got the messages over the NDJSON stream: after F25 it admits the first secondary
    # profile's lead, whose turn runs on the launch profile's provider
    bled = _bled(audit, "ntfy")
    assert {v for v, _, c in bled if c == "allowed_users"} == {"default"}, bled
    assert not [f for f in audit.doc["findings"] if f.get("service") == "ntfy" and f["kind"] == "wrong_key"]
    documented = {d for i in audit.doc["incidents"] for d in i["documented"]}
    assert {"F25", "F55"} <= documented, documented


def test_every_slack_bot_signs_in_at_its_own_workspace_but_takes_the_process_environments_channels(audit):
    """Every Slack bot signed in with its own tokens at `slack.com` and opened its websocket at its own workspace
    (each frame inspected, none flagged); the bots answer in the process environment's channels (F43) and the
    launch profile's bot authorizes by the profile that took over the process (F25, the same one as on Mattermost);
    no stranger got a turn; the replies' files go up to the upload URL each bot's own workspace issued (F31)."""
    first = _took_over(audit)
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
    assert not [t for t in audit.doc["timeline"] if t["phase"] == "messaging-connect:slack"]  # every bot signed in
    assert not [t for t in audit.doc["timeline"] if t["phase"] == "messaging-api" and t["driver"] == "slack"]
    found = [f for f in audit.doc["findings"] if (f.get("service") or "").startswith("slack")]
    assert not [f for f in found if f["kind"] in ("wrong_key", "route_auth")], found
    bled = {(f["victim"], f["seen_in"], f["canary"]) for f in found if f["kind"] == "profile_bleed"}
    # F43: a bot answers in the channels of the process environment: the launch profile's, or once a turn took it
    # over (F25; Mattermost's crossings run in the same rounds and may take it first) that profile's
    channels = {(v, s) for v, s, c in bled if c == "allowed_channels"}
    assert channels and all(s in {"default", *first} and v != s for v, s in channels), bled
    assert {s for v, s, c in bled if v == "default" and c == "allowed_users"} <= first, bled  # F25 at most
    uploaders = {x["tenant"] for x in slack if x["path"].startswith("/upload/v1/")}  # whose replies named files
    uploaded = {(f["victim"], f["seen_in"], f["canary"]) for f in found
                if f["kind"] == "request_leak" and f["service"] == "slack_issued"}
    neighbour = {"default": "beta", "alpha": "default", "beta": "alpha"}
    assert "alpha" in uploaders and {(neighbour[n], n, "slack_file") for n in uploaders} <= uploaded, uploaded
    documented = {d for i in audit.doc["incidents"] for d in i["documented"]}
    assert {"F25", "F31", "F43"} <= documented, documented


def test_every_email_and_irc_bot_signs_in_at_the_launch_profiles_server_with_its_password(audit):
    for platform in ("email", "irc"):
        connect = [t for t in audit.doc["timeline"] if t["phase"] == f"messaging-connect:{platform}"]
        assert {(t["tenant"], t["ok"]) for t in connect} == {("alpha", False), ("beta", False)}, connect  # F51, F52
        assert all("sign-ins at default's: " in t["detail"] and "(default's credential)" in t["detail"]
                   for t in connect), connect
    tcp = [x for x in _lines(audit.out / "ledger.jsonl") if x["method"] == "TCP"]  # every connection, in clear
    assert {(x["tenant"], x["service"]) for x in tcp} == {("default", "email"), ("default", "irc")}
    stubs = _lines(audit.out / "stubs.jsonl")  # every login with default's own password (a reply's attachment may
    for service, login in (("irc", "PASS"), ("email", "LOGIN")):  # carry another's .env: F31, at its service)
        logins = [x for x in stubs if x["service"] == service and x["method"] == login]
        assert len(logins) >= 3 and {x["tenant"] for x in logins} == {"default"} and not any(
            x["wrong_key"] for x in logins), logins
    assert not [f for f in audit.doc["findings"] if f["kind"] == "bypass"]  # every stub connection passed the proxy
    documented = {d for i in audit.doc["incidents"] for d in i["documented"]}
    assert {"F51", "F52"} <= documented, documented
    assert audit.doc["platform_coverage"]["email"] != "driven" and audit.doc["platform_coverage"]["irc"] != "driven"


def test_every_tenants_webhook_route_runs_in_any_profile_and_replies_through_the_launch_profiles_bot(audit):
    """Each tenant's own route ran its turn on its own provider (no `webhook_turn`); its neighbour's route and secret
    under its URL ran one there too (F62) and the reply went to the neighbour's channel; alpha's and beta's replies
    were posted by the launch profile's Mattermost bot (F63), never a borrowed one; the launch profile's own reply is
    the near miss: its step holds."""
    found = {(f["victim"], f["seen_in"], f["canary"]) for f in audit.doc["findings"]
             if f["phase"] == "webhooks" and f["kind"] == "profile_bleed"}
    names = ("default", "alpha", "beta")
    assert {(n, NEIGHBOUR[n], "webhook_route") for n in names} <= found, found  # F62
    assert {("alpha", "default", "webhook_bot"), ("beta", "default", "webhook_bot")} <= found, found  # F63
    assert not [c for c in found if c[2] in ("webhook_turn", "webhook_borrowed_bot")], found
    assert not [c for c in found if c[2] == "webhook_bot" and c[0] == "default"], found
    own = {t["tenant"]: t["ok"] for t in audit.doc["timeline"]
           if t["phase"] == "webhooks" and "route: HTTP" not in (t["detail"] or "")}
    assert own == {"default": True, "alpha": False, "beta": False}, own  # only the launch's reply at its own bot
    webhook = [i for i in audit.doc["incidents"] if i["entry"] == "webhook"]
    assert webhook and {"F62", "F63"} <= set(webhook[0]["documented"]), webhook
    assert audit.doc["door_coverage"]["webhooks"] == "leak"

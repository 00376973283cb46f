"""The gateway door's `messaging` phase against real Hermes 0.19.0 in one audit (shared by the tests below, each a
platform's): a bot per profile on Mattermost, email and IRC, driven in the same rounds.

Mattermost: every bot signs in with its own token; the secondary bots answer in a channel only the launch profile
allows (F24); after the first secondary turn the launch profile's bot authorizes by that profile's allowlist
(F25). Strangers and the other profiles' leads get no turn through a secondary bot (the refusals that hold). Every
reply names files to attach (`MEDIA:`): each tenant's own arrives through its own bot (the near miss), its
neighbour's file and `.env` go up through it too, but for the launch profile's `.env`, which Hermes' denylist knows
(F31). The launch profile's cron job, due at the ticker's second tick (after the messages, so F25 still shows),
posts its output in its own home channel through its own bot; the others' never fire (F6).

Email and IRC, over raw TCP listeners of the proxy (every connection a TCP flow, inspected in clear): the secondary
profiles' bots are built from the launch profile's settings, so they sign in to the launch profile's mailbox and
server with its password and never at their own (F51, F52); every email and IRC flow is the launch profile's."""

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
                                  quiet=True, scenario="gateway", tenants=3, phases=["cron", "route-auth", "turns"],
                                  tools=[], services=["mattermost", "email", "irc"], cron_wait=80.0))
    assert result.out is not None
    return Audit(result.verdict.exit_code, result.out, result.to_dict())


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def test_every_profile_has_its_bot_but_the_process_environment_decides_who_it_answers(audit):
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
    assert {(NEIGHBOUR[n], n, "mattermost_file") for n in attached} <= uploaded, uploaded
    assert {(NEIGHBOUR[n], n, "mattermost_key") for n in attached if NEIGHBOUR[n] != "default"} <= uploaded, uploaded
    assert not [u for u in uploaded if u[0] == "default" and not u[2].endswith("_file")]  # Hermes denies its .env
    assert steps[("default", "cron-delivery")], steps
    fired = {t["tenant"]: t["ok"] for t in audit.doc["timeline"] if t["phase"] == "cron"}
    assert fired == {"default": True, "alpha": False, "beta": False}  # F6
    documented = {d for i in audit.doc["incidents"] for d in i["documented"]}
    assert {"F6", "F24", "F25", "F31"} <= documented
    assert audit.doc["door_coverage"]["messaging platforms"] == "leak"
    assert audit.code == 1 and audit.verdict == "leak"
    assert_reproduced(audit)


def test_every_email_and_irc_bot_signs_in_at_the_launch_profiles_server_with_its_password(audit):
    for platform in ("email", "irc"):
        connect = [t for t in audit.doc["timeline"] if t["phase"] == f"messaging-connect:{platform}"]
        assert {(t["tenant"], t["ok"]) for t in connect} == {("alpha", False), ("beta", False)}, connect  # F51, F52
        assert all("sign-ins at default's: " in t["detail"] and "(default's credential)" in t["detail"]
                   for t in connect), connect
    tcp = [x for x in _lines(audit.out / "ledger.jsonl") if x["method"] == "TCP"]  # every connection, in clear
    assert {(x["tenant"], x["service"]) for x in tcp} == {("default", "email"), ("default", "irc")}
    assert not [x for x in tcp if any(f["kind"] == "wrong_key" for f in x["findings"])]  # its own password, always
    stubs = _lines(audit.out / "stubs.jsonl")
    for service, login in (("irc", "PASS"), ("email", "LOGIN")):  # the stubs' record: who logged in where, with what
        logins = [x for x in stubs if x["service"] == service and x["method"] == login]
        assert len(logins) >= 3 and {x["tenant"] for x in logins} == {"default"} and not any(
            x["wrong_key"] for x in logins), logins
    assert not [f for f in audit.doc["findings"] if f["kind"] == "bypass"]  # every stub connection passed the proxy
    documented = {d for i in audit.doc["incidents"] for d in i["documented"]}
    assert {"F51", "F52"} <= documented, documented
    assert audit.doc["platform_coverage"]["email"] != "driven" and audit.doc["platform_coverage"]["irc"] != "driven"

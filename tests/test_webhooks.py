"""The `webhooks` phase: the launch profile's webhook listener with a route per tenant, and the judge of each post's
turn and reply, with planted crossings (a turn in another profile by another tenant's route, a reply through the
launch profile's bot or one it borrowed, in another tenant's channel, a turn on another provider) and their near
misses (a tenant's own route delivering through its own bot in its own channel; another tenant's route refused). Then
Hermes' own webhook adapter, in the Hermes venv: it takes the phase's signature, and delivers a reply through the
launch profile's bot (to the launch profile's home channel when the route names none), else another profile's."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from harness.core.findings import Finding
from harness.detect.engine.matcher import matcher_for
from harness.detect.incidents import build
from harness.drive.context import Context
from harness.drive.hermes.agent import Sandbox
from harness.drive.phases import webhooks
from harness.drive.phases.webhooks import Post
from harness.drive.platforms.mattermost import MattermostStub
from harness.drive.surface import PlantContext
from harness.options import RunOptions, UsageError, check_options
from tests.platform_adapters import registry, run

NAMES = ["default", "alpha", "beta"]


def _ctx(tmp_path: Path, platforms: tuple[str, ...] = ("mattermost",), unset: tuple[str, ...] = ()) -> SimpleNamespace:
    reg = registry(tmp_path, platforms, NAMES)
    for t in reg:
        t.canaries[webhooks.PAYLOAD] = f"webhookpayload-{t.name}-qxcvyb{t.name:0>12}"
    steps: list[tuple[str, str, bool, str]] = []
    ctx = SimpleNamespace(
        registry=reg, registry_path=tmp_path / "registry.yaml", sandbox=Sandbox(tmp_path / "sandbox"),
        scenario="gateway", findings=[], steps=steps, opts=SimpleNamespace(unset=list(unset), timeout=10.0, plants=[]),
        stubs={n: SimpleNamespace(snapshot=list) for n in NAMES}, services=lambda: list(platforms),
        service_stubs={(t.name, p): MattermostStub(t) for t in reg for p in platforms},
        record=lambda r, phase, snapshot=True: steps.append((r.tenant, r.driver, r.ok, r.detail)))
    ctx.mint = lambda tenant, kind, value: Context.mint(ctx, tenant, kind, value)  # type: ignore[arg-type]
    ctx.unset_by = lambda tenant: Context.unset_by(ctx, tenant)  # type: ignore[arg-type]
    ctx.relaxed = lambda tenant, service, what: Context.relaxed(ctx, tenant, service, what)  # type: ignore[arg-type]
    return ctx


def _turn(ctx: SimpleNamespace, tenant: str, mark: str) -> None:
    """A provider request of `tenant`'s carrying `mark`: the post's turn ran there."""
    ctx.stubs[tenant] = SimpleNamespace(snapshot=lambda: [SimpleNamespace(body=f"Hello ({mark}) x".encode())])


def _reply(ctx: SimpleNamespace, profile: str, server: str, bot: str, channel: str) -> None:
    """`profile`'s agent reply posted at `server`'s stub with `bot`'s token in `channel`'s home channel."""
    reg = ctx.registry
    ctx.service_stubs[(server, "mattermost")].add_post(
        reg[channel].canaries["mattermost_channel"], f"probe done for tenant {profile}",
        reg[bot].canaries["mattermost_key"])


def _found(ctx: SimpleNamespace) -> list[tuple[str, str, str, str]]:
    return sorted((f.kind, f.victim, f.seen_in, f.canary) for f in ctx.findings)


def test_the_launch_profile_listens_on_loopback_with_a_route_per_tenant_and_names_no_tenants_channel(tmp_path):
    ctx = _ctx(tmp_path)
    assert webhooks.settings(ctx, "alpha").config == {}  # a secondary profile that binds a port is skipped whole
    laid = webhooks.settings(ctx, "default").config["platforms"]["webhook"]
    again = webhooks.settings(ctx, "default").config["platforms"]["webhook"]
    assert laid["enabled"] and laid["extra"]["host"] == "127.0.0.1" and isinstance(laid["extra"]["port"], int)
    routes = laid["extra"]["routes"]
    launch = ctx.registry["default"].canaries
    assert routes == {f"tenancy-{n}": {"secret": launch[f"webhook_secret_{n}"], "prompt": "{text}", "profile": n,
                                       "deliver": "mattermost", "deliver_extra": {"chat_id": "{channel}"}}
                      for n in NAMES}
    assert again["extra"]["routes"] == routes, "each route's secret is minted once"
    text = yaml.safe_dump(laid).encode()  # the launch profile's config holds its own canaries only
    assert {h.tenant for h in matcher_for(ctx.registry).find(text)} == {"default"}
    bare = webhooks.settings(_ctx(tmp_path / "bare", platforms=()), "default").config["platforms"]["webhook"]
    assert {r["deliver"] for r in bare["extra"]["routes"].values()} == {"log"}  # no platform: Hermes' log
    assert not [r for r in bare["extra"]["routes"].values() if "deliver_extra" in r]


def test_a_post_is_signed_for_its_route_and_goes_to_its_profiles_url():
    assert Post("default", "alpha", "hook1").path("default") == "/webhooks/tenancy-alpha"
    assert Post("beta", "alpha", "hook2").path("default") == "/p/beta/webhooks/tenancy-alpha"
    headers = webhooks.signed("s3cret", b'{"text": "x"}', 1700000000)
    assert headers["x-webhook-timestamp"] == "1700000000" and len(headers["x-webhook-signature-v2"]) == 64
    assert headers != webhooks.signed("other", b'{"text": "x"}', 1700000000)


def test_a_tenants_own_route_delivering_through_its_own_bot_in_its_home_channel_is_no_crossing(tmp_path):
    ctx = _ctx(tmp_path)
    since = time.time() - 1
    _turn(ctx, "alpha", "hook2")
    _reply(ctx, "alpha", "alpha", "alpha", "alpha")
    webhooks.judge(ctx, Post("alpha", "alpha", "hook2"), 202, since, 1.0)
    assert ctx.findings == [] and ctx.steps == [("alpha", "webhook mattermost", True, "")]


def test_a_reply_through_the_launch_profiles_bot_is_a_webhook_bot_crossing_and_its_own_delivery_failed(tmp_path):
    ctx = _ctx(tmp_path)
    since = time.time() - 1
    _turn(ctx, "alpha", "hook2")
    _reply(ctx, "alpha", "default", "default", "alpha")  # alpha's channel, at default's server with default's token
    webhooks.judge(ctx, Post("alpha", "alpha", "hook2"), 202, since, 1.0)
    assert _found(ctx) == [("profile_bleed", "alpha", "default", "webhook_bot")]
    assert [f.service for f in ctx.findings] == ["mattermost"]  # a delivery names its platform
    [(tenant, _, ok, detail)] = ctx.steps
    assert (tenant, ok) == ("alpha", False) and "posted at: default" in detail


def test_a_reply_through_a_bot_the_launch_profile_borrowed_is_a_webhook_borrowed_bot_crossing(tmp_path):
    ctx = _ctx(tmp_path, unset=("launch:mattermost.token",))
    since = time.time() - 1
    _turn(ctx, "default", "hook1")
    _reply(ctx, "default", "alpha", "alpha", "default")  # the launch has no bot: alpha's posts its reply
    webhooks.judge(ctx, Post("default", "default", "hook1"), 202, since, 1.0)
    assert _found(ctx) == [("profile_bleed", "default", "alpha", "webhook_borrowed_bot")]
    [(tenant, _, ok, detail)] = ctx.steps  # it owes no delivery through a bot it leaves unset
    assert (tenant, ok) == ("default", True) and "leaves mattermost.token unset" in detail


def test_another_tenants_route_refused_is_no_crossing(tmp_path):
    ctx = _ctx(tmp_path)
    webhooks.judge(ctx, Post("alpha", "default", "hook5"), 401, time.time() - 1, 1.0)
    assert ctx.findings == [] and ctx.steps == [("alpha", "webhook mattermost", True, "default's route: HTTP 401, "
                                                 "0 request(s)")]


def test_another_tenants_route_that_runs_a_turn_in_a_profile_is_a_webhook_route_crossing(tmp_path):
    ctx = _ctx(tmp_path)
    since = time.time() - 1
    _turn(ctx, "beta", "hook6")
    _reply(ctx, "beta", "beta", "beta", "alpha")  # beta's own bot, but in the channel alpha's payload named
    webhooks.judge(ctx, Post("beta", "alpha", "hook6"), 202, since, 1.0)
    assert _found(ctx) == [("profile_bleed", "beta", "alpha", "webhook_channel"),
                           ("profile_bleed", "beta", "alpha", "webhook_route")]
    assert {f.canary: f.service for f in ctx.findings} == {"webhook_route": None, "webhook_channel": "mattermost"}
    route_bound = _ctx(tmp_path / "bound")  # the near miss: accepted, but its turn ran in the route's own profile
    _turn(route_bound, "alpha", "hook6")
    webhooks.judge(route_bound, Post("beta", "alpha", "hook6"), 202, since, 1.0)
    assert route_bound.findings == []
    failed = _ctx(tmp_path / "failed")  # accepted into beta's profile, whose turn then failed: still its route's
    webhooks.judge(failed, Post("beta", "alpha", "hook6"), 202, since, 1.0)
    assert _found(failed) == [("profile_bleed", "beta", "alpha", "webhook_route")]


def test_a_turn_on_another_tenants_provider_is_a_webhook_turn_crossing(tmp_path):
    ctx = _ctx(tmp_path, platforms=())
    _turn(ctx, "beta", "hook2")
    webhooks.judge(ctx, Post("alpha", "alpha", "hook2"), 202, time.time() - 1, 1.0)
    assert _found(ctx) == [("profile_bleed", "alpha", "beta", "webhook_turn")]
    assert ctx.steps[0][:3] == ("alpha", "webhook log", False)  # no turn on its own provider


def test_every_webhook_crossing_is_an_incident_of_the_webhook_entry_point():
    found = [Finding("profile_bleed", "alpha", "default", kind, "rpc", "gateway:webhook /p/alpha/webhooks/x",
                     scenario="gateway", phase="webhooks", service="mattermost", time=1.0)
             for kind in ("webhook_route", "webhook_bot", "webhook_borrowed_bot", "webhook_channel", "webhook_turn")]
    assert [i.entry for i in build(found)] == ["webhook"]


def test_the_prompt_plant_puts_the_donors_canary_in_the_targets_route(tmp_path):
    ctx = _ctx(tmp_path)
    home = tmp_path / "launch"
    home.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump(webhooks.settings(ctx, "default").config))
    donor = ctx.registry["default"]
    donor.home = str(home)
    webhooks.PHASE.plants["webhook-prompt"].action(PlantContext(donor, ctx.registry["alpha"], tmp_path, "", ""))
    routes = yaml.safe_load((home / "config.yaml").read_text())["platforms"]["webhook"]["extra"]["routes"]
    assert routes["tenancy-alpha"]["prompt"] == f"{{text}} {donor.canaries['soul']}"
    assert routes["tenancy-beta"]["prompt"] == "{text}"  # the other routes as they were


def test_the_launch_profile_can_leave_a_setting_unset_too(tmp_path):
    ctx = _ctx(tmp_path, unset=("launch:mattermost.token", "mattermost.allowed_users"))
    assert ctx.unset_by("default") == ["mattermost.token"] and ctx.unset_by("alpha") == ["mattermost.allowed_users"]
    assert ctx.unset_by("beta") == []
    assert ctx.relaxed("default", "mattermost", "sign-in") and not ctx.relaxed("beta", "mattermost", "sign-in")
    check_options(RunOptions(scenario="gateway", services=["mattermost"], unset=["launch:mattermost.token"]))
    with pytest.raises(UsageError, match=r"unknown setting 'mattermost\.nosuch'"):
        check_options(RunOptions(scenario="gateway", services=["mattermost"], unset=["launch:mattermost.nosuch"]))


#: In the Hermes venv: Hermes' webhook adapter checks the phase's signature, and delivers a reply through the bots of
#: a runner whose launch profile has one on the platform, or has none (another profile's then).
ADAPTER = """
    import asyncio, json
    from types import SimpleNamespace
    from multidict import CIMultiDict
    from gateway.config import HomeChannel, Platform, PlatformConfig
    from gateway.platforms.webhook import WebhookAdapter

    adapter = WebhookAdapter(PlatformConfig(enabled=True, extra={"host": "127.0.0.1", "port": 9, "routes": {}}))
    request = SimpleNamespace(headers=CIMultiDict(HEADERS), match_info={"route_name": "tenancy-alpha"})
    checked = [adapter._validate_signature(request, BODY, s) for s in (SECRET, "another secret")]
    v1 = SimpleNamespace(headers=CIMultiDict({k: v for k, v in HEADERS.items() if not k.endswith("-v2")}),
                         match_info={"route_name": "tenancy-alpha"})
    checked.append(adapter._validate_signature(v1, BODY, SECRET))  # the body-only V1 older releases check
    sent = []

    class Bot:
        def __init__(self, name):
            self.name = name
        async def send(self, chat_id, content, metadata=None):
            sent.append([self.name, chat_id])
            return SimpleNamespace(success=True)

    bots = {n: Bot(n) for n in ("default", "alpha", "beta")}
    def runner(launch, home):
        return SimpleNamespace(adapters=launch, config=SimpleNamespace(get_home_channel=lambda p: home),
                               _profile_adapters={n: {Platform.MATTERMOST: bots[n]} for n in ("alpha", "beta")})

    async def main():
        home = HomeChannel(platform=Platform.MATTERMOST, chat_id="default-home", name="Home")
        adapter.gateway_runner = runner({Platform.MATTERMOST: bots["default"]}, home)
        await adapter._deliver_cross_platform("mattermost", "r", {"deliver_extra": {"chat_id": "alpha-home"}})
        await adapter._deliver_cross_platform("mattermost", "r", {"deliver_extra": {}})
        adapter.gateway_runner = runner({}, None)
        await adapter._deliver_cross_platform("mattermost", "r", {"deliver_extra": {"chat_id": "beta-home"}})

    asyncio.run(main())
    print(json.dumps({"checked": checked, "sent": sent}))
"""


def test_hermes_takes_the_signature_and_delivers_through_the_launch_profiles_bot_or_a_borrowed_one(
        tmp_path, hermes_python):
    body = json.dumps({"text": "Hello (hook1) x", "channel": "c"}).encode()
    secret = "the route's secret"
    headers = webhooks.signed(secret, body, int(time.time()))
    got = run(hermes_python, ADAPTER, tmp_path / "home", {"HEADERS": headers, "BODY": body, "SECRET": secret},
              timeout=120).out
    assert got["checked"] == [True, False, True]  # the near miss: another route's secret
    assert got["sent"] == [["default", "alpha-home"],  # the channel the route names, through the launch's bot (F63)
                           ["default", "default-home"],  # none named: the launch profile's home channel
                           ["alpha", "beta-home"]]  # the launch has no bot there: the first profile's (F64)

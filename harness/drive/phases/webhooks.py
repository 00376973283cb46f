"""The `webhooks` phase of the gateway door (by name: `--phases webhooks`): Hermes' generic webhook platform, one HTTP
listener of the launch profile that serves every profile under `/p/<profile>/webhooks/<route>` (a secondary profile
may not enable it: the gateway skips a profile that binds a port). A route's payload runs an agent turn in the
profile its URL names, and the reply is delivered to a messaging platform (`deliver:`).

For a run with the phase the launch profile's `platforms.webhook` listens on a free loopback port with a route per
tenant (`tenancy-<tenant>`, where Hermes reads routes: the launch profile's config), each with a secret of its own (a
canary of the launch profile's, whose config holds it), the profile it serves (`profile: <tenant>`: 0.19.0 ignores
the key; a Hermes that binds a route to its profile, as docs/fixes/F62.patch does, serves it under that profile's URL
only), the prompt `{text}` and, when the run drives a messaging platform, `deliver:` the first of them and
`deliver_extra.chat_id: "{channel}"` (the channel the payload names: its sender's home channel, so the launch profile's
config names no tenant's channel). Without a platform it delivers to Hermes' log and the phase judges the turns only.

Two rounds, every post signed (`X-Webhook-Signature-V2`, and V1 for older releases) and carrying its sender's
`webhook_payload` canary and a mark of its own, so the provider requests its turn caused are counted wherever they
land:

1. `own`: every tenant posts to its own route under its own profile's URL. The near miss: a turn on its own
   provider, its reply posted by its own bot with its own token in its own home channel. A turn on another tenant's
   provider is a `profile_bleed` (canary kind `webhook_turn`);
2. `foreign`: every tenant's route and secret (its ring neighbour's) under another profile's URL. It must be
   refused; a turn in that profile (or the post accepted there with no turn anywhere) is a `profile_bleed` from the
   route's tenant (`webhook_route`): that tenant ran another profile's agent. A turn in the route's own profile is
   none.

In both rounds a reply of a profile's turn posted with another tenant's token is a `profile_bleed` to that tenant
(`webhook_bot` for the launch profile's bot, `webhook_borrowed_bot` for another's: the launch profile has none on the
platform, `--unset launch:PLATFORM.token`), and one posted in another tenant's channel a `profile_bleed` to it
(`webhook_channel`). The entry point of all of them is `webhook`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.capture.proxy import free_port
from harness.core.findings import Finding
from harness.core.registry import Tenant, new_tag
from harness.drive.battery import neighbour
from harness.drive.context import Context
from harness.drive.hermes.agent import TurnResult
from harness.drive.phases.attachments import kinds, platforms, reply_of, stub_of
from harness.drive.phases.base import OPT_IN, PhaseRun, PhaseSpec
from harness.drive.services import SERVICES
from harness.drive.surface import Plant, PlantContext, Setup, edit_config

NAME = "webhooks"
PAYLOAD = "webhook_payload"  # the canary kind each tenant's posts carry (minted when the phase runs)
SECRET = "webhook_secret_"  # + tenant: the launch profile's canary kind of that tenant's route secret
PROMPT = "{text}"
QUIET = 12.0  # how long a round waits for turns when none is owed
IDLE = 20.0  # a round ends when no stub has heard from Hermes for this long
UP = 30.0  # how long the launch profile's listener has to answer /health
#: The canary kinds of a reply's crossings (their findings name the platform it was delivered on).
DELIVERED = ("webhook_bot", "webhook_borrowed_bot", "webhook_channel")


def route_name(tenant: str) -> str:
    """The name of `tenant`'s route in the launch profile's config."""
    return f"tenancy-{tenant}"


def platform(ctx: Context) -> str | None:
    """The messaging platform the routes deliver to: the first the run drives (None: Hermes' log)."""
    return next(iter(platforms(ctx)), None)


def secret(ctx: Context, tenant: str) -> str:
    """The secret of `tenant`'s route: a canary of the launch profile's (its config holds every route), minted once."""
    launch = ctx.sandbox.launch
    kind = SECRET + tenant
    have = ctx.registry[launch].canaries.get(kind)
    if have:
        return have
    value = f"webhooksecret-{launch}-{tenant}-{new_tag()}"
    ctx.mint(launch, kind, value)
    return value


def settings(ctx: Context, tenant: str) -> Setup:
    """The launch profile's webhook listener on a free loopback port, with a route per tenant."""
    if tenant != ctx.sandbox.launch:
        return Setup()
    target = platform(ctx)
    deliver = {"deliver": kinds(target).deliver, "deliver_extra": {"chat_id": "{channel}"}} if target else {}
    routes = {route_name(t): {"secret": secret(ctx, t), "prompt": PROMPT, "deliver": "log", "profile": t, **deliver}
              for t in ctx.registry.names()}
    return Setup(config={"platforms": {"webhook": {"enabled": True, "extra": {
        "host": "127.0.0.1", "port": free_port(), "routes": routes}}}})


@dataclass(frozen=True)
class Post:
    """One signed post: the profile whose URL it goes to, the tenant whose route, secret and payload it carries (the
    same one: round `own`; another: round `foreign`) and its mark."""

    profile: str
    sender: str
    mark: str

    @property
    def own(self) -> bool:
        return self.profile == self.sender

    def path(self, launch: str) -> str:
        where = "" if self.profile == launch else f"/p/{self.profile}"
        return f"{where}/webhooks/{route_name(self.sender)}"


def _listener(ctx: Context) -> int:
    """The port of the launch profile's webhook listener, as its config says (0: none)."""
    cfg = yaml.safe_load((ctx.sandbox.home_of(ctx.sandbox.launch) / "config.yaml").read_text(encoding="utf-8"))
    return int((((cfg.get("platforms") or {}).get("webhook") or {}).get("extra") or {}).get("port") or 0)


def _http(port: int, method: str, path: str, body: bytes | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """(status, parsed JSON or text) of one request to the listener; 0 when the connection failed."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except OSError:
        return 0, ""
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode("utf-8", "replace")


def signed(secret_value: str, body: bytes, now: int) -> dict[str, str]:
    """Hermes' generic signature headers: V2, HMAC-SHA256 of `<timestamp>.<body>` (0.19.0, which then ignores V1), and
    V1, of the body alone (what releases before it check)."""
    key = secret_value.encode()
    return {"content-type": "application/json", "x-webhook-timestamp": str(now),
            "x-webhook-signature-v2": hmac.new(key, f"{now}.".encode() + body, hashlib.sha256).hexdigest(),
            "x-webhook-signature": hmac.new(key, body, hashlib.sha256).hexdigest()}


def _send(ctx: Context, port: int, post: Post) -> int:
    """Post `post`'s payload, signed with its sender's route secret; its HTTP status (both sides in the RPC log)."""
    t, target = ctx.registry[post.sender], platform(ctx)
    payload = {"text": f"Hello ({post.mark}) {t.canaries[PAYLOAD]}",
               **({"channel": t.canaries[kinds(target).channel]} if target else {})}
    body = json.dumps(payload).encode()
    path = post.path(ctx.sandbox.launch)
    log = ctx.rpc_log(NAME)
    log.write("out", post.sender, {"method": "POST", "path": path, "body": payload})
    headers = {**signed(secret(ctx, post.sender), body, int(time.time())), "x-request-id": f"tenancy-{post.mark}"}
    status, answer = _http(port, "POST", path, body, headers)
    log.write("in", post.sender, {"status": status, "path": path, "body": answer})
    return status


def turns(ctx: Context, mark: str) -> dict[str, int]:
    """Every tenant's provider requests that carry `mark` (the post's turn, wherever it ran)."""
    needle = f"({mark})".encode()
    return {n: sum(needle in r.body for r in s.snapshot()) for n, s in ctx.stubs.items()}


def replies(ctx: Context, profile: str, since: float) -> list[tuple[str, dict[str, Any]]]:
    """(server's tenant, post) of every reply of `profile`'s agent at any tenant's server of the routes' platform."""
    target = platform(ctx)
    if target is None:
        return []
    return [(o, p) for o in ctx.registry.names() for p in stub_of(ctx, o, target).posts_since(since)
            if reply_of(profile, p)]


def _owner(ctx: Context, kind: str, value: str) -> str | None:
    """The tenant whose canary of `kind` is `value`."""
    return next((t.name for t in ctx.registry if str(t.canaries.get(kind)) == str(value)), None)


def _keys(t: Tenant, target: str) -> set[str]:
    """Every credential of `t`'s on `target` (a keyless platform's: the identity its calls name)."""
    own = t.canaries.get(SERVICES[target].credential)
    return {*(t.credentials(target) if target in t.services else ()), *([own] if own else [])}


def _bot(ctx: Context, target: str, token: str) -> str | None:
    """The tenant whose credential on `target` a post came with."""
    return next((t.name for t in ctx.registry if token in _keys(t, target)), None)


def delivery_bleeds(ctx: Context, post: Post, profile: str, since: float) -> Iterator[Finding]:
    """A `profile_bleed` for every reply of `profile`'s turn posted with another tenant's token (`webhook_bot`: the
    launch profile's; `webhook_borrowed_bot`: another's) or in another tenant's channel (`webhook_channel`)."""
    target = platform(ctx)
    assert target is not None
    for server, p in replies(ctx, profile, since):
        bot = _bot(ctx, target, p["token"]) or server
        if bot != profile:
            kind = "webhook_bot" if bot == ctx.sandbox.launch else "webhook_borrowed_bot"
            yield _finding(ctx, post, profile, bot, kind, f"a post at {server}'s {target} server with {bot}'s token",
                           f"{profile}'s webhook reply went out through {bot}'s {target} bot")
        channel = _owner(ctx, kinds(target).channel, p["channel_id"])
        if channel is not None and channel != profile:
            yield _finding(ctx, post, profile, channel, "webhook_channel",
                           f"a post at {server}'s {target} server in {channel}'s channel",
                           f"{profile}'s webhook reply was posted in {channel}'s {target} channel")


def _finding(ctx: Context, post: Post, victim: str, seen_in: str, canary: str, evidence: str,
             detail: str) -> Finding:
    """A crossing of `post` (a delivery's names the platform)."""
    return Finding("profile_bleed", victim, seen_in, canary, "rpc",
                   f"gateway:webhook {post.path(ctx.sandbox.launch)}", "plain", f"{post.mark}: {evidence}",
                   scenario=ctx.scenario, phase=NAME, service=platform(ctx) if canary in DELIVERED else None,
                   detail=detail)


def judge(ctx: Context, post: Post, status: int, since: float, seconds: float) -> None:
    """The findings and the step of one post, its turns counted and its replies in."""
    ran = turns(ctx, post.mark)
    for other, n in ran.items():  # a turn neither in the URL's profile nor (a route bound to it) its sender's
        if n and other not in (post.profile, post.sender):
            ctx.findings.append(_finding(ctx, post, post.sender, other, "webhook_turn", f"{n} request(s) at {other}",
                                         f"{post.sender}'s webhook post ran a turn on {other}'s provider"))
    if not post.own and (ran[post.profile] or (status == 202 and not any(ran.values()))):  # accepted, or ran, there
        ctx.findings.append(_finding(
            ctx, post, post.profile, post.sender, "webhook_route",
            f"HTTP {status}, {ran[post.profile]} request(s) at {post.profile}",
            f"{post.sender}'s route and secret ran a turn in {post.profile}'s profile"))
    if platform(ctx) is not None:
        for profile in (n for n, count in ran.items() if count):
            ctx.findings.extend(delivery_bleeds(ctx, post, profile, since))
    driver = f"webhook {platform(ctx) or 'log'}"
    if not post.own:
        ctx.record(TurnResult(post.profile, driver, True, seconds, f"{post.sender}'s route: HTTP {status}, "
                              f"{ran[post.profile]} request(s)"), NAME, snapshot=False)
        return
    ok, detail = _own(ctx, post, status, ran, since)
    ctx.record(TurnResult(post.profile, driver, ok, seconds, detail), NAME,
               snapshot=False)  # no env probe: a webhook turn is offered no terminal (`hermes-webhook` toolset)


def _own(ctx: Context, post: Post, status: int, ran: dict[str, int], since: float) -> tuple[bool, str]:
    """Whether a tenant's post to its own route got its turn on its own provider and, with a platform, its reply
    through its own bot in its own home channel (the near miss); why not."""
    t, target = ctx.registry[post.profile], platform(ctx)
    if status != 202 or not ran[t.name]:
        return False, f"its own route: HTTP {status}, {ran[t.name]} request(s) on its provider"
    if target is None:
        return True, ""
    home = str(t.canaries[kinds(target).channel])
    mine = [p for server, p in replies(ctx, t.name, since) if server == t.name
            and p["token"] in _keys(t, target)
            and str(p["channel_id"]) == home]
    if mine:
        return True, ""
    if ctx.relaxed(t.name, target, "answered"):
        return True, f"no reply through its own {target} bot, as it leaves {', '.join(ctx.unset_by(t.name))} unset"
    elsewhere = sorted({server for server, _ in replies(ctx, t.name, since)})
    return False, f"its reply never reached its own {target} bot (posted at: {', '.join(elsewhere) or 'none'})"


def _round(ctx: Context, port: int, posts: list[Post]) -> None:
    """Send every post at once, wait until each accepted one's turn replied (with no platform: reached a provider)
    or Hermes fell idle, then judge each."""
    since, started = time.time(), time.monotonic()
    status = {p: _send(ctx, port, p) for p in posts}
    accepted = [p for p in posts if status[p] == 202]

    def done(p: Post) -> bool:
        if platform(ctx) is None:
            return any(turns(ctx, p.mark).values())
        return bool(replies(ctx, p.profile, since))

    deadline = started + (ctx.opts.timeout if accepted else QUIET)
    while time.monotonic() < deadline:
        if accepted and all(done(p) for p in accepted):
            break
        if time.monotonic() - started > QUIET and ctx.idle_seconds() > IDLE:
            break  # a turn Hermes dropped: nothing more is coming
        time.sleep(0.25)
    ctx.settle(quiet=1.0, longest=10.0)
    for p in posts:
        judge(ctx, p, status[p], since, time.monotonic() - started)


def run(r: PhaseRun) -> None:
    """The phase: see the module's docstring."""
    ctx = r.ctx
    port = _listener(ctx)
    deadline = time.monotonic() + UP
    while port and _http(port, "GET", "/health")[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.5)
    if not port or _http(port, "GET", "/health")[0] != 200:
        ctx.record(TurnResult(ctx.sandbox.launch, "webhook", False, UP, "the launch profile's webhook listener "
                              f"(port {port}) never answered /health"), NAME, snapshot=False)
        return
    for t in ctx.registry:
        ctx.mint(t.name, PAYLOAD, f"webhookpayload-{t.name}-{new_tag()}")
    names = ctx.registry.names()
    marks = iter(f"hook{n}" for n in range(1, 2 * len(names) + 1))
    _round(ctx, port, [Post(n, n, next(marks)) for n in names])
    _round(ctx, port, [Post(n, neighbour(ctx, n), next(marks)) for n in names])


def _prompt(c: PlantContext) -> None:
    """The donor's `soul` canary in the prompt of the target's route (the launch profile's config holds every route):
    the target's own post then carries it to the target's provider, a `request_leak` there."""
    def edit(cfg: dict) -> None:
        route = cfg["platforms"]["webhook"]["extra"]["routes"][route_name(c.target.name)]
        route["prompt"] = f"{PROMPT} {c.donor.canaries['soul']}"
    edit_config(Path(str(c.donor.home)), edit)


PHASE = PhaseSpec(NAME, "every profile's webhook route of the launch profile's listener: its turn in its own "
                  "profile, its reply through its own bot in its own channel; another tenant's route refused",
                  rank=135, doors=("gateway",), selection=OPT_IN, way="webhooks", plant="webhook-prompt",
                  settings=settings, run=run, plants={"webhook-prompt": Plant(_prompt, frozenset({"request_leak"}))})

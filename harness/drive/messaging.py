"""The `messaging` phase of the gateway door: one Mattermost bot per profile (service `mattermost`), every bot
on its own tenant's server with its own token; each profile allows its own user and its lead
(`MATTERMOST_ALLOWED_USERS`), and its own channel and its lead channel (`MATTERMOST_ALLOWED_CHANNELS`). A
lead and a lead channel are no canaries: the harness sends them to every bot.

Once every bot has authenticated on its websocket, messages go to the bots in three rounds, each message
with a mark of its own in its text, so the provider requests it caused are counted wherever they land:

1. `refused`, before any turn: to every bot, a stranger's direct message, every other profile's lead's
   direct message, and the bot's own user writing in every other profile's lead channel. None may get an
   agent turn: a turn is `route_auth` for a stranger, else a `profile_bleed` (another profile's allowlist
   let the sender or the channel into this bot);
2. `answered`: every tenant's own user in its own channel (its `mattermost_post` canary in the text) and in
   its lead channel (mentioning its bot), and its lead's direct message (the near misses). Each must get an
   agent turn on its own provider and a reply in that channel posted by its own bot with its own token;
3. `refused` again, after the turns of round 2: what a turn changed in the process shows here.

A turn on another tenant's provider, or a reply of the tenant's at another tenant's server, is a
`profile_bleed`; a bot's websocket token that is not its tenant's a `wrong_key` (the proxy sees the REST
requests' keys itself, not the websocket's frames). The replies of round 2 name files to attach (`MEDIA:`):
`harness.drive.attachments`, which also judges the cron jobs' output posted through the bots (the gateway door).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, replace

from harness.core.findings import Finding
from harness.core.registry import Tenant
from harness.drive import attachments
from harness.drive.attachments import reply_of
from harness.drive.attachments import stub_of as _stub
from harness.drive.context import Context
from harness.drive.hermes import TurnResult
from harness.drive.services.mattermost import SERVICE as SPEC
from harness.drive.services.mattermost import bot_id, lead

SERVICE = SPEC.name
PHASE = "messaging"
DOORS = SPEC.doors  # the doors whose driver runs it: those that start the bots
SIGN_IN = 60.0  # how long every profile's bot has to sign in after the gateway started
CONNECT = "messaging-connect"  # the label of a bot's failed sign-in: a release without a bot per profile, not F25
QUIET = 12.0  # how long a refused round waits for turns it must not cause
IDLE = 20.0  # a round that must be answered ends when no stub has heard from Hermes for this long


@dataclass(frozen=True)
class Message:
    """One message to a bot: its tenant, sender and channel, whose allowlist names them (`by`: "" for a
    stranger), and whether it must get a turn."""

    tenant: str
    sender: str
    channel: str
    channel_type: str  # `D`: a direct message; `O`: in an open channel, mentioning the bot
    by: str
    answered: bool
    note: str = ""  # the tenant's `mattermost_post` canary, in its own user's message in its own channel
    mark: str = ""

    @property
    def allowlist(self) -> str:
        """The canary kind of its findings: the allowlist it tests (`MATTERMOST_ALLOWED_USERS` or `_CHANNELS`)."""
        return "allowed_users" if self.channel_type == "D" else "allowed_channels"

    @property
    def what(self) -> str:
        if not self.by:
            return "a stranger's direct message"
        who = "its own" if self.by == self.tenant else f"{self.by}'s"
        if self.channel_type == "D":
            return f"{who} lead's direct message"
        return f"a message in {who} {'lead channel' if self.channel.startswith('leadchannel-') else 'channel'}"

    def text(self) -> str:
        mention = f"@{bot_id(self.tenant)} " if self.channel_type == "O" else ""
        return f"{mention}Hello ({self.mark}) {self.note}".rstrip()


def enabled(ctx: Context) -> bool:
    return SERVICE in ctx.services()


def refused(ctx: Context, bots: list[str]) -> list[Message]:
    """The messages no bot may answer, to the bots of `bots`."""
    out = []
    for t in (ctx.registry[n] for n in bots):
        out.append(Message(t.name, f"stranger-{t.name}", f"dm-stranger-{t.name}", "D", "", False))
        for o in ctx.registry:
            if o.name != t.name:
                out += [Message(t.name, lead(o), f"dm-{lead(o)}-{t.name}", "D", o.name, False),
                        Message(t.name, t.canaries["mattermost_user"], lead(o, "leadchannel"), "O", o.name, False)]
    return out


def answered(ctx: Context, bots: list[str]) -> list[Message]:
    """The near misses, to the bots of `bots`."""
    return [m for t in (ctx.registry[n] for n in bots) for m in (
        Message(t.name, t.canaries["mattermost_user"], t.canaries["mattermost_channel"], "O", t.name, True,
                t.canaries["mattermost_post"]),
        Message(t.name, t.canaries["mattermost_user"], lead(t, "leadchannel"), "O", t.name, True),
        Message(t.name, lead(t), f"dm-{lead(t)}", "D", t.name, True))]


def run(ctx: Context) -> None:
    names = ctx.registry.names()
    started = time.monotonic()
    # every bot signed in somewhere (a bot pointed at another profile's server signs in there), or the time is up
    while sum(_stub(ctx, n).sign_ins() for n in names) < len(names) and time.monotonic() - started < SIGN_IN:
        time.sleep(0.2)
    bots = [n for n in names if _stub(ctx, n).connected()]
    for name in sorted(set(names) - set(bots)):
        ctx.record(TurnResult(name, "gateway", False, time.monotonic() - started,
                              "its Mattermost bot never authenticated on its websocket"), CONNECT, snapshot=False)
    marks = (f"mark{n}" for n in itertools.count(1))
    _exchange(ctx, [replace(m, mark=next(marks)) for m in refused(ctx, bots)], QUIET)
    attachments.script_media(ctx, True)  # the answered round's replies name files to attach
    try:
        since = time.time()
        _exchange(ctx, [replace(m, mark=next(marks)) for m in answered(ctx, bots)], ctx.opts.timeout)
    finally:
        attachments.script_media(ctx, False)
    until = time.time()
    _exchange(ctx, [replace(m, mark=next(marks)) for m in refused(ctx, bots)], QUIET)
    attachments.judge_media(ctx, since, until, time.monotonic() - started)  # after round 3: every upload landed
    ctx.findings.extend(_tokens(ctx))  # every sign-in of the phase, a bot's reconnection after a turn included


def _exchange(ctx: Context, messages: list[Message], wait: float) -> None:
    """Deliver every message at once, wait for the replies the messages must get (at most `wait` seconds, or
    until Hermes has been idle for `IDLE`; all of `wait` when none must be answered), then judge each."""
    since, started = time.time(), time.monotonic()
    for m in messages:
        _stub(ctx, m.tenant).deliver(m.sender, m.channel, m.text(), m.channel_type)
    deadline = started + wait
    while time.monotonic() < deadline:
        if all(m.answered and _replies(ctx, m, since) for m in messages):
            break
        if any(m.answered for m in messages) and time.monotonic() - started > QUIET and ctx.idle_seconds() > IDLE:
            break  # a message Hermes dropped: nothing more is coming
        time.sleep(0.25)
    ctx.settle(quiet=1.0, longest=10.0)
    for m in messages:
        _judge(ctx, m, since, time.monotonic() - started)


def _turns(ctx: Context, m: Message) -> dict[str, int]:
    """Every tenant's provider requests that carry the message's mark (its turn, wherever it ran)."""
    mark = f"({m.mark})".encode()  # in parentheses: `mark1` is a prefix of `mark13`
    return {n: sum(mark in r.body for r in s.snapshot()) for n, s in ctx.stubs.items()}


def _replies(ctx: Context, m: Message, since: float) -> list[dict]:
    """The agent's replies in the message's channel."""
    return [p for p in _stub(ctx, m.tenant).posts_in(m.channel, since) if reply_of(m.tenant, p)]


def _judge(ctx: Context, m: Message, since: float, seconds: float) -> None:
    turns = _turns(ctx, m)
    for other, n in turns.items():
        if other != m.tenant and n:
            ctx.findings.append(_finding(ctx, m, "profile_bleed", other, "message", f"{m.mark}: {n} at {other}",
                                         f"{m.what} to {m.tenant}'s bot ran a turn on {other}'s provider"))
    own = turns[m.tenant]
    if not m.answered:
        if own:
            kind, seen = ("profile_bleed", m.by) if m.by else ("route_auth", m.tenant)
            ctx.findings.append(_finding(ctx, m, kind, seen, m.allowlist, f"{m.mark}: {own} provider request(s)",
                                         f"{m.what} got an agent turn through {m.tenant}'s bot"))
        ctx.record(TurnResult(m.tenant, "gateway", True, seconds, f"{m.what}: {own} request(s)"), PHASE,
                   snapshot=False)
        return
    mine = _replies(ctx, m, since)
    key = ctx.registry[m.tenant].canaries["mattermost_key"]
    ok = bool(mine) and own > 0 and all(p["token"] == key for p in mine)
    ctx.record(TurnResult(m.tenant, "gateway", ok, seconds,
                          "" if ok else f"{m.what}: {len(mine)} reply(ies), {own} request(s)"), PHASE)
    others = [o.name for o in ctx.registry if o.name != m.tenant] if m.note else []  # once per tenant
    for other in others:  # its replies at every other server
        stray = [p for p in _stub(ctx, other).posts_since(since) if reply_of(m.tenant, p)]
        if stray:
            ctx.findings.append(_finding(ctx, m, "profile_bleed", other, "reply",
                                         f"POST /api/v4/posts at {other}'s server in "
                                         f"{ctx.matcher().redact_text(repr(stray[0]['channel_id']))}",
                                         f"{m.tenant}'s agent reply was posted at {other}'s server"))


def _finding(ctx: Context, m: Message, kind: str, seen_in: str, canary: str, evidence: str, detail: str) -> Finding:
    """A crossing of message `m` (the victim: its bot's tenant)."""
    where = f"gateway:mattermost {'direct' if m.channel_type == 'D' else 'channel'} message to {m.tenant}'s bot"
    return Finding(kind, m.tenant, seen_in, canary, "rpc", where, "plain", evidence, scenario=ctx.scenario,
                   phase=PHASE, service=SERVICE, detail=detail)


def _tokens(ctx: Context) -> list[Finding]:
    """`wrong_key` for every websocket authentication frame whose token is not its tenant's."""
    found = []
    for t in ctx.registry:
        for token in _stub(ctx, t.name).challenges:
            if token != t.canaries["mattermost_key"]:
                owner: Tenant | None = next((o for o in ctx.registry if o.canaries.get("mattermost_key") == token),
                                            None)
                found.append(Finding(
                    "wrong_key", owner.name if owner else t.name, t.name, "mattermost_key", "request",
                    f"gateway:mattermost {t.name}'s websocket authentication_challenge", "plain",
                    f"token <{owner.name if owner else 'unknown'}:mattermost_key>", scenario=ctx.scenario,
                    phase=PHASE, service=SERVICE,
                    detail=f"{t.name}'s bot authenticated its websocket with "
                           f"{'another tenant' if owner else 'an unknown'}'s token"))
    return found

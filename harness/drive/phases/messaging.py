"""The `messaging` phase of the gateway door: a bot per profile on every messaging platform the run drives (a module
of `harness.drive.platforms`), each bot on its own tenant's server with its own token; each profile allows its own
user and its lead, and its own channel and its lead channel. A lead and a lead channel are no canaries: the harness
sends them to every bot.

Once every bot has signed in, messages go to the bots of every platform at once, in three rounds, each message
with a mark of its own in its text, so the provider requests it caused are counted wherever they land:

1. `refused`, before any turn: to every bot, a stranger's direct message, every other profile's lead's
   direct message, and the bot's own user writing in every other profile's lead channel. None may get an
   agent turn: a turn is `route_auth` for a stranger, else a `profile_bleed` (another profile's allowlist
   let the sender or the channel into this bot);
2. `answered`: every tenant's own user in its own channel (its platform `post` canary in the text) and in
   its lead channel (addressing its bot), and its lead's direct message (the near misses). Each must get an
   agent turn on its own provider and a reply in that channel posted by its own bot with its own token;
3. `refused` again, after the turns of round 2: what a turn changed in the process shows here.

A tenant that leaves an allowlist unset (`--unset`, `surface.Unset`) gets a stranger's message in a channel nobody
allows too, and need not refuse strangers or answer its own users: another tenant's user or channel that its bot
admits is then a crossing only while the stranger of the same kind (a direct message, a channel) is refused, since
then what admitted it was another profile's allowlist, read from the process environment.

A turn on another tenant's provider, or a reply of the tenant's at another tenant's server, is a
`profile_bleed`; a bot's sign-in with a token that is not its tenant's a `wrong_key` (the proxy sees the REST
requests' keys itself, not what a platform's websocket frames carry). The replies of round 2 name files to attach
(`MEDIA:`): `harness.drive.phases.attachments`, which also judges the cron jobs' output posted through the bots (the
gateway door).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from harness.core.findings import Finding
from harness.core.registry import Tenant
from harness.drive.context import Context
from harness.drive.hermes.agent import TurnResult
from harness.drive.phases import attachments
from harness.drive.phases.attachments import NAME, platforms, reply_of, stub_of
from harness.drive.phases.base import PLATFORMS, PhaseSpec
from harness.drive.platforms.base import lead
from harness.drive.services import SERVICES

SIGN_IN = 60.0  # how long every profile's bot has to sign in after the gateway started
#: The gateway starts every profile's bots one after another: once every platform has a bot signed in and no other
#: has for this long, the bots still missing never start (Hermes 0.19.0 refuses a secondary ntfy bot, F55)
#: or signed in at another profile's server (the launch profile's: email F51, IRC F52).
SETTLED = 20.0
CONNECT = "messaging-connect"  # the label of a bot's failed sign-in (`messaging-connect:PLATFORM`): not F25
UNKNOWN = "messaging-api"  # the label of a server's requests it does not know (the stub lacks what Hermes calls)
QUIET = 12.0  # how long a refused round waits for turns it must not cause
IDLE = 20.0  # a round that must be answered ends when no stub has heard from Hermes for this long


@dataclass(frozen=True)
class Message:
    """One message to a bot: its platform and tenant, sender and channel, whose allowlist names them (`by`: "" for a
    stranger), and whether it must get a turn."""

    platform: str
    tenant: str
    sender: str
    channel: str
    channel_type: str  # `D`: a direct message; `O`: in a channel, addressing the bot
    by: str
    answered: bool
    note: str = ""  # the tenant's `post` canary, in its own user's message in its own channel
    mark: str = ""

    @property
    def allowlist(self) -> str:
        """The canary kind of its findings: the allowlist it tests (the allowed users or the allowed channels)."""
        return "allowed_users" if self.channel_type == "D" else "allowed_channels"

    @property
    def what(self) -> str:
        if not self.by:
            return "a stranger's direct message" if self.channel_type == "D" else "a message in a channel nobody allows"
        who = "its own" if self.by == self.tenant else f"{self.by}'s"
        if self.channel_type == "D":
            return f"{who} {'user' if self.note else 'lead'}'s direct message"
        return f"a message in {who} {'lead channel' if self.channel.startswith('leadchannel-') else 'channel'}"


def enabled(ctx: Context) -> bool:
    return bool(platforms(ctx))


def refused(ctx: Context, platform: str, bots: list[str]) -> list[Message]:
    """The messages no bot may answer, to the bots of `bots` on `platform`."""
    kinds = SERVICES[platform].messaging
    assert kinds is not None
    out = []
    for t in (ctx.registry[n] for n in bots):
        out.append(Message(platform, t.name, f"stranger-{t.name}", f"dm-stranger-{t.name}", "D", "", False))
        if ctx.relaxed(t.name, platform, "strangers"):
            out.append(Message(platform, t.name, t.canaries[kinds.user], f"channel-stranger-{t.name}", "O", "",
                               False))
        for o in ctx.registry:
            if o.name != t.name:
                out += [Message(platform, t.name, lead(o, kinds.user), f"dm-{lead(o, kinds.user)}-{t.name}", "D",
                                o.name, False),
                        Message(platform, t.name, t.canaries[kinds.user], lead(o, kinds.user, "leadchannel"), "O",
                                o.name, False)]
    return out if kinds.channels else [m for m in out if m.channel_type == "D"]  # no channel allowlist to test


def answered(ctx: Context, platform: str, bots: list[str]) -> list[Message]:
    """The near misses, to the bots of `bots` on `platform`."""
    kinds = SERVICES[platform].messaging
    assert kinds is not None
    own = "O" if kinds.channels else "D"  # without channels: its own user's message in a conversation of its own
    return [m for t in (ctx.registry[n] for n in bots) for m in (
        Message(platform, t.name, t.canaries[kinds.user], t.canaries[kinds.channel], own, t.name, True,
                t.canaries[kinds.post]),
        Message(platform, t.name, t.canaries[kinds.user], lead(t, kinds.user, "leadchannel"), "O", t.name, True),
        Message(platform, t.name, lead(t, kinds.user), f"dm-{lead(t, kinds.user)}", "D", t.name, True))
        if kinds.channels or m.channel_type == "D"]


def _signed_in(ctx: Context) -> dict[str, list[str]]:
    """Wait until every bot of every platform signed in somewhere (a bot pointed at another profile's server signs
    in there), or the time is up, or every platform has a bot signed in and none has signed in for `SETTLED`; the
    bots of each platform that are connected at their own server. A bot that never signed in at its own server is a
    failed step (`messaging-connect:PLATFORM`) that names where the platform's sign-ins went instead."""
    names, on = ctx.registry.names(), platforms(ctx)
    started = last = time.monotonic()
    seen = 0
    while time.monotonic() - started < SIGN_IN:
        counts = [sum(stub_of(ctx, n, p).sign_ins() for n in names) for p in on]
        if all(c >= len(names) for c in counts) or (all(counts) and time.monotonic() - last > SETTLED):
            break
        if sum(counts) != seen:
            seen, last = sum(counts), time.monotonic()
        time.sleep(0.2)
    bots = {p: [n for n in names if stub_of(ctx, n, p).connected()] for p in on}
    for p in on:
        for name in sorted(set(names) - set(bots[p])):
            if not ctx.relaxed(name, p, "sign-in"):  # else it leaves what it signs in with unset
                ctx.record(TurnResult(name, p, False, time.monotonic() - started,
                                      f"its {p} bot never signed in at its server{_elsewhere(ctx, p)}"),
                           f"{CONNECT}:{p}", snapshot=False)
    return bots


def _elsewhere(ctx: Context, platform: str) -> str:
    """Where the platform's sign-ins went, and whose credentials they presented (`; sign-ins at default's: 3
    (default's credential)`)."""
    credential = SERVICES[platform].credential
    owners = {t.canaries[credential]: t.name for t in ctx.registry}
    parts = []
    for t in ctx.registry:
        tokens = list(stub_of(ctx, t.name, platform).challenges)
        if tokens:
            whose = sorted({f"{owners.get(k, 'an unknown')}'s" for k in tokens})
            parts.append(f"{t.name}'s: {len(tokens)} ({', '.join(whose)} credential)")
    return f"; sign-ins at {'; '.join(parts)}" if parts else "; no sign-in at any tenant's server"


def run(ctx: Context) -> None:
    started = time.monotonic()
    bots = _signed_in(ctx)
    marks = (f"mark{n}" for n in itertools.count(1))

    def round_of(make: Callable[[Context, str, list[str]], list[Message]]) -> list[Message]:
        """One round's messages on every platform, each with a mark of its own."""
        return [replace(m, mark=next(marks)) for p, on in bots.items() for m in make(ctx, p, on)]

    _exchange(ctx, round_of(refused), QUIET)
    attachments.script_media(ctx, True)  # the answered round's replies name files to attach
    try:
        since = time.time()
        _exchange(ctx, round_of(answered), ctx.opts.timeout)
    finally:
        attachments.script_media(ctx, False)
    until = time.time()
    _exchange(ctx, round_of(refused), QUIET)
    attachments.judge_media(ctx, since, until, time.monotonic() - started)  # after round 3: every upload landed
    ctx.findings.extend(_tokens(ctx))  # every sign-in of the phase, a bot's reconnection after a turn included
    _unknown(ctx)


def _text(ctx: Context, m: Message) -> str:
    mention = stub_of(ctx, m.tenant, m.platform).mention() if m.channel_type == "O" else ""
    return f"{mention}Hello ({m.mark}) {m.note}".rstrip()


def _exchange(ctx: Context, messages: list[Message], wait: float) -> None:
    """Deliver every message at once, wait for the replies the messages must get (at most `wait` seconds, or
    until Hermes has been idle for `IDLE`; all of `wait` when none must be answered), then judge each."""
    since, started = time.time(), time.monotonic()
    for m in messages:
        stub_of(ctx, m.tenant, m.platform).deliver(m.sender, m.channel, _text(ctx, m), m.channel_type)
    deadline = started + wait
    while time.monotonic() < deadline:
        if all(m.answered and _replies(ctx, m, since) for m in messages):
            break
        if any(m.answered for m in messages) and time.monotonic() - started > QUIET and ctx.idle_seconds() > IDLE:
            break  # a message Hermes dropped: nothing more is coming
        time.sleep(0.25)
    ctx.settle(quiet=1.0, longest=10.0)
    turns = {m: _turns(ctx, m) for m in messages}
    opened = {(m.platform, m.tenant, m.channel_type) for m in messages if not m.by and turns[m][m.tenant]}
    for m in messages:
        _judge(ctx, m, turns[m], since, time.monotonic() - started, opened)


def _turns(ctx: Context, m: Message) -> dict[str, int]:
    """Every tenant's provider requests that carry the message's mark (its turn, wherever it ran)."""
    mark = f"({m.mark})".encode()  # in parentheses: `mark1` is a prefix of `mark13`
    return {n: sum(mark in r.body for r in s.snapshot()) for n, s in ctx.stubs.items()}


def _replies(ctx: Context, m: Message, since: float) -> list[dict]:
    """The agent's replies in the message's channel."""
    return [p for p in stub_of(ctx, m.tenant, m.platform).posts_in(m.channel, since) if reply_of(m.tenant, p)]


def _judge(ctx: Context, m: Message, turns: dict[str, int], since: float, seconds: float,
           opened: set[tuple[str, str, str]]) -> None:
    """Judge message `m` by the turns it caused (`turns`: every tenant's provider requests that carry its mark);
    `opened`: (platform, tenant, `D` or `O`) of the bots a stranger's message of that kind got a turn through."""
    for other, n in turns.items():
        if other != m.tenant and n:
            ctx.findings.append(_finding(ctx, m, "profile_bleed", other, "message", f"{m.mark}: {n} at {other}",
                                         f"{m.what} to {m.tenant}'s bot ran a turn on {other}'s provider"))
    own = turns[m.tenant]
    if not m.answered:
        open_to_all = (m.platform, m.tenant, m.channel_type) in opened
        if own and ctx.relaxed(m.tenant, m.platform, "strangers") and (not m.by or open_to_all):
            own = 0  # an allowlist it leaves unset admits anyone: not another profile's at work
        if own:
            kind, seen = ("profile_bleed", m.by) if m.by else ("route_auth", m.tenant)
            unset = ctx.relaxed(m.tenant, m.platform, "strangers")  # another profile's allowlist in place of its own
            ctx.findings.append(_finding(ctx, m, kind, seen, m.allowlist + ("_fallback" if unset else ""),
                                         f"{m.mark}: {own} provider request(s)",
                                         f"{m.what} got an agent turn through {m.tenant}'s bot"
                                         + (f", which leaves {', '.join(ctx.unset_by(m.tenant))} unset" if unset
                                            else "")))
        marked = stub_of(ctx, m.tenant, m.platform).reactions_to(m.sender, m.channel, since) if m.by else []
        if marked:  # the bot showed another profile's user it took the message (Signal's 👀): that profile's list
            ctx.findings.append(_finding(ctx, m, "profile_bleed", m.by, "reactions",
                                         f"{m.mark}: reaction(s) {' '.join(r['emoji'] for r in marked)}",
                                         f"{m.what} got a reaction from {m.tenant}'s bot"))
        ctx.record(TurnResult(m.tenant, m.platform, True, seconds, f"{m.what}: {own} request(s)"), NAME,
                   snapshot=False)
        return
    mine = _replies(ctx, m, since)
    key = ctx.registry[m.tenant].canaries[SERVICES[m.platform].credential]
    ok = bool(mine) and own > 0 and all(p["token"] == key for p in mine)
    excused = not mine and not own and ctx.relaxed(m.tenant, m.platform, "answered")
    detail = f"{m.what}: not answered, as it leaves {', '.join(ctx.unset_by(m.tenant))} unset" if excused else ""
    ctx.record(TurnResult(m.tenant, m.platform, ok or excused, seconds,
                          detail if ok or excused else f"{m.what}: {len(mine)} reply(ies), {own} request(s)"), NAME,
               snapshot=not excused)
    others = [o.name for o in ctx.registry if o.name != m.tenant] if m.note else []  # once per tenant
    for other in others:  # its replies at every other server
        stray = [p for p in stub_of(ctx, other, m.platform).posts_since(since) if reply_of(m.tenant, p)]
        if stray:
            ctx.findings.append(_finding(ctx, m, "profile_bleed", other, "reply",
                                         f"a post at {other}'s server in "
                                         f"{ctx.matcher().redact_text(repr(stray[0]['channel_id']))}",
                                         f"{m.tenant}'s agent reply was posted at {other}'s server"))


def _own(t: Tenant, platform: str) -> tuple[str, ...]:
    """What `t`'s bot on `platform` may sign in with: its credentials there, or on a platform whose protocol carries
    none (`keyless`) the identity its calls name."""
    return t.credentials(platform) or (t.canaries[SERVICES[platform].credential],)


def _finding(ctx: Context, m: Message, kind: str, seen_in: str, canary: str, evidence: str, detail: str) -> Finding:
    """A crossing of message `m` (the victim: its bot's tenant)."""
    where = f"gateway:{m.platform} {'direct' if m.channel_type == 'D' else 'channel'} message to {m.tenant}'s bot"
    return Finding(kind, m.tenant, seen_in, canary, "rpc", where, "plain", evidence, scenario=ctx.scenario,
                   phase=NAME, service=m.platform, detail=detail)


def _tokens(ctx: Context) -> list[Finding]:
    """`wrong_key` for every sign-in whose token is not one of its tenant's for the platform, on every platform."""
    found = []
    for platform in platforms(ctx):
        credential = SERVICES[platform].credential
        for t in ctx.registry:
            for token in stub_of(ctx, t.name, platform).challenges:
                if token not in _own(t, platform):
                    owner: Tenant | None = next((o for o in ctx.registry if token in _own(o, platform)), None)
                    found.append(Finding(
                        "wrong_key", owner.name if owner else t.name, t.name, credential, "request",
                        f"gateway:{platform} {t.name}'s sign-in", "plain",
                        f"token <{owner.name if owner else 'unknown'}:{credential}>", scenario=ctx.scenario,
                        phase=NAME, service=platform,
                        detail=f"{t.name}'s {platform} bot signed in with "
                               f"{'another tenant' if owner else 'an unknown'}'s token"))
    return found


def _own(t: Tenant, platform: str) -> tuple[str, ...]:
    """What `t`'s bot on `platform` may sign in with: its credentials there, or on a platform whose protocol carries
    none (`keyless`) the identity its calls name."""
    return t.credentials(platform) or (t.canaries[SERVICES[platform].credential],)


def _unknown(ctx: Context) -> None:
    """A failed step for every server that got requests it does not know (answered with the platform's error): what
    the bot wanted there was not shown, so the run cannot be clean."""
    for platform in platforms(ctx):
        for t in ctx.registry:
            asked = sorted(set(stub_of(ctx, t.name, platform).unknown))
            if asked:
                ctx.record(TurnResult(t.name, platform, False, 0.0, f"its {platform} server does not know "
                                      f"{len(asked)} request(s) of the bot's: {', '.join(asked)[:200]}"),
                           UNKNOWN, snapshot=False)


PHASE = PhaseSpec(NAME, "a bot per profile on every messaging platform asked for: messages from its user, another "
                  "profile's user and a stranger, replies, attachments, cron deliveries", rank=130, doors=("gateway",),
                  selection=PLATFORMS, way="messaging platforms", plant="mattermost-server")

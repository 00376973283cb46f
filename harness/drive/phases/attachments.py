"""What the gateway delivers through a profile's bots besides their replies' text: the files a reply names
(`MEDIA:<path>` lines, which the gateway uploads to the platform and attaches to a post) and a cron job's output
(`deliver: <platform>`, the profile's home channel there). Part of the `messaging` phase, on every platform it drives.

In the phase's `answered` round every tenant's scripted model ends its reply with `MEDIA:` lines: its own media file
of every platform (`Messaging.media_file` in its home, holding its platform `file` canary: the near miss, which must
arrive at its own server with its own token), its ring neighbour's media files and its neighbour's `.env` (none of
which may leave through its bot: another tenant's bytes in an upload are a `request_leak` at the service, which the
flow scan reports, and an upload with another tenant's token a `wrong_key`). The paths are relative to the shared
HOME (`~/.hermes/profiles/NAME/...`), so the reply's text names no canary.

A cron job that fired (the `cron` phase, run after this one when the bots are on) must have posted its output
(`Cronjob Response: ...`, Hermes' wrapping) in its profile's home channel on the platform it delivers to, at its
profile's server with its profile's token; its output at another tenant's server is a `profile_bleed`.
"""

from __future__ import annotations

from typing import Any

from harness.core.findings import Finding
from harness.drive.battery import home_path, neighbour
from harness.drive.context import Context
from harness.drive.hermes.agent import TurnResult
from harness.drive.platforms.base import ChatStub
from harness.drive.services import SERVICES
from harness.drive.surface import Messaging

NAME = "messaging"
MEDIA = "media"  # the driver label of a tenant's attachment step on a platform (`step`)
CRON = "cron-delivery"  # the driver label of a tenant's cron delivery step on a platform (`step`)


def platforms(ctx: Context) -> list[str]:
    """The messaging platforms this run drives."""
    return [s for s in ctx.services() if SERVICES[s].messaging is not None]


def kinds(platform: str) -> Messaging:
    spec = SERVICES[platform].messaging
    assert spec is not None, f"{platform} is no messaging platform"
    return spec


def stub_of(ctx: Context, tenant: str, platform: str) -> ChatStub:
    stub = ctx.service_stubs[(tenant, platform)]
    assert isinstance(stub, ChatStub)
    return stub


def reply_of(tenant: str, post: dict[str, Any]) -> bool:
    """Whether a post is the agent's reply to `tenant` (or its cron job's output): the provider stub's `probe
    done for tenant NAME`, whose spaces Hermes' formatting may drop."""
    return f"tenant{tenant}" in post["message"].replace(" ", "")


def step(platform: str, label: str) -> str:
    """The driver label of a step on `platform` (every step of the phase names its platform, as its findings do)."""
    return f"{platform} {label}"


def media_lines(ctx: Context, tenant: str) -> str:
    """The `MEDIA:` lines of the tenant's replies: its own media file of every platform, its neighbour's, and its
    neighbour's `.env`."""
    other = neighbour(ctx, tenant)
    files = [kinds(p).media_file for p in platforms(ctx)]
    paths = [*(f"{home_path(ctx, tenant)}/{f}" for f in files), *(f"{home_path(ctx, other)}/{f}" for f in files),
             f"{home_path(ctx, other)}/.env"]
    return "\n".join(f"MEDIA:{path}" for path in paths)


def script_media(ctx: Context, on: bool) -> None:
    """Every tenant's model ends its replies with its `MEDIA:` lines (`on`), or no longer does."""
    for name in ctx.registry.names():
        ctx.stubs[name].say(media_lines(ctx, name) if on else "")


def judge_media(ctx: Context, since: float, until: float, seconds: float) -> None:
    """Every tenant whose agent replied through its bot between `since` and `until` (the replies that name files)
    must have uploaded its own media file (as its home holds it: a plant may have changed it) there, with its own
    token (the near miss), on every platform that takes attachments; a tenant that got no reply then (a message
    refused, F25) has no step. A platform whose server reads an attachment from a path (`path`) has what it read
    scanned here: the proxy saw only the path."""
    for platform in platforms(ctx):
        if kinds(platform).attachments == "none":
            continue  # Hermes posts a notice instead of the file: what it posts is the flow scan's
        for t in ctx.registry:
            stub = stub_of(ctx, t.name, platform)
            if kinds(platform).attachments == "path":
                ctx.findings.extend(read_leaks(ctx, platform, t.name, stub.files_since(0.0)))
            if not any(reply_of(t.name, p) and p["time"] < until for p in stub.posts_since(since)):
                continue
            mine = (ctx.sandbox.home_of(t.name) / kinds(platform).media_file).read_bytes()
            key = t.canaries[SERVICES[platform].credential]
            own = [f for f in stub.files_since(since) if f["data"] == mine and f["token"] == key]
            attached = {fid for p in stub.posts_since(since) for fid in p["file_ids"]}
            ok = any(f["id"] in attached for f in own)
            ctx.record(TurnResult(t.name, step(platform, MEDIA), ok, seconds, "" if ok else
                                  f"its own {platform} MEDIA file: {len(own)} upload(s) with its token, none "
                                  "attached to a post"), NAME, snapshot=False)


def read_leaks(ctx: Context, platform: str, tenant: str, files: list[dict[str, Any]]) -> list[Finding]:
    """`request_leak`: another tenant's canary in a file the tenant's server read from a path its bot named (once
    per file, victim and canary kind); the tenant's own canaries are not."""
    found, matcher = [], ctx.matcher()
    for f in files:
        seen = set()
        for hit in matcher.find(f["data"], exclude=tenant):
            if (hit.tenant, hit.kind) in seen:
                continue
            seen.add((hit.tenant, hit.kind))
            found.append(Finding(
                "request_leak", hit.tenant, tenant, hit.kind, "request",
                f"gateway:{platform} attachment {f['name']!r} {tenant}'s server read", hit.encoding,
                matcher.snippet(f["data"], hit), scenario=ctx.scenario, phase=NAME,
                service=platform, detail=f"{hit.tenant}'s {hit.kind} in a file {tenant}'s bot attached"))
    return found


def cron_output(tenant: str, post: dict[str, Any]) -> bool:
    """Whether a post is the output of `tenant`'s cron job."""
    return "CronjobResponse" in post["message"].replace(" ", "") and reply_of(tenant, post)


def judge_cron(ctx: Context, platform: str) -> None:
    """Every tenant whose cron job fired: its output posted in its home channel on `platform` (the one its job
    delivers to) at its own server with its own token; its output at another tenant's server is a `profile_bleed`.
    A job that never fired (F6) is the `cron` phase's shortfall and has no step here."""
    fired = {e["tenant"] for e in ctx.timeline if e["phase"] == "cron" and e["ok"] and e["scenario"] == ctx.scenario}
    for t in ctx.registry:
        if t.name not in fired:
            continue
        for o in ctx.registry:
            stray = [p for p in stub_of(ctx, o.name, platform).posts_since(0.0) if cron_output(t.name, p)]
            if o.name != t.name and stray:
                ctx.findings.append(Finding(
                    "profile_bleed", t.name, o.name, "cron_delivery", "rpc",
                    f"gateway:{platform} cron delivery of {t.name}'s job", "plain",
                    f"a post at {o.name}'s server", scenario=ctx.scenario, phase=NAME,
                    service=platform, detail=f"{t.name}'s cron output was posted at {o.name}'s server"))
        if ctx.relaxed(t.name, platform, "home"):
            continue  # it leaves its home channel, or its bot, unset: no delivery is owed
        mine = [p for p in stub_of(ctx, t.name, platform).posts_since(0.0) if cron_output(t.name, p)]
        key, home = t.canaries[SERVICES[platform].credential], t.canaries[kinds(platform).channel]
        ok = any(p["channel_id"] == home and p["token"] == key for p in mine)
        ctx.record(TurnResult(t.name, step(platform, CRON), ok, 0.0, "" if ok else
                              f"its cron output: {len(mine)} post(s) at its {platform} server, none in its home "
                              "channel with its token"), NAME, snapshot=False)

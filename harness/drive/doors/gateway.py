"""The `gateway` front door: `hermes gateway run` with multiplexed profiles and the OpenAI-compatible API server.

Phases: `cron` (when asked for; first and alone, as in `rpc_doors`), `route-auth` (every tenant's
API-server key tried on every tenant's route: `route_auth`), `messaging` (when a messaging platform is on:
a bot per profile on each, `harness.drive.phases.messaging`), `turns` (the first running the tool battery's
write plan), `lookups` (every tenant asks the tools for another tenant's identifiers), the opt-in phases the
gateway runs (`phases.run_at`: `redaction`) and `profiles`.

With the bots on, every cron job delivers to its profile's home channel on the first platform driven and is due
at the ticker's second tick,
so `cron` runs after `messaging`: a job's turn before the secondary bots' would load the launch profile's `.env`
first and hide F25 (docs/hermes-findings.md); the jobs' deliveries are then judged (`attachments.judge_cron`).
"""

from __future__ import annotations

import json
import time

from harness.core.findings import Finding
from harness.core.protocol import PROMPT, placeholder
from harness.drive import battery, phases
from harness.drive.context import Context
from harness.drive.doors.base import Door
from harness.drive.doors.gateway_client import GatewayBackend
from harness.drive.hermes.agent import TurnResult
from harness.drive.phases import attachments, messaging, wanted
from harness.drive.phases.base import PhaseRun
from harness.drive.phases.cron import seed_cron, wait_cron
from harness.drive.phases.profiles import profiles


def gateway(ctx: Context) -> None:
    launch = ctx.sandbox.launch
    names = ctx.registry.names()
    log = ctx.rpc_log("gateway")
    bots = attachments.platforms(ctx)
    if wanted(ctx, "cron"):  # with bots, every job's output goes to its profile's home channel, a tick later
        seed_cron(ctx, attachments.kinds(bots[0]).deliver if bots else "local", later=bool(bots))
    started = time.time()
    gw = GatewayBackend(ctx.hermes, ctx.gateway_port, log, ctx.out / "logs" / "backend-gateway.log").start()
    try:
        if wanted(ctx, "cron") and not bots:
            with ctx.phase("cron"):
                wait_cron(ctx, ctx.opts.cron_wait, "gateway", started)
        launch_key = ctx.registry[launch].canaries["api_server_key"]
        if wanted(ctx, "route-auth"):
            with ctx.phase("route-auth"):
                _route_auth(ctx, gw)
        if bots:
            with ctx.phase(messaging.NAME):
                messaging.run(ctx)
            if wanted(ctx, "cron"):
                with ctx.phase("cron"):
                    wait_cron(ctx, ctx.opts.cron_wait, "gateway", started)
                with ctx.phase(messaging.NAME):  # what the jobs that fired posted through the bots
                    attachments.judge_cron(ctx, bots[0])
        with ctx.phase("turns"):
            battery.write_turns(ctx, lambda name: _gateway_turn(ctx, gw, name, launch_key, "turns"))
            for _ in range(ctx.opts.turns - 1):
                for name in names:
                    _gateway_turn(ctx, gw, name, launch_key, "turns")
        if battery.enabled(ctx) and wanted(ctx, "lookups"):
            with ctx.phase("lookups"):
                battery.lookup_turns(ctx, lambda name: _gateway_turn(ctx, gw, name, launch_key, "lookups"), started)
        phases.run_at(ctx, "gateway", PhaseRun(
            ctx, "gateway", lambda name: _gateway_turn(ctx, gw, name, launch_key, ctx.current_phase or "")))
        if wanted(ctx, "profiles"):
            with ctx.phase("profiles"):
                profiles(ctx, gw.pid, gw.proc, "gateway")
    finally:
        gw.close()


def _gateway_turn(ctx: Context, gw: GatewayBackend, name: str, launch_key: str, phase: str) -> None:
    """One chat turn on the tenant's route with its own key; Hermes has no per-profile API-server key,
    so a rejected own key is retried with the launch key (the rejection is already a route_auth finding)."""
    path = gw.route(name, ctx.sandbox.launch, "/v1/chat/completions")
    body = {"model": ctx.registry[name].model, "messages": [{"role": "user", "content": PROMPT}]}
    started = time.monotonic()
    status, payload = gw.request("POST", path, ctx.registry[name].canaries["api_server_key"], body, tenant=name,
                                 timeout=ctx.opts.timeout)
    if status == 401 and name != ctx.sandbox.launch:
        status, payload = gw.request("POST", path, launch_key, body, tenant=name, timeout=ctx.opts.timeout)
    ok = status == 200
    detail = "" if ok else f"HTTP {status}: {json.dumps(payload)[:160]}"
    ctx.record(TurnResult(name, "gateway", ok, time.monotonic() - started, detail), phase)


def _route_auth(ctx: Context, gw: GatewayBackend) -> None:
    """A key must open only its own tenant's route, and its own key must open it."""
    launch = ctx.sandbox.launch
    for route_owner in ctx.registry:
        path = gw.route(route_owner.name, launch, "/v1/models")
        for key_owner in ctx.registry:
            key = key_owner.canaries["api_server_key"]
            status, _ = gw.request("GET", path, key, None, tenant=None)
            opened = status == 200
            own = key_owner.name == route_owner.name
            if opened != own:
                what = "opened" if opened else "did not open"
                ctx.findings.append(Finding(
                    "route_auth", key_owner.name if opened else route_owner.name, route_owner.name,
                    "api_server_key", "request", f"gateway:GET {path}", None,
                    f"Bearer {placeholder(key_owner.name, 'api_server_key')} -> HTTP {status}", scenario=ctx.scenario,
                    phase="route-auth",
                    detail=f"{key_owner.name}'s API-server key {what} {route_owner.name}'s route",
                ))


DOOR = Door("gateway", "`hermes gateway run` multiplexing every profile, with the OpenAI-compatible API server",
            rank=40, drive=gateway, gateway=True,
            needs=(("multiplex", "no multiplexed gateway (gateway.multiplex_profiles)"),))

"""The `api_server` front door: the OpenAI-compatible API server of `hermes gateway run` with multiplexed profiles,
beyond chat completions: its stored responses, named conversations, runs and sessions, each an object with an id
that one tenant creates and another can name on its own route (`/p/<tenant>/...`).

Phases:
- `turns`: every tenant's turn as a stored response (`POST /v1/responses`, `store: true`, a conversation named
  after the tenant) running the tool battery's write plan; then every tenant's run (`POST /v1/runs`, polled
  until it ends);
- `lookups`: every tenant names its ring neighbour's objects on its own route: the stored response by id
  (`GET /v1/responses/{id}`), a response continuing it (`previous_response_id`) and one continuing its named
  conversation, its run by id (`GET /v1/runs/{id}`), its sessions (`GET /api/sessions/{id}/messages`) and the
  session list, the run's event stream (`GET /v1/runs/{id}/events`), and a chat completion continuing its session
  by id (`X-Hermes-Session-Id`), each answer in the RPC log under the asking tenant. Whatever of the neighbour comes
  back (in a reply, or in the asking tenant's provider request when Hermes rebuilds the conversation) is a finding.
  Then run control (`harness/drive/doors/run_control.py`): a run of the first tenant that is not the launch profile,
  waiting for its approval, is answered and stopped by the tenant that looks up its objects.

Hermes has no per-profile API-server key (F4): a tenant's own key that is refused is retried with the launch
profile's, as the `gateway` door does.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from harness.core.protocol import PROMPT
from harness.drive import battery
from harness.drive.context import Context
from harness.drive.doors import run_control
from harness.drive.doors.base import Door
from harness.drive.doors.gateway_client import GatewayBackend
from harness.drive.hermes.agent import TurnResult
from harness.drive.phases import wanted

DRIVER = "api-server"
#: The header a chat completion names the session it continues with.
SESSION_HEADER = "X-Hermes-Session-Id"
#: How long a run may take to end, polled every half second.
RUN_WAIT = 120.0


@dataclass
class Objects:
    """What one tenant created through the API server: its stored response, conversation, run and sessions."""

    response: str = ""
    conversation: str = ""
    run: str = ""
    sessions: list[str] = field(default_factory=list)


def conversation_name(tenant: str) -> str:
    return f"tenancy-{tenant}"


def _call(ctx: Context, gw: GatewayBackend, tenant: str, method: str, path: str,
          body: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """One request on the tenant's route with its own key, retried with the launch profile's when refused."""
    route = gw.route(tenant, ctx.sandbox.launch, path)
    own = ctx.registry[tenant].canaries["api_server_key"]
    status, payload = gw.request(method, route, own, body, tenant=tenant, timeout=ctx.opts.timeout, headers=headers)
    if status == 401 and tenant != ctx.sandbox.launch:
        launch = ctx.registry[ctx.sandbox.launch].canaries["api_server_key"]
        status, payload = gw.request(method, route, launch, body, tenant=tenant, timeout=ctx.opts.timeout,
                                     headers=headers)
    return status, payload


def _caller(ctx: Context, gw: GatewayBackend) -> run_control.Call:
    """`_call` on this audit's gateway, as `run_control` calls it."""
    return lambda tenant, method, path, body: _call(ctx, gw, tenant, method, path, body)


def _respond(ctx: Context, gw: GatewayBackend, tenant: str, phase: str, extra: dict[str, Any]) -> str:
    """A stored response of the tenant (one agent turn, the env probe at least); its id, "" if it failed. In
    `lookups` (naming another tenant's object) a refusal (400, 404) is the isolated answer, not a failure."""
    started = time.monotonic()
    body = {"model": ctx.registry[tenant].model, "input": PROMPT, "store": True, **extra}
    status, payload = _call(ctx, gw, tenant, "POST", "/v1/responses", body)
    ran = status == 200 and isinstance(payload, dict)
    ok = ran or (phase == "lookups" and status in (400, 404))
    detail = "" if ok else f"HTTP {status}: {json.dumps(payload)[:160]}"
    ctx.record(TurnResult(tenant, f"{DRIVER}-responses", ok, time.monotonic() - started, detail), phase,
               snapshot=ran)
    return str(payload.get("id") or "") if ran else ""


def _run(ctx: Context, gw: GatewayBackend, tenant: str, phase: str) -> str:
    """A run of the tenant (`POST /v1/runs`), polled until it ends; its id, "" if it did not start."""
    started = time.monotonic()
    status, payload = _call(ctx, gw, tenant, "POST", "/v1/runs", {"model": ctx.registry[tenant].model,
                                                                  "input": PROMPT})
    run_id = str(payload.get("run_id") or payload.get("id") or "") if isinstance(payload, dict) else ""
    state = run_control.poll(_caller(ctx, gw), tenant, run_id, run_control.ENDED,
                             RUN_WAIT - (time.monotonic() - started)) if run_id else ""
    ok = state == "completed"
    detail = "" if ok else f"run {run_id or '(none)'}: HTTP {status}, status {state or 'unknown'}"
    ctx.record(TurnResult(tenant, f"{DRIVER}-runs", ok, time.monotonic() - started, detail), phase)
    return run_id


def _chat(ctx: Context, gw: GatewayBackend, tenant: str, session: str) -> None:
    """A chat completion of `tenant` continuing `session` (another tenant's) by its id in `X-Hermes-Session-Id`:
    whatever of that session comes back, or reaches the tenant's provider, is a finding; a refusal is isolation."""
    started = time.monotonic()
    body = {"model": ctx.registry[tenant].model, "messages": [{"role": "user", "content": PROMPT}]}
    status, payload = _call(ctx, gw, tenant, "POST", "/v1/chat/completions", body, {SESSION_HEADER: session})
    ok = status in (200, 400, 403, 404)
    ctx.record(TurnResult(tenant, f"{DRIVER}-chat", ok, time.monotonic() - started,
                          "" if ok else f"HTTP {status}: {json.dumps(payload)[:160]}"), "lookups",
               snapshot=status == 200)


def _look(ctx: Context, gw: GatewayBackend, tenant: str, method: str, path: str) -> None:
    """A lookup that runs no agent turn: recorded as driven when the server answered at all."""
    status, _ = _call(ctx, gw, tenant, method, path)
    ok = status in (200, 404)
    ctx.record(TurnResult(tenant, f"{DRIVER}-lookup", ok, 0.0, "" if ok else f"{method} {path}: HTTP {status}"),
               "lookups", snapshot=False)


def _lookups(ctx: Context, gw: GatewayBackend, seeker: str, theirs: Objects) -> None:
    """`seeker` names another tenant's objects on its own route."""
    if theirs.response:
        _look(ctx, gw, seeker, "GET", f"/v1/responses/{theirs.response}")
        _respond(ctx, gw, seeker, "lookups", {"previous_response_id": theirs.response})
    if theirs.conversation:
        _respond(ctx, gw, seeker, "lookups", {"conversation": theirs.conversation})
    if theirs.run:
        _look(ctx, gw, seeker, "GET", f"/v1/runs/{theirs.run}")
        _look(ctx, gw, seeker, "GET", f"/v1/runs/{theirs.run}/events")
    _look(ctx, gw, seeker, "GET", "/api/sessions")
    for sid in theirs.sessions[:1]:
        _look(ctx, gw, seeker, "GET", f"/api/sessions/{sid}/messages")
        _chat(ctx, gw, seeker, sid)


def api_server(ctx: Context) -> None:
    names = ctx.registry.names()
    gw = GatewayBackend(ctx.hermes, ctx.gateway_port, ctx.rpc_log(DRIVER),
                        ctx.out / "logs" / "backend-api-server.log").start()
    started = time.time()
    made = {name: Objects() for name in names}
    try:
        with ctx.phase("turns"):
            def respond(name: str) -> None:
                made[name].conversation = conversation_name(name)
                made[name].response = _respond(ctx, gw, name, "turns", {"conversation": made[name].conversation})

            battery.write_turns(ctx, respond)
            for name in names:
                made[name].run = _run(ctx, gw, name, "turns")
        if wanted(ctx, "lookups"):
            with ctx.phase("lookups"):
                for name in names:
                    made[name].sessions = battery.learn(ctx, name, started).sessions
                for name in names:
                    _lookups(ctx, gw, name, made[battery.neighbour(ctx, name)])
                owner = next(n for n in names if n != ctx.sandbox.launch)
                actor = next(n for n in names if battery.neighbour(ctx, n) == owner)
                run_control.run(ctx, _caller(ctx, gw), owner, actor, "lookups")
    finally:
        gw.close()


DOOR = Door("api_server", "the gateway's OpenAI-compatible API server: stored responses, conversations, runs, "
            "sessions", rank=50, drive=api_server, gateway=True,
            needs=(("multiplex", "no multiplexed gateway (gateway.multiplex_profiles)"),))

"""The ACP front door: Hermes' adapter for editors (`hermes [-p NAME] acp`, the Agent Client Protocol over
stdio), one process per profile, as an editor configured with each profile starts it (`drive.acp_client`).

The adapter has no notion of a profile in Hermes 0.19.0 (`acp_adapter/`: `session/new` takes a cwd only; the
process loads the `.env` of the home it starts in, `entry.py`, and keeps its sessions in that home's `state.db`,
`session.py`), so each tenant gets a process of its own, the tenants' turns concurrent.

Phase `turns`: every tenant's `session/new` (its workdir as cwd) and a `session/prompt` running the battery's
write plan; `lookups`: the second tenant's turn asks for the first tenant's identifiers (`battery`); `resume`:
what an editor can do across profiles in one process: the second tenant's process is asked to `session/load`,
`session/resume`, `session/fork` and `session/prompt` the first tenant's session id, and to list its sessions. A
process that loads, forks, lists or runs a turn in the other profile's session, or sends an update of it, is a
`profile_bleed` (canary kind `acp_session`); whatever of the other profile it replays is in its frames, which the
reconciler scans. The second tenant loading its own session is the near miss (and the proof that a load works):
never reported, and a failed step when it fails. A cwd in another profile's workdir is not tried: the adapter
makes it the terminal tools' working directory only (`_register_task_cwd` in `session.py`), and what the tools
read there is what they read of any path (the policy's `allowed` file reads).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from harness.capture.stubs.provider import Plan
from harness.core.findings import Finding
from harness.core.protocol import PROMPT
from harness.drive import battery
from harness.drive.context import Context
from harness.drive.doors.acp_client import AcpClient
from harness.drive.doors.base import Door
from harness.drive.hermes.agent import TurnResult
from harness.drive.hermes.rpc import BackendError
from harness.drive.phases import wanted

#: The ACP package the adapter needs (Hermes' extra `acp`): only this door uses it.
PACKAGES = ("agent-client-protocol",)


def _turn(ctx: Context, client: AcpClient, session: str) -> TurnResult:
    started = time.monotonic()
    ok, detail = client.prompt(session, PROMPT, ctx.opts.timeout)
    return TurnResult(client.tenant, "acp", ok, time.monotonic() - started, detail, client.log_path)


def _round(ctx: Context, phase: str, clients: dict[str, AcpClient], sessions: dict[str, str],
           plans: dict[str, Plan], names: list[str]) -> None:
    with battery.scripted(ctx, plans), ThreadPoolExecutor(max_workers=len(names)) as pool:
        results = list(pool.map(lambda name: _turn(ctx, clients[name], sessions[name]), names))
    for r in results:
        ctx.record(r, phase)


def _bleed(ctx: Context, victim: str, seen_in: str, where: str, what: str) -> None:
    ctx.findings.append(Finding("profile_bleed", victim, seen_in, "acp_session", "rpc", f"acp:{where}", "plain",
                                what, scenario=ctx.scenario, phase=ctx.current_phase,
                                detail=f"{seen_in}'s ACP process {what} of profile {victim!r}"))


def _across(ctx: Context, client: AcpClient, own: str, other: str, victim: str) -> None:
    """The editor's moves across profiles in one process: the other profile's session id loaded, resumed,
    forked, listed; then its own session loaded (the near miss)."""
    me, cwd = client.tenant, ctx.registry[client.tenant].canaries["workdir"]

    def ask(method: str, **params: Any) -> Callable[[], dict[str, Any]]:
        return lambda: client.call(method, {"sessionId": other, "cwd": cwd, "mcpServers": [], **params})

    named: dict[str, Callable[[], dict[str, Any]]] = {
        "session/load": ask("session/load"), "session/resume": ask("session/resume"),
        "session/fork": ask("session/fork"), "session/list": lambda: client.call("session/list", {}),
        "session/prompt": lambda: client.call("session/prompt", {"sessionId": other, "prompt": [
            {"type": "text", "text": PROMPT}]}, ctx.opts.timeout)}
    started = time.monotonic()
    for method, send in named.items():
        result = send().get("result") or {}
        if method == "session/load" and result:  # an unknown session: `{}` (Hermes answers None)
            _bleed(ctx, victim, me, method, "loaded a session")
        if method == "session/fork" and result.get("sessionId"):
            _bleed(ctx, victim, me, method, "forked a session")
        if method == "session/list" and other in {s.get("sessionId") for s in result.get("sessions") or []}:
            _bleed(ctx, victim, me, method, "listed a session")
        if method == "session/prompt" and result.get("stopReason") not in (None, "refusal"):  # unknown: refusal
            _bleed(ctx, victim, me, method, "ran a turn in a session")
    if other in client.updated:
        _bleed(ctx, victim, me, "session/update", "sent updates of a session")
    try:
        loaded = client.call("session/load", {"sessionId": own, "cwd": cwd, "mcpServers": []}).get("result")
        ok, detail = bool(loaded), "" if loaded else "session/load of its own session refused"
    except BackendError as exc:
        ok, detail = False, str(exc)
    ctx.record(TurnResult(me, "acp", ok, time.monotonic() - started, detail, client.log_path), "resume",
               snapshot=False)


def acp(ctx: Context) -> None:
    """`hermes [-p NAME] acp` for every tenant, driven over ACP; the tenants' turns concurrent."""
    names = ctx.registry.names()
    clients = {name: AcpClient(ctx.hermes, name, ctx.rpc_log("acp"), ctx.out / "logs" / f"acp-{name}.log")
               for name in names}
    started = time.time()
    try:
        with ctx.phase("turns"):
            with ThreadPoolExecutor(max_workers=len(names)) as pool:
                list(pool.map(AcpClient.start, clients.values()))
            sessions = {name: clients[name].new_session(ctx.registry[name].canaries["workdir"]) for name in names}
            for n in range(ctx.opts.turns):
                first = n == 0 and battery.enabled(ctx)
                plans = {name: battery.write_plan(ctx, name) for name in names} if first else {}
                _round(ctx, "turns", clients, sessions, plans, names)
        seeker = names[1]
        victim = battery.neighbour(ctx, seeker)
        if battery.enabled(ctx) and wanted(ctx, "lookups"):
            with ctx.phase("lookups"):
                other = battery.learn(ctx, victim, started, [sessions[victim]])
                _round(ctx, "lookups", clients, sessions, {seeker: battery.lookup_plan(ctx, seeker, other)}, [seeker])
        if wanted(ctx, "resume"):
            with ctx.phase("resume"):
                _across(ctx, clients[seeker], sessions[seeker], sessions[victim], victim)
    finally:
        for client in clients.values():
            client.close()


DOOR = Door("acp", "`hermes [-p NAME] acp`: the ACP adapter for editors, one process per profile", rank=70, drive=acp,
            tenants=2, backend=False, packages=PACKAGES,
            needs=(("acp", "no ACP adapter (hermes acp with the `acp` extra)"),))

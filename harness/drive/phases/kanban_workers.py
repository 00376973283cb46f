"""The dispatcher step of the `kanban` phase: every card of the phase, worked by Hermes' dispatcher, must be worked
as its assignee.

Hermes' dispatcher (`hermes kanban dispatch`, one pass, run here as the launch profile, the operator) claims every
ready card of a board and spawns a worker for it, `hermes -p ASSIGNEE chat -q "work kanban task ID"`, detached. The
worker's model calls go to the provider of the profile it runs as: the prompt naming the card must reach the
assignee's provider stub (the near miss: every card worked as its assignee is never reported), with its key and
model (the addon checks those on every route). A card's prompt at another tenant's provider ran in that tenant's
profile: a `profile_bleed` of the assignee seen there, canary kind `kanban_worker` (entry point `kanban worker`). A
card never spawned, or whose worker never called a provider, is a failed step. The stubs answer the workers with
text (no env probe: a worker's cwd is its task's workspace, not its profile's workdir, and its kanban paths are at
the shared root by design, which the probe's own checks would take for another tenant's), and the step waits for
every worker to exit.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from harness.core.findings import Finding
from harness.detect.decode import loads
from harness.drive import battery
from harness.drive.context import Context
from harness.drive.hermes.agent import TurnResult

#: What a misrouted worker carries as its canary kind.
MISROUTED = "kanban_worker"
#: Seconds within which every spawned worker must call its provider and exit.
WAIT = 120.0


@dataclass(frozen=True)
class Card:
    """One card of the phase on a board."""

    board: str
    id: str
    assignee: str
    pid: int | None = None  # the worker the dispatcher spawned for it


def prompt(card_id: str) -> str:
    """What Hermes' dispatcher asks a worker (`kanban_db._default_spawn`)."""
    return f"work kanban task {card_id}"


def cards(databases: dict[str, Path], marker: str) -> list[Card]:
    """Every card whose title holds `marker`, on every board (`databases`: slug -> its kanban.db)."""
    found = []
    for slug, db in databases.items():
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
                rows = conn.execute("SELECT id, assignee, worker_pid FROM tasks WHERE instr(title, ?) > 0",
                                    (marker,)).fetchall()
        except sqlite3.Error:
            continue
        found += [Card(slug, str(i), str(a or ""), int(p) if p else None) for i, a, p in rows]
    return found


def workers_seen(ctx: Context, ids: list[str], since: float) -> dict[str, set[str]]:
    """Card id -> the tenants whose provider received its worker's prompt since `since`."""
    seen: dict[str, set[str]] = {i: set() for i in ids}
    for tenant, stub in ctx.stubs.items():
        for r in stub.snapshot():
            if r.time < since or not r.body:
                continue
            text = json.dumps((loads(r.body) or {}).get("messages") or []) if r.body.startswith(b"{") else ""
            for i in ids:
                if prompt(i) in text:
                    seen[i].add(tenant)
    return seen


def misrouted(worked: list[Card], seen: dict[str, set[str]], scenario: str, driver: str, phase: str) -> list[Finding]:
    """A finding for every card whose worker's prompt reached a tenant other than its assignee."""
    return [Finding("profile_bleed", c.assignee, tenant, MISROUTED, "request", f"{driver}:kanban dispatch", "plain",
                    f"work kanban task {c.id} at {tenant!r}'s provider", scenario=scenario, phase=phase,
                    detail=f"the card {c.id} on board {c.board!r}, assigned to {c.assignee!r}, was worked in "
                           f"{tenant!r}'s profile (its worker's prompt reached {tenant!r}'s provider)")
            for c in worked for tenant in sorted(seen.get(c.id, ())) if tenant != c.assignee]


def _dispatch(ctx: Context, board: str) -> tuple[bool, str]:
    """One pass of Hermes' dispatcher over `board`, as the launch profile."""
    argv = [str(ctx.hermes.python), "-m", "hermes_cli.main", "kanban", "--board", board, "dispatch", "--json"]
    rc, out, err = ctx.hermes.procs.run(argv, env=ctx.hermes.env(), cwd=ctx.sandbox.home, timeout=120)
    if rc == 0:
        return True, ""
    return False, (err.strip() or out.strip() or f"rc={rc}").splitlines()[-1][:160]


def _wait(ctx: Context, databases: dict[str, Path], marker: str,
          since: float) -> tuple[list[Card], dict[str, set[str]]]:
    """Until every spawned card's worker called a provider and exited (or WAIT passed): the cards, who saw them."""
    deadline = time.monotonic() + WAIT
    while True:
        worked = [c for c in cards(databases, marker) if c.pid]
        seen = workers_seen(ctx, [c.id for c in worked], since)
        alive = [c for c in worked if psutil.pid_exists(c.pid or 0) and _running(c.pid or 0)]
        if (all(seen[c.id] for c in worked) and not alive) or time.monotonic() > deadline:
            return worked, seen
        time.sleep(0.5)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def run(ctx: Context, databases: dict[str, Path], marker: str, driver: str, phase: str) -> None:
    """The step: see the module's docstring. `databases`: the boards to dispatch; `marker`: in every phase card."""
    names, since = ctx.registry.names(), time.time()
    with battery.scripted(ctx, {name: [] for name in names}):  # a worker's conversation gets text, no probe
        started = time.monotonic()
        for board in databases:
            ok, why = _dispatch(ctx, board)
            if not ok:
                ctx.record(TurnResult(ctx.sandbox.launch, f"{driver}-kanban-dispatch", False,
                                      time.monotonic() - started, f"hermes kanban dispatch: {why}"), phase,
                           snapshot=False)
                return
        worked, seen = _wait(ctx, databases, marker, since)
    seconds = time.monotonic() - started
    for c in cards(databases, marker):
        got = seen.get(c.id) if c.pid else None
        detail = "" if got else f"card {c.id} on {c.board}: " + (
            "never spawned by the dispatcher" if not c.pid else f"its worker never called a provider in {WAIT:.0f}s")
        ctx.record(TurnResult(c.assignee, f"{driver}-kanban-worker", bool(got), seconds, detail), phase,
                   snapshot=False)
    ctx.findings.extend(misrouted(worked, seen, ctx.scenario, driver, phase))

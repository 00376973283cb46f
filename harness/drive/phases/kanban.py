"""The `kanban` phase of the backends that serve every profile in one process (tui, serve): a profile's choice of
kanban board must not move another profile's cards.

Hermes keeps every board at the shared root by design (`hermes_cli/kanban_db.py`, `kanban_home`: the launch
profile's home here), and any profile may name any board; what one profile reads of another's cards is not a leak
(the `hermes` policy allows the store). The *current board* is the pointer a call without `board` lands on
(`<root>/kanban/current`, written by `/kanban boards switch`). For the phase every profile has the `kanban` toolset
from the start. Then, profile by profile, each creates a board of its own and switches to it (`slash.exec`
`/kanban boards create SLUG --switch` on its own session) and its model creates a card (`kanban_create`, no board
named; a canary of the tenant, kind `kanban_card`, in its title) assigned to itself: the card must land on its own
board, the near miss, never reported (elsewhere: the switch never took effect, a failed turn). After the last
switch every profile's model creates one more card, assigned to its ring neighbour (no canary in it: a card
addressed to another profile is its to read): a card that lands on another profile's board went where that profile's
switch pointed (`profile_bleed` from that profile, canary kind `kanban_board`, entry point `kanban board`). Then
Hermes' dispatcher works the cards of the boards those last cards landed on (`kanban_workers`).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from harness.capture.stubs.provider import ToolStep, probe_step
from harness.core.findings import Finding
from harness.core.registry import new_tag
from harness.drive import battery
from harness.drive.context import Context
from harness.drive.hermes.agent import TurnResult
from harness.drive.hermes.rpc import BackendError, RpcBackend
from harness.drive.phases import kanban_workers
from harness.drive.phases.base import OPT_IN, PhaseRun, PhaseSpec
from harness.drive.surface import Setup

NAME = "kanban"
#: The doors whose driver runs the phase (`doors.rpc_doors.drive_rpc`, through `phases.run_at`).
DOORS = ("tui", "serve")
KIND = "kanban_card"
#: What a card that went where another profile's switch pointed carries as its canary kind.
BLEED = "kanban_board"
#: Hermes' board that is there before any is created (its database is `<root>/kanban.db`).
DEFAULT_BOARD = "default"


def settings(ctx: Context, tenant: str) -> Setup:
    """What the phase adds to every tenant's config from the start: the `kanban` toolset (Hermes caches a tool's
    availability check for 30 s in the process, so it is on before the backend), and no dispatcher in the gateway
    (under `all` it would work the cards the phase leaves ready on its own ticks)."""
    return Setup(config={"toolsets": ["hermes-cli", "kanban"], "kanban": {"dispatch_in_gateway": False}})


def boards(root: Path) -> dict[str, Path]:
    """Every board's database under a Hermes root, by slug."""
    found = {DEFAULT_BOARD: root / "kanban.db"}
    found.update({p.parent.name: p for p in sorted((root / "kanban" / "boards").glob("*/kanban.db"))})
    return {slug: db for slug, db in found.items() if db.exists()}


def board_of(root: Path, title: str) -> str | None:
    """The board whose database holds a card whose title holds `title`, or None."""
    for slug, db in boards(root).items():
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
                hit = conn.execute("SELECT 1 FROM tasks WHERE instr(title, ?) > 0", (title,)).fetchone()
        except sqlite3.Error:
            continue
        if hit:
            return slug
    return None


def bleeds(landed: dict[str, str | None], own: dict[str, str], scenario: str, driver: str) -> list[Finding]:
    """A finding for every tenant whose card (created after every switch, no board named) landed on another
    tenant's board (`landed`: tenant -> board slug; `own`: tenant -> its board); its own board is never one."""
    owner = {slug: tenant for tenant, slug in own.items()}
    return [Finding("profile_bleed", owner[slug], tenant, BLEED, "rpc", f"{driver}:kanban_create", "plain",
                    f"a card of {tenant!r} on board {slug}", tool="kanban_create", scenario=scenario, phase=NAME,
                    detail=f"{tenant!r} switched to its own board {own[tenant]!r}; its next card, no board named, "
                           f"landed on {owner[slug]!r}'s board {slug!r}, where {owner[slug]!r}'s switch pointed")
            for tenant, slug in landed.items() if slug in owner and owner[slug] != tenant]


def _switch(ctx: Context, backend: RpcBackend, tenant: str, sid: str, slug: str, driver: str) -> bool:
    """`tenant` creates board `slug` and switches to it, on its own session."""
    started = time.monotonic()
    try:
        reply = backend.call("slash.exec", {"session_id": sid, "command": f"/kanban boards create {slug} --switch"},
                             tenant=tenant, timeout=120)
        output = str((reply.get("result") or {}).get("output") or reply.get("error") or "")
        ok = "result" in reply and "Switched to" in output
    except BackendError as exc:
        ok, output = False, str(exc)
    ctx.record(TurnResult(tenant, f"{driver}-kanban-switch", ok, time.monotonic() - started,
                          "" if ok else f"/kanban boards create --switch: {output[:160]}"), NAME, snapshot=False)
    return ok


def workspace(ctx: Context) -> Path:
    """The folder every card of the phase names as its workspace: in the sandbox, in no tenant's home or workdir.
    Hermes' default (`scratch`) is a folder at the shared root, the launch profile's home, which it names in the
    worker's prompt: the launch profile's home path in every other profile's context, a consequence of the shared
    root, not what the phase looks at."""
    return ctx.sandbox.root / "kanban-work"


def _card(ctx: Context, tenant: str, assignee: str, title: str, turn: Callable[[str], None]) -> None:
    """One turn of `tenant` (after the env probe) creating a card titled `title`, assigned to `assignee`, no board
    named."""
    create = ToolStep("kanban_create", {"title": title, "assignee": assignee,
                                        "body": f"a card of {tenant} for {assignee}", "workspace_kind": "dir",
                                        "workspace_path": str(workspace(ctx))})
    with battery.scripted(ctx, {tenant: [[probe_step(ctx.registry[tenant])], [create]]}):
        turn(tenant)


def run(r: PhaseRun) -> None:
    """The phase: see the module's docstring."""
    ctx, backend, sessions, driver, turn = r.ctx, r.backend, r.sessions, r.driver, r.turn
    assert backend is not None, "the kanban phase needs its door's JSON-RPC backend"
    names, root, tag = ctx.registry.names(), ctx.sandbox.hermes_root, new_tag()
    own, marker = {name: f"tenancy-{name}-{tag}" for name in names}, f"tenancy-card-{tag}"
    for name in names:
        if not _switch(ctx, backend, name, sessions[name], own[name], driver):
            return
        title = f"kanbancard-{name}-{new_tag()}"
        ctx.mint(name, KIND, title)
        _card(ctx, name, name, f"{title} {marker}", turn)
        landed = board_of(root, title)
        if landed != own[name]:  # the near miss: its own card on its own board
            ctx.record(TurnResult(name, f"{driver}-{NAME}", False, 0.0,
                                  f"its card landed on {landed or 'no board'}, not on the board it switched to: "
                                  "the switch or kanban_create never took effect"), NAME, snapshot=False)
            return
    later = {}
    for name in names:  # no canary in these: a card addressed to another profile is its to read, by design
        neighbour = battery.neighbour(ctx, name)
        _card(ctx, name, neighbour, f"{marker}-{name}-to-{neighbour}", turn)
        later[name] = board_of(root, f"{marker}-{name}-to-")
        if later[name] is None:
            ctx.record(TurnResult(name, f"{driver}-{NAME}", False, 0.0, "its card is on no board: kanban_create "
                                  "never took effect"), NAME, snapshot=False)
    ctx.findings.extend(bleeds(later, own, ctx.scenario, driver))
    every = boards(root)
    kanban_workers.run(ctx, {slug: every[slug] for slug in sorted({s for s in later.values() if s})}, marker,
                       driver, NAME)


PHASE = PhaseSpec(NAME, "one profile's switch of its current kanban board must not move another profile's next card; "
                  "the dispatcher must work every card as its assignee", rank=120, doors=DOORS, selection=OPT_IN,
                  way="kanban", plant="kanban-card", settings=settings, run=run)

"""The one-shot front door: `hermes [-p NAME] -z PROMPT`, one process per turn.

Phase `turns`: every tenant's first turn runs the battery's write plan (the tenants' turns concurrent);
phase `lookups`: the second tenant's turn asks for the first tenant's identifiers (see `battery`). One
process per turn makes a turn costly here, and a process holds no other tenant's state: what can cross is
what the tools read from other profiles' homes, and one direction shows it.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from harness.capture.stubs.provider import Plan
from harness.core.protocol import PROMPT
from harness.drive import battery
from harness.drive.context import Context
from harness.drive.doors.base import Door
from harness.drive.phases import wanted


def _round(ctx: Context, phase: str, plans: dict[str, Plan], names: list[str] | None = None) -> None:
    names = names or ctx.registry.names()
    with battery.scripted(ctx, plans), ThreadPoolExecutor(max_workers=len(names)) as pool:
        results = list(pool.map(lambda name: ctx.hermes.oneshot(name, PROMPT, timeout=ctx.opts.timeout), names))
    for r in results:
        ctx.record(r, phase)


def oneshot(ctx: Context) -> None:
    """`hermes [-p NAME] -z PROMPT` for every tenant, the tenants' turns running concurrently."""
    names = ctx.registry.names()
    started = time.time()
    with ctx.phase("turns"):
        for n in range(ctx.opts.turns):
            plans = {name: battery.write_plan(ctx, name) for name in names} if n == 0 and battery.enabled(ctx) else {}
            _round(ctx, "turns", plans)
    if battery.enabled(ctx) and wanted(ctx, "lookups"):
        with ctx.phase("lookups"):
            seeker = names[1]
            other = battery.learn(ctx, battery.neighbour(ctx, seeker), started)
            _round(ctx, "lookups", {seeker: battery.lookup_plan(ctx, seeker, other)}, [seeker])


DOOR = Door("oneshot", "`hermes [-p NAME] -z PROMPT`, one process per turn", rank=10, drive=oneshot, tenants=2,
            backend=False, needs=(("oneshot", "no one-shot mode (hermes -z)"),))

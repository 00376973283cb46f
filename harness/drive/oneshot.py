"""The one-shot scenario: `hermes [-p NAME] -z PROMPT`, one process per turn.

Phase `turns`: every tenant's first turn runs the battery's write plan (the tenants' turns concurrent);
phase `lookups`: every tenant's turn asks for its ring neighbour's identifiers (see `battery`).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from harness.capture.stubs import ToolStep
from harness.drive import battery
from harness.drive.context import PROMPT, Context
from harness.drive.phases import wanted


def _round(ctx: Context, phase: str, plans: dict[str, list[ToolStep]]) -> None:
    names = ctx.registry.names()
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
            refs = {name: battery.learn(ctx, name, started) for name in names}
            _round(ctx, "lookups", {name: battery.lookup_plan(ctx, name, refs[battery.neighbour(ctx, name)])
                                    for name in names})

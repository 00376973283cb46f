"""The one-shot scenario: `hermes [-p NAME] -z PROMPT`, one process per turn."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from harness.drive.context import PROMPT, Context


def oneshot(ctx: Context) -> None:
    """`hermes [-p NAME] -z PROMPT` for every tenant, the tenants' turns running concurrently."""
    with ctx.phase("turns"):
        for _ in range(ctx.opts.turns):
            with ThreadPoolExecutor(max_workers=len(ctx.registry.names())) as pool:
                results = list(pool.map(
                    lambda name: ctx.hermes.oneshot(name, PROMPT, timeout=ctx.opts.timeout),
                    ctx.registry.names(),
                ))
            for r in results:
                ctx.record(r, "turns")

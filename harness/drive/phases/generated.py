"""The `generated` phase of the backends that serve every profile in one process (tui, serve): what Hermes generates
from a tenant's data, and where it lands.

Every model stub's text carries the derived canaries of the tenants whose data it was asked about
(`capture.stubs.derived`), so a session title, a context-compression checkpoint or a memory entry Hermes writes can
be traced to its source wherever it is stored. Titles come with every session's first exchange in every door; this
phase drives the other two:

- memory extraction: Hermes' background memory review (`memory.nudge_interval: 1` in every profile, from the start,
  for a run with the phase) after one turn of each tenant: the review's model saves an entry with the `memory` tool;
- context compression: `session.compress` of each tenant's session, whose summary replaces its history.

A step whose text never reached a model (no derived canary of that kind minted for the tenant) is a failed step:
the phase then proved nothing about it. The detection is the registry's and the scanners' as for any canary:
tests/test_derived.py has its planted crossing and near miss.
"""

from __future__ import annotations

import time

from harness.core.derived import DERIVED
from harness.drive.context import Context
from harness.drive.hermes.agent import TurnResult
from harness.drive.hermes.rpc import BackendError
from harness.drive.phases.base import ALL_ONLY, PhaseRun, PhaseSpec
from harness.drive.surface import Setup

NAME = "generated"
DOORS = ("tui", "serve")
UNPLANTED = ("no plant makes Hermes generate text: the derived canaries' planted crossing and near miss are in "
             "tests/test_derived.py")


def settings(ctx: Context, tenant: str) -> Setup:
    """Hermes' memory review after every turn (its default is every tenth; the audit's profiles turn it off)."""
    return Setup(config={"memory": {"nudge_interval": 1}})


def generated(ctx: Context, tenant: str, text: str) -> bool:
    """Whether a model derived text of the kind `text` from `tenant`'s data in this run."""
    return any(d.text == text for d in ctx.registry[tenant].derived.values())


def _step(r: PhaseRun, tenant: str, what: str, ok: bool, seconds: float, detail: str) -> None:
    r.ctx.record(TurnResult(tenant, f"{r.driver}-{what}", ok, seconds, detail), NAME, snapshot=False)


def run(r: PhaseRun) -> None:
    """The phase: see the module's docstring."""
    ctx, backend = r.ctx, r.backend
    names = ctx.registry.names()
    for name in names:
        r.turn(name)
    ctx.settle(quiet=1.0, longest=30.0)  # the memory reviews run in the background after each turn
    for name in names:
        if not generated(ctx, name, "memory"):
            _step(r, name, "memory-review", False, 0.0, "no memory review of its turn reached a model")
    if backend is None:
        return
    for name in names:
        started = time.monotonic()
        try:
            reply = backend.call("session.compress", {"session_id": r.sessions[name]}, tenant=name,
                                 timeout=ctx.opts.timeout)
            ok, detail = "error" not in reply, str(reply.get("error") or "")[:200]
        except BackendError as exc:
            ok, detail = False, str(exc)
        if ok and not generated(ctx, name, "compression"):
            ok, detail = False, "the compression never asked a model for a summary"
        _step(r, name, "compress", ok, time.monotonic() - started, detail)
    ctx.settle()


PHASE = PhaseSpec(NAME, f"text Hermes generates from a tenant's data (a memory review's entry, a compressed history) "
                        f"carries its {DERIVED}* canaries: where it lands", rank=105, doors=DOORS,
                  selection=ALL_ONLY, way="generated text", unplanted=UNPLANTED, settings=settings, run=run)

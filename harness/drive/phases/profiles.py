"""The `profiles` phase (tui, serve, gateway): a profile created and deleted next to the live backend, which must
survive unchanged (its PID the same)."""

from __future__ import annotations

from typing import Any

from harness.core.registry import new_tag
from harness.drive.context import Context
from harness.drive.hermes.agent import TurnResult
from harness.drive.phases.base import PhaseSpec


def profiles(ctx: Context, pid: int | None, proc: Any, driver: str) -> None:
    """Create and delete a profile next to the live backend; the backend must survive unchanged."""
    name = f"scratch{new_tag()[-6:]}"
    ok = True
    detail = ""
    for argv in (["profile", "create", name], ["profile", "delete", "-y", name]):
        rc, out, err = ctx.hermes.procs.run([str(ctx.hermes.python), "-m", "hermes_cli.main", *argv],
                                            env=ctx.hermes.env(), cwd=ctx.sandbox.home, timeout=120)
        if rc != 0:
            ok, detail = False, f"hermes {' '.join(argv)} failed: {(err or out).strip()[-160:]}"
    if proc is None or proc.poll() is not None or proc.pid != pid:
        ok, detail = False, f"the {driver} backend (pid {pid}) did not survive profile create/delete"
    ctx.record(TurnResult(ctx.sandbox.launch, f"{driver}-profiles", ok, 0.0, detail), "profiles", snapshot=False)


PHASE = PhaseSpec("profiles", "a profile created and deleted next to the live backend, which must survive it", rank=50,
                  doors=("tui", "serve", "gateway"), unplanted="a backend that does not survive is a failed step of "
                  "the phase, not a crossing between tenants: there is nothing to plant")

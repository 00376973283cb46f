"""The `turns` phase: every tenant's turns through the door, the first of them running the tool battery's write plan.
Every door runs it itself, its driver's own steps."""

from __future__ import annotations

from harness.drive.phases.base import PhaseSpec

PHASE = PhaseSpec("turns", "every tenant's turns, the first running the tool battery's write plan", rank=10,
                  doors=("oneshot", "tui", "serve", "gateway", "api_server", "acp"), plant="memory")

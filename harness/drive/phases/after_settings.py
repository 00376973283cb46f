"""The `after-settings` phase (tui, serve): another round of every tenant's turns after the `settings` phase's writes,
which must not leak into later turns. The backends' drivers run it themselves."""

from __future__ import annotations

from harness.drive.phases.base import PhaseSpec

PHASE = PhaseSpec("after-settings", "another round of turns after the settings writes", rank=40,
                  doors=("tui", "serve"), plant="memory")

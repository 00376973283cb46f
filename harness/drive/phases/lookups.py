"""The `lookups` phase: every tenant's turn asks the tools (and, on the API server, its routes) for another tenant's
identifiers, learned from the write turns (`battery.lookup_turns`). Every door with a tool battery runs it itself."""

from __future__ import annotations

from harness.drive.phases.base import PhaseSpec

PHASE = PhaseSpec("lookups", "every tenant asks the tools for another tenant's identifiers", rank=20,
                  doors=("oneshot", "tui", "serve", "gateway", "api_server", "acp"), plant="skill")

"""The `resume` phase (tui, serve, acp): the backend started again, every stored session resumed in its own profile
(`session.resume`, ACP's `session/load`), and another profile's session refused. The doors run it themselves."""

from __future__ import annotations

from harness.drive.phases.base import PhaseSpec

PHASE = PhaseSpec("resume", "the backend started again, every stored session resumed in its own profile", rank=60,
                  doors=("tui", "serve", "acp"), plant="acp-session")

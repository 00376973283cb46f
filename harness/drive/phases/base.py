"""The shape every phase declares once (`PhaseSpec`), and what a phase is handed where a door runs it (`PhaseRun`).

A phase is a stretch of an audit with a name of its own: findings carry it (baselines match on it) and `--phases`
chooses it. Some phases are a door's own steps, run by the door's driver where it needs them (`turns`, `lookups`,
`settings`, `resume`...); the others are run by every door that lists them at one place of its driver, each with
a `PhaseRun` (`run`): the opt-in phases, which lay their settings down in the homes before Hermes starts
(`settings`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from harness.drive.context import Context
from harness.drive.hermes.rpc import RpcBackend
from harness.drive.surface import Plant, Setup

#: How a phase is chosen: by default (`--phases` not given), in `--phases all`, only by name, or by the messaging
#: platforms asked for (a platform's bots are what the phase drives).
DEFAULT, ALL_ONLY, OPT_IN, PLATFORMS = "default", "all", "opt-in", "platforms"


@dataclass(frozen=True)
class PhaseRun:
    """What a phase run at its door's place gets: the context, the door's label in its steps (`driver`), one turn of
    a tenant recorded under the phase, and for the one-process backends their client and every tenant's session."""

    ctx: Context
    driver: str
    turn: Callable[[str], None]
    backend: RpcBackend | None = None
    sessions: dict[str, str] = field(default_factory=dict)


def _no_settings(ctx: Context, tenant: str) -> Setup:
    return Setup()


@dataclass(frozen=True)
class PhaseSpec:
    """One phase, described once. `doors`: the doors whose driver runs it; `selection`: how it is chosen (`DEFAULT`,
    `ALL_ONLY`, `OPT_IN`, `PLATFORMS`); `way`: the way into Hermes it drives, a row of the front-door coverage ("": a
    door's own steps); `plant`: its negative control, a plant the audit must catch in this phase's run ("" only
    with `unplanted`, the reason and where its detector's planted crossing and near miss are tested instead);
    `settings`: what it lays in a tenant's home before Hermes starts, when it runs; `run`: for the phases a door runs
    at one place of its driver (None: the door's own steps, run by its driver); `plants`: negative controls of its
    own, each run in the phase's first door with the phase (`plants.DOOR_PLANTS`)."""

    name: str
    summary: str
    rank: int  # its place in every list, and the order a door runs the phases that have a `run`
    doors: tuple[str, ...]
    selection: str = DEFAULT
    way: str = ""
    plant: str = ""
    unplanted: str = ""
    settings: Callable[[Context, str], Setup] = _no_settings
    run: Callable[[PhaseRun], None] | None = None
    plants: dict[str, Plant] = field(default_factory=dict)  # its own negative controls, run with it

    @property
    def option(self) -> str:
        """The option that drives it."""
        return "--platforms <a messaging platform>" if self.selection == PLATFORMS else f"--phases {self.name}"

"""Every phase of an audit: one module per phase in this package, each declaring one `PHASE` (`base.PhaseSpec`).
This registry finds them (a module without `PHASE` is a helper of one); `--phases`, the homes, the doors and the
coverage tables read it, and no other module lists a phase."""

from __future__ import annotations

import importlib
import pkgutil

from harness.drive.context import ALL, Context
from harness.drive.phases.base import ALL_ONLY, DEFAULT, OPT_IN, PhaseRun, PhaseSpec
from harness.drive.surface import Setup, merged


def _discover() -> dict[str, PhaseSpec]:
    modules = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)]
    found = [m.PHASE for m in modules if isinstance(getattr(m, "PHASE", None), PhaseSpec)]
    return {p.name: p for p in sorted(found, key=lambda p: p.rank)}


PHASES: dict[str, PhaseSpec] = _discover()
#: The phases of a run without `--phases`.
DEFAULT_PHASES: tuple[str, ...] = tuple(n for n, p in PHASES.items() if p.selection == DEFAULT)
#: `--phases all`: the default ones and those too slow to run by default (`cron`).
ALL_PHASES: tuple[str, ...] = (*DEFAULT_PHASES, *(n for n, p in PHASES.items() if p.selection == ALL_ONLY))
#: Phases run only when named: not in `all`, whose runs the committed baselines were made with (a baseline that holds
#: a phase's incidents is made on several machines, never on one to pass a test).
OPT_IN_PHASES: tuple[str, ...] = tuple(n for n, p in PHASES.items() if p.selection == OPT_IN)
#: What `--phases` accepts.
KNOWN_PHASES: tuple[str, ...] = (*ALL_PHASES, *OPT_IN_PHASES)


def wanted(ctx: Context, phase: str) -> bool:
    """Whether the run's options ask for `phase`."""
    return phase in (ctx.opts.phases or DEFAULT_PHASES)


def sets_homes(ctx: Context, phase: PhaseSpec) -> bool:
    """Whether a phase lays its settings down in the homes of this run: it was asked for and one of its doors is
    driven (`all`: one set of homes for every door)."""
    return wanted(ctx, phase.name) and ctx.scenario in (*phase.doors, ALL)


def settings(ctx: Context, tenant: str) -> Setup:
    """What every phase this run drives lays in a tenant's home from the start, merged in the phases' order."""
    config: dict = {}
    env: dict[str, str] = {}
    for phase in PHASES.values():
        if sets_homes(ctx, phase):
            more = phase.settings(ctx, tenant)
            config = merged(config, more.config)
            env.update(more.env)
    return Setup(config=config, env=env)


def run_at(ctx: Context, door: str, run: PhaseRun) -> None:
    """Run, in order, the phases a door runs at one place of its driver (those with a `run`) that the options ask
    for; `run.turn` records each turn under the phase that runs it."""
    for phase in PHASES.values():
        if phase.run is not None and door in phase.doors and wanted(ctx, phase.name):
            with ctx.phase(phase.name):
                phase.run(run)

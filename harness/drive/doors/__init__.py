"""Every front door into Hermes: one module per door in this package, each declaring one `DOOR`
(`base.Door`), with its backend's client beside it (`<door>_client`; a module without `DOOR` is a helper of the
doors). This registry finds them; `--scenario` chooses one, or `all` (every door in turn, on one registry and one
proxy; findings keep their own scenario)."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

from harness.drive.context import ALL, Context
from harness.drive.doors.base import Door
from harness.drive.hermes.features import Features
from harness.drive.phases import PHASES
from harness.drive.phases.base import PhaseSpec


def _discover() -> dict[str, Door]:
    modules = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)]
    found = [m.DOOR for m in modules if isinstance(getattr(m, "DOOR", None), Door)]
    return {d.name: d for d in sorted(found, key=lambda d: d.rank)}


DOORS: dict[str, Door] = _discover()


def everything(ctx: Context) -> None:
    """Every door in turn, on one registry and one proxy; findings keep their own scenario."""
    for name, door in DOORS.items():
        ctx.scenario = name
        door.drive(ctx)


#: Every scenario by name: each door, and `all`.
SCENARIOS: dict[str, Callable[[Context], None]] = {**{n: d.drive for n, d in DOORS.items()}, ALL: everything}


#: Ways into Hermes that neither a door nor a phase drives, and why: the front-door coverage says `out of scope` with
#: the reason, so a `clean` never stands for "not looked" (docs/doors.md). A way a phase drives is that phase's
#: (`PhaseSpec.way`).
NOT_DRIVEN: dict[str, str] = {}


def door_states(scenario: str, phases: tuple[str, ...] | list[str] = ()) -> dict[str, str]:
    """Every door and way in: `on` (this scenario drives it), `phase NAME` (the phase of `phases` that drives the
    way ran in a door this scenario drives), `not driven: <the option that drives it>` or `out of scope: ...`."""
    driven = {d.name for d in doors_of(scenario)}

    def way(phase: PhaseSpec) -> str:
        if driven & set(phase.doors) and phase.name in phases:
            return f"phase {phase.name}"
        where = " or ".join(f"--scenario {d}" for d in phase.doors if d not in driven)
        return f"not driven: {phase.option}" + (f" (with {where} or all)" if not driven & set(phase.doors) else "")

    return {**{n: "on" if n in driven else f"not driven: --scenario {n} or all" for n in DOORS},
            **{p.way: way(p) for p in PHASES.values() if p.way},
            **{n: f"out of scope: {why}" for n, why in NOT_DRIVEN.items()}}


def doors_of(scenario: str) -> list[Door]:
    """The doors a scenario drives."""
    return list(DOORS.values()) if scenario == ALL else [DOORS[scenario]]


def backend_offers_every_tool(scenario: str) -> bool:
    """Whether a scenario drives a backend (which offers every tool, `cronjob` among them)."""
    return any(d.backend for d in doors_of(scenario))


def default_tenants(scenario: str) -> int:
    """How many tenants a scenario runs unless told: the most any of its doors needs."""
    return max(d.tenants for d in doors_of(scenario))


def missing(features: Features, scenario: str) -> str | None:
    """Why `scenario` cannot be driven with these features (`all`: the first door that cannot), or None."""
    for door in doors_of(scenario):
        for feature, lack in door.needs:
            if not getattr(features, feature):
                return f"scenario {door.name}: {lack}"
    return None

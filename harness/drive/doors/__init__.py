"""Every front door into Hermes: one module per door in this package, each declaring one `DOOR`
(`base.Door`). This registry finds them; `--scenario` chooses one, or `all` (every door in turn, on one
registry and one proxy; findings keep their own scenario)."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

from harness.drive import approvals, redaction
from harness.drive.context import ALL, Context
from harness.drive.doors.base import Door
from harness.drive.features import Features


def _discover() -> dict[str, Door]:
    found = [importlib.import_module(f"{__name__}.{m.name}").DOOR
             for m in pkgutil.iter_modules(__path__) if m.name != "base"]
    return {d.name: d for d in sorted(found, key=lambda d: d.rank)}


DOORS: dict[str, Door] = _discover()


def everything(ctx: Context) -> None:
    """Every door in turn, on one registry and one proxy; findings keep their own scenario."""
    for name, door in DOORS.items():
        ctx.scenario = name
        door.drive(ctx)


#: Every scenario by name: each door, and `all`.
SCENARIOS: dict[str, Callable[[Context], None]] = {**{n: d.drive for n, d in DOORS.items()}, ALL: everything}


#: Ways into Hermes no door drives yet, and why: the front-door coverage says `out of scope` with the reason, so
#: a `clean` never stands for "not looked" (docs/doors.md).
NOT_DRIVEN: dict[str, str] = {
    "messaging platforms": "Mattermost is the `mattermost` service, driven by the gateway door's `messaging` phase "
                           "(--services mattermost); the other platforms (telegram, discord, slack, matrix...) need "
                           "their SDKs or servers, and MEDIA attachments and cron delivery through a bot are not "
                           "driven yet",
    "tool approvals": "a phase of tui and serve, not a door: `--phases approvals` (or `all,approvals`) drives an "
                      "`always` approval of one profile against the others' commands (F19); every other phase runs "
                      "with `approvals.mode: off`, and a command allowlist seeded per profile is not driven yet",
    "kanban": "the board is shared across profiles by design in Hermes 0.19.0 (`hermes_cli/kanban_db.py`, "
              "`kanban_home`: 'The kanban board is shared across profiles **by design**'; its tools show only in "
              "profiles with the `kanban` toolset and in dispatcher workers): what one profile reads of another's "
              "cards there is not a leak; a board pointer or a worker running in the wrong profile would be, and "
              "is not driven yet",
    "acp": "one profile per process in Hermes 0.19.0: `acp_adapter/` has no notion of a profile (no name, no "
           "field, no per-session home; `new_session` takes a cwd only), loads the `.env` of the home it was started "
           "in (`entry.py`) and keeps its sessions in that home's `state.db` (`session.py`), so two profiles are two "
           "`hermes -p NAME acp` processes, as with the one-shot CLI; not driven as a door yet",
    "log redaction": "a phase of serve and the gateway, not a door: `--phases redaction` (or `all,redaction`) "
                     "starts the backend with the launch profile's `security.redact_secrets: false` and every "
                     "other's true, then has each read a key-shaped secret of its own with the terminal tool; Hermes "
                     "0.19.0 reads the setting once per process (`agent/redact.py`: `_REDACT_ENABLED`); the tui "
                     "backend never honours it (every profile redacted)",
}


#: Ways into Hermes that a phase of the backends drives, not a door of their own: way -> (phase, the doors whose
#: driver runs it).
PHASE_WAYS: dict[str, tuple[str, tuple[str, ...]]] = {"tool approvals": (approvals.PHASE, approvals.DOORS),
                                                      "log redaction": (redaction.PHASE, redaction.DOORS)}


def door_states(scenario: str, phases: tuple[str, ...] | list[str] = ()) -> dict[str, str]:
    """Every door and way in: `on` (this scenario drives it), `phase NAME` (a way in one of `phases` drives, in a
    door this scenario drives), `not driven: ...` or `out of scope: ...`."""
    driven = {d.name for d in doors_of(scenario)}

    def way(name: str, why: str) -> str:
        phase, by = PHASE_WAYS.get(name, ("", ()))
        return f"phase {phase}" if phase in phases and driven & set(by) else f"out of scope: {why}"

    return {**{n: "on" if n in driven else f"not driven: --scenario {n} or all" for n in DOORS},
            **{n: way(n, why) for n, why in NOT_DRIVEN.items()}}


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

"""Every front door into Hermes: one module per door in this package, each declaring one `DOOR`
(`base.Door`). This registry finds them; `--scenario` chooses one, or `all` (every door in turn, on one
registry and one proxy; findings keep their own scenario)."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

from harness.drive import approvals, kanban, messaging, redaction
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
                           "(--services mattermost): every profile's bot, its allowlists, the files its replies name "
                           "(`MEDIA:`) and, with `--phases cron`, its cron job's output in its home channel; the other "
                           "platforms (telegram, discord, slack, matrix...) need their SDKs or servers",
    "tool approvals": "a phase of tui and serve, not a door: `--phases approvals` (or `all,approvals`) drives an "
                      "`always` approval and a `command_allowlist` seeded in one profile's config against the others' "
                      "commands (F19); every other phase runs with `approvals.mode: off`",
    "kanban": "a phase of tui and serve, not a door: `--phases kanban` (or `all,kanban`) has every profile switch to "
              "a board of its own (`/kanban boards switch`) and create cards with no board named (F34: the current "
              "board is one pointer for every profile); the boards themselves are shared by design in Hermes 0.19.0 "
              "(`hermes_cli/kanban_db.py`, `kanban_home`: 'The kanban board is shared across profiles **by design**'; "
              "the `hermes` policy allows the cards in the launch profile's kanban databases); then Hermes' dispatcher "
              "works the cards, each of which must run as its assignee; the gateway's embedded dispatcher is not "
              "driven yet",
    "webhooks": "the gateway's generic webhook platform is one listener of the launch profile in Hermes 0.19.0: a "
                "secondary profile may not configure it (`gateway/run.py`, `SecondaryPortBindingConfigError`: 'The "
                "default profile owns the single shared HTTP listener and serves every profile through the "
                "/p/<profile>/ URL prefix'), and `/p/<profile>/webhooks/<route>` runs the launch profile's route, "
                "secret and prompt as that profile (`gateway/platforms/webhook.py`, `_handle_webhook`): the routes "
                "are the install owner's by design, so a profile has no webhook secret of its own to test",
    "log redaction": "a phase of serve and the gateway, not a door: `--phases redaction` (or `all,redaction`) "
                     "starts the backend with the launch profile's `security.redact_secrets: false` and every "
                     "other's true, then has each read a key-shaped secret of its own with the terminal tool; Hermes "
                     "0.19.0 reads the setting once per process (`agent/redact.py`: `_REDACT_ENABLED`); the tui "
                     "backend never honours it (every profile redacted)",
}


#: Ways into Hermes that a phase of the backends drives, not a door of their own: way -> (phase, the doors whose
#: driver runs it).
PHASE_WAYS: dict[str, tuple[str, tuple[str, ...]]] = {"tool approvals": (approvals.PHASE, approvals.DOORS),
                                                      "log redaction": (redaction.PHASE, redaction.DOORS),
                                                      "kanban": (kanban.PHASE, kanban.DOORS),
                                                      "messaging platforms": (messaging.PHASE, messaging.DOORS)}


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

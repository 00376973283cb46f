"""Every scenario by name: how each Hermes front end is driven, phase by phase, through the proxy."""

from __future__ import annotations

from collections.abc import Callable

from harness.drive import gateway_scenario, rpc_scenario
from harness.drive.context import Context
from harness.drive.oneshot import oneshot


def everything(ctx: Context) -> None:
    """Every scenario in turn, on one registry and one proxy; findings keep their own scenario."""
    for name, driver in SCENARIOS.items():
        if name != "all":
            ctx.scenario = name
            driver(ctx)


SCENARIOS: dict[str, Callable[[Context], None]] = {
    "oneshot": oneshot,
    "tui": rpc_scenario.tui,
    "serve": rpc_scenario.serve,
    "gateway": gateway_scenario.gateway,
    "all": everything,
}

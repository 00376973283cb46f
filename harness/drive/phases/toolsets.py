"""The `toolsets` phase of the backends that serve every profile in one process (tui, serve): which tools a
profile's model is offered must follow that profile's own `toolsets` setting.

For a run with the phase, the launch profile's config enables one toolset Hermes leaves off by default
(`TOOLSET`: `toolsets: [hermes-cli, kanban]`) and every other profile's keeps Hermes' default (`[hermes-cli]`), from
the start. In the phase every tenant runs one turn (the env probe), and the tools its provider was offered in it
are read from its requests:

- a tenant whose profile does not enable the toolset that was offered its tools got them by the launch profile's
  setting: a `profile_bleed` from the launch profile, canary kind `toolsets` (entry point `toolsets`);
- the launch profile offered them is its own setting at work: the near miss, never reported; not offered them, the
  setting never took effect and the phase proved nothing (a failed turn, never a clean one);
- a tenant whose turn never reached its provider: a failed turn.

The `kanban` phase gives every profile the toolset, so the two cannot run in one audit (a usage error).
"""

from __future__ import annotations

import time

from harness.core.findings import Finding
from harness.detect.decode import loads
from harness.detect.tools import offered_tools
from harness.drive.context import Context
from harness.drive.hermes.agent import TurnResult
from harness.drive.phases.base import OPT_IN, PhaseRun, PhaseSpec
from harness.drive.surface import Plant, PlantContext, Setup, edit_config

NAME = "toolsets"
#: The doors whose driver runs the phase (`doors.rpc_doors.drive_rpc`, through `phases.run_at`).
DOORS = ("tui", "serve")
#: A toolset Hermes leaves off by default whose tools need no credential to be offered, and its tools' prefix.
TOOLSET = "kanban"
PREFIX = "kanban_"


def settings(ctx: Context, tenant: str) -> Setup:
    """What the phase adds to a tenant's config from the start: the launch profile's toolsets (nothing else)."""
    return Setup(config={"toolsets": ["hermes-cli", TOOLSET]} if tenant == ctx.sandbox.launch else {})


def offered(ctx: Context, tenant: str, since: float) -> set[str] | None:
    """The tool names `tenant`'s provider was offered in its requests since `since` (None: no request came)."""
    requests = [r for r in ctx.stubs[tenant].snapshot() if r.time >= since and r.body]
    if not requests:
        return None
    return {name for r in requests if isinstance(body := loads(r.body), dict) for name in offered_tools(body)}


def _theirs(names: set[str]) -> set[str]:
    return {n for n in names if n.startswith(PREFIX)}


def bleeds(launch: str, tools: dict[str, set[str]], scenario: str, driver: str) -> list[Finding]:
    """A finding for every tenant but `launch` that was offered the toolset's tools (`tools`: what each tenant's
    provider was offered); the launch profile's own are never one."""
    return [Finding("profile_bleed", launch, tenant, "toolsets", "request", f"{driver}:{tenant}:tools",
                    "plain", f"{len(got)} {PREFIX}* tools offered ({min(got)}, ...)", scenario=scenario, phase=NAME,
                    detail=f"{tenant!r} does not enable the {TOOLSET!r} toolset; its model was offered its tools, as "
                           f"the launch profile {launch!r} enables it")
            for tenant, names in tools.items() if tenant != launch and (got := _theirs(names))]


def run(r: PhaseRun) -> None:
    """The phase: see the module's docstring."""
    ctx, driver, turn = r.ctx, r.driver, r.turn
    launch = ctx.sandbox.launch
    tools: dict[str, set[str]] = {}
    for name in ctx.registry.names():
        since = time.time()
        turn(name)
        got = offered(ctx, name, since)
        if got is None:
            ctx.record(TurnResult(name, f"{driver}-{NAME}", False, 0.0, "its turn never reached its provider"),
                       NAME, snapshot=False)
        else:
            tools[name] = got
    if launch in tools and not _theirs(tools[launch]):
        ctx.record(TurnResult(launch, f"{driver}-{NAME}", False, 0.0,
                              f"not offered the {TOOLSET!r} toolset it enables: the setting never took effect"),
                   NAME, snapshot=False)
        return
    ctx.findings.extend(bleeds(launch, tools, ctx.scenario, driver))


def _copied(c: PlantContext) -> None:
    """The launch profile's toolsets in the target's own config: the target is then offered the toolset's tools,
    which the phase cannot tell from the launch profile's setting at work."""
    edit_config(c.target_home, lambda cfg: cfg.update(toolsets=["hermes-cli", TOOLSET]))


PHASE = PhaseSpec(NAME, "the tools a profile's model is offered must follow its own `toolsets` setting", rank=110,
                  doors=DOORS, selection=OPT_IN, plant="toolsets-copied", settings=settings, run=run,
                  plants={"toolsets-copied": Plant(_copied, frozenset({"profile_bleed"}))})

"""The `redaction` phase of `hermes serve` and the multiplexed gateway, the backends that serve every profile in one
process and honour the setting: each profile's `security.redact_secrets` must govern what its own tools hand its
model.

Hermes reads the setting once, when the process starts (the launch profile's config or `.env`). The tui backend
(0.19.0) never honours it: `tui_gateway/server.py` imports `agent.redact` (through `agent.replay_cleanup`) before
it loads the launch profile's `.env`, and reads no `security.redact_secrets`, so every profile there is redacted,
Hermes' default, whatever it says: the phase has nothing to switch off there and does not run.

For a run with the phase, the launch profile says `security.redact_secrets: false` (and `HERMES_REDACT_SECRETS=false`
in its `.env`) and every other profile `true`, Hermes' default, from the start. In the phase every tenant reads, with
the terminal tool, a file of its own workdir holding a secret of its own shaped like a provider key (`sk-...`, a
canary minted for the phase, kind `redaction_key`), and the tool result its provider receives is read:

- a tenant whose profile says `true` that received its secret unmasked was governed by the launch profile's setting:
  a `profile_bleed` from the launch profile, canary kind `redaction` (entry point `redaction`);
- the launch profile's own secret unmasked is its own setting at work: the near miss, never reported; masked, the
  switch never took effect and the phase proved nothing (a failed turn, never a clean one);
- a tenant whose tool result never reached its provider: a failed turn.

Hermes' masker keeps the first 6 and last 4 characters of a long key; the secret is longer than that, so a masked
result never holds it whole.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from harness.capture.stubs.provider import ToolStep, probe_step
from harness.core.findings import Finding
from harness.core.protocol import placeholder
from harness.core.registry import new_tag
from harness.drive import battery
from harness.drive.context import Context
from harness.drive.hermes.agent import TurnResult
from harness.drive.phases.base import OPT_IN, PhaseRun, PhaseSpec
from harness.drive.surface import Plant, PlantContext, Setup, edit_config, set_env

NAME = "redaction"
#: The doors whose driver runs the phase (`doors.rpc_doors.drive_rpc` and the gateway door, through `phases.run_at`;
#: not tui: see above).
DOORS = ("serve", "gateway")
KIND = "redaction_key"
#: The first line of the file the phase reads: what tells its terminal result from the turn's env probe.
MARKER = "tenancy-redaction-phase"


def settings(ctx: Context, tenant: str) -> Setup:
    """What the phase adds to a tenant's config and `.env` from the start."""
    on = tenant != ctx.sandbox.launch
    return Setup(config={"security": {"redact_secrets": on}}, env={"HERMES_REDACT_SECRETS": str(on).lower()})


def secret() -> str:
    """A provider-key-shaped secret: Hermes' masker matches `sk-` and 10 or more key characters (the tag: hex)."""
    return f"sk-tenancy{new_tag()}"


def unmasked(ctx: Context, tenant: str, value: str, since: float) -> bool | None:
    """Whether the phase's terminal result `tenant`'s provider received since `since` holds `value` whole (None:
    it never reached it)."""
    seen = [text for name, doc in battery.tool_results(ctx, tenant, since)
            if name == "terminal" and MARKER in (text := json.dumps(doc))]
    return any(value in text for text in seen) if seen else None


def bleeds(launch: str, shown: dict[str, bool], scenario: str, driver: str,
           kinds: dict[str, str] | None = None) -> list[Finding]:
    """A finding for every tenant but `launch` whose secret reached its model unmasked (`shown`; `kinds`: the kind
    each tenant's secret was minted as, `KIND` unless the registry already held one)."""
    return [Finding("profile_bleed", launch, tenant, "redaction", "request", f"{driver}:{tenant}:tool terminal",
                    "plain", f"{placeholder(tenant, (kinds or {}).get(tenant, KIND))} unmasked in its terminal result",
                    tool="terminal",
                    scenario=scenario, phase=NAME,
                    detail=f"{tenant!r} says security.redact_secrets: true; its own key-shaped secret reached its "
                           f"model unmasked, under the launch profile {launch!r}'s false")
            for tenant, raw in shown.items() if tenant != launch and raw]


def _read(ctx: Context, tenant: str, turn: Callable[[str], None]) -> tuple[bool | None, str]:
    """One turn of `tenant` reading a file of its own workdir that holds a new secret of its own: whether its
    model got it whole (`unmasked`), and the kind it was minted as."""
    t = ctx.registry[tenant]
    value = secret()
    kind = ctx.mint(tenant, KIND, value)
    path = Path(t.canaries["workdir"]) / f"{kind}.txt"
    path.write_text(f"{MARKER}\nOPENAI_API_KEY={value}\n")
    since = time.time()
    with battery.scripted(ctx, {tenant: [[probe_step(t)], [ToolStep("terminal", {"command": f"cat {path}"})]]}):
        turn(tenant)
    return unmasked(ctx, tenant, value, since), kind


def run(r: PhaseRun) -> None:
    """The phase: see the module's docstring."""
    ctx, driver, turn = r.ctx, r.driver, r.turn
    launch = ctx.sandbox.launch
    read = {name: _read(ctx, name, turn) for name in ctx.registry.names()}
    shown = {name: raw for name, (raw, _) in read.items()}
    if shown.get(launch) is not True:
        why = ("its terminal result never reached its provider" if shown.get(launch) is None
               else "its secret was masked: security.redact_secrets: false never took effect")
        ctx.record(TurnResult(launch, f"{driver}-{NAME}", False, 0.0, why), NAME, snapshot=False)
        return
    for name, raw in shown.items():
        if raw is None:
            ctx.record(TurnResult(name, f"{driver}-{NAME}", False, 0.0,
                                  "its terminal result never reached its provider"), NAME, snapshot=False)
    ctx.findings.extend(bleeds(launch, {n: bool(raw) for n, raw in shown.items()}, ctx.scenario, driver,
                               {name: kind for name, (_, kind) in read.items()}))


def _off(c: PlantContext) -> None:
    """The target's own redaction off, as the launch profile's is: its secret then shows unmasked, which the phase
    cannot tell from the launch profile's setting at work."""
    edit_config(c.target_home, lambda cfg: cfg.setdefault("security", {}).update(redact_secrets=False))
    set_env(c.target_home, "HERMES_REDACT_SECRETS", "false")


PHASE = PhaseSpec(NAME, "the launch profile's `security.redact_secrets: false` must not unmask another profile's "
                  "secrets", rank=100, doors=DOORS, selection=OPT_IN, way="log redaction", plant="redaction-off",
                  settings=settings, run=run,
                  plants={"redaction-off": Plant(_off, frozenset({"profile_bleed"}))})

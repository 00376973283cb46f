"""The `approvals` phase of the backends that serve every profile in one process (tui, serve): an approval one
profile gives for good ("always") must not approve another profile's commands.

For the phase every tenant's config says `approvals.mode: manual` (and `off` again after it, as for every other
phase). The first tenant that is not the launch profile runs a command Hermes asks about (a recursive delete of a
scratch folder in its own workdir) and answers the approval request "always"; then every other tenant runs the
same kind of command in its own workdir, answering "once", and must be asked: a command that ran unasked ran on
the first tenant's approval (`profile_bleed`, canary kind `approval`). The first tenant's own second command
running unasked is its own "always" at work, the near miss, never reported. A first tenant that is not asked at
all means approvals were not active: a failed turn (the phase proved nothing), never a clean one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from harness.capture.stubs.provider import ToolStep, probe_step
from harness.core.findings import Finding
from harness.core.registry import new_tag
from harness.drive import battery
from harness.drive.backends import RpcBackend
from harness.drive.context import Context
from harness.drive.hermes import TurnResult

PHASE = "approvals"
#: The doors whose driver runs the phase (`rpc_phases.drive_rpc`).
DOORS = ("tui", "serve")


def _set_mode(ctx: Context, mode: str) -> None:
    """`approvals.mode` in every tenant's config.yaml (Hermes reads it per command, its cache keyed on the file)."""
    for t in ctx.registry:
        path = ctx.sandbox.home_of(t.name) / "config.yaml"
        cfg = yaml.safe_load(path.read_text()) or {}
        cfg["approvals"] = {**(cfg.get("approvals") or {}), "mode": mode}
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))


def _asked(ctx: Context, backend: RpcBackend, tenant: str, choice: str, turn: Callable[[str], None]) -> int:
    """One turn of `tenant` deleting a scratch folder of its own workdir (after the env probe), its approval
    requests answered `choice`: how many it was asked."""
    t = ctx.registry[tenant]
    scratch = Path(t.canaries["workdir"]) / f"approval-{new_tag()}"
    scratch.mkdir(parents=True, exist_ok=True)
    before = backend.asked[tenant]
    backend.choices[tenant] = choice
    try:
        delete = ToolStep("terminal", {"command": f"rm -rf {scratch}"})
        with battery.scripted(ctx, {tenant: [[probe_step(t)], [delete]]}):
            turn(tenant)
    finally:
        backend.choices.pop(tenant, None)
    return backend.asked[tenant] - before


def bleeds(first: str, asked: dict[str, int], scenario: str, driver: str) -> list[Finding]:
    """A finding for every tenant but `first` whose command ran unasked after `first` answered "always" (`asked`:
    approval requests per tenant in its turn after that answer); `first`'s own count is never a finding."""
    return [Finding("profile_bleed", first, tenant, "approval", "rpc", f"{driver}:approval.request", "plain",
                    "rm -rf <scratch of its own workdir> ran without an approval request", tool="terminal",
                    scenario=scenario, phase=PHASE,
                    detail=f"{first!r} answered a recursive delete 'always'; {tenant!r}'s recursive delete then "
                           "ran unasked, on that approval")
            for tenant, n in asked.items() if tenant != first and n == 0]


def run(ctx: Context, backend: RpcBackend, driver: str, turn: Callable[[str], None]) -> None:
    """The phase: see the module's docstring."""
    names = ctx.registry.names()
    first = next(n for n in names if n != ctx.sandbox.launch)
    _set_mode(ctx, "manual")
    try:
        if not _asked(ctx, backend, first, "always", turn):
            ctx.record(TurnResult(first, f"{driver}-{PHASE}", False, 0.0,
                                  "never asked to approve a recursive delete: approvals were not active"), PHASE,
                       snapshot=False)
            return
        at = names.index(first)
        asked = {name: _asked(ctx, backend, name, "once", turn) for name in names[at + 1:] + names[:at]}
        asked[first] = _asked(ctx, backend, first, "once", turn)  # its own "always": the near miss
        ctx.findings.extend(bleeds(first, asked, ctx.scenario, driver))
    finally:
        _set_mode(ctx, "off")

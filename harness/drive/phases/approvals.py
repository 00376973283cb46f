"""The `approvals` phase of the backends that serve every profile in one process (tui, serve): an approval one
profile gives for good ("always"), or a command allowlist in one profile's config, must not approve another
profile's commands.

For the phase every tenant's config says `approvals.mode: manual` (and `off` again after it, as for every other
phase). The first tenant that is not the launch profile (the phase's first tenant) is the only one whose config
seeds a `command_allowlist`, from the start: a glob naming a world-writable `chmod` of a folder whose name marks it
(`ALLOWLIST`). The phase then has two parts, each run by every tenant in its own workdir:

- `always`: the first tenant runs a command Hermes asks about (a recursive delete of a scratch folder) and answers
  the approval request "always"; then every other tenant runs the same kind of command, answering "once";
- `allowlist`: every other tenant, then the first, runs the `chmod` its allowlist names, answering "once".

Every other tenant must be asked in both: a command that ran unasked ran on the first tenant's approval or
allowlist (`profile_bleed`, canary kind `approval` or `command_allowlist`). The first tenant's own command running
unasked is its own "always" or allowlist at work, the near miss, never reported. A first tenant that is asked where
its own approval or allowlist should have let it run, or is never asked at all, means the part proved nothing: a
failed turn, never a clean one; unless its config already holds its "always" from an earlier door of `--scenario all`
(whose homes every door shares), which is what the part needs in force.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from harness.capture.stubs.provider import ToolStep, probe_step
from harness.core.findings import Finding
from harness.core.registry import new_tag
from harness.drive import battery
from harness.drive.context import Context
from harness.drive.hermes.agent import TurnResult
from harness.drive.hermes.rpc import RpcBackend
from harness.drive.phases.base import OPT_IN, PhaseRun, PhaseSpec
from harness.drive.surface import Plant, PlantContext, Setup, edit_config

NAME = "approvals"
#: The doors whose driver runs the phase (`doors.rpc_doors.drive_rpc`, through `phases.run_at`).
DOORS = ("tui", "serve")
#: The two parts of the phase: the command each runs in a scratch folder of the tenant's workdir (its name's stem),
#: and the canary kind of a command of another tenant that ran unasked.
ALWAYS = ("rm -rf {}", "approval", "approval")
SEEDED = ("chmod 777 {}", "allowlisted", "command_allowlist")
#: The first tenant's `command_allowlist` (a glob, as a user writes `podman *`): it names the `chmod` of a folder
#: whose name starts `allowlisted-`, in any workdir.
ALLOWLIST = "chmod 777 *allowlisted-*"


def first_tenant(ctx: Context) -> str:
    """The phase's first tenant: the first that is not the launch profile."""
    return next(n for n in ctx.registry.names() if n != ctx.sandbox.launch)


def settings(ctx: Context, tenant: str) -> Setup:
    """What the phase adds to a tenant's config from the start: the first tenant's allowlist (nothing else)."""
    return Setup(config={"command_allowlist": [ALLOWLIST]} if tenant == first_tenant(ctx) else {})


def saved_always(home: Path) -> bool:
    """Whether the profile's config already holds an approval Hermes saved for good (a `command_allowlist` entry
    the phase did not seed): in `--scenario all` the homes outlive a door, so the first tenant's "always" of an
    earlier door's phase is still its own in the next, and its recursive delete runs unasked there."""
    path = home / "config.yaml"
    cfg = (yaml.safe_load(path.read_text()) if path.is_file() else None) or {}
    return any(p != ALLOWLIST for p in cfg.get("command_allowlist") or [])


def set_mode(ctx: Context, mode: str) -> None:
    """`approvals.mode` in every tenant's config.yaml (Hermes reads it per command, its cache keyed on the file)."""
    for t in ctx.registry:
        path = ctx.sandbox.home_of(t.name) / "config.yaml"
        cfg = yaml.safe_load(path.read_text()) or {}
        cfg["approvals"] = {**(cfg.get("approvals") or {}), "mode": mode}
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))


def _asked(ctx: Context, backend: RpcBackend, tenant: str, choice: str, turn: Callable[[str], None],
           part: tuple[str, str, str]) -> int:
    """One turn of `tenant` running `part`'s command on a scratch folder of its own workdir (after the env probe),
    its approval requests answered `choice`: how many it was asked."""
    command, stem, _ = part
    t = ctx.registry[tenant]
    scratch = Path(t.canaries["workdir"]) / f"{stem}-{new_tag()}"
    scratch.mkdir(parents=True, exist_ok=True)
    before = backend.asked[tenant]
    backend.choices[tenant] = choice
    try:
        step = ToolStep("terminal", {"command": command.format(scratch)})
        with battery.scripted(ctx, {tenant: [[probe_step(t)], [step]]}):
            turn(tenant)
    finally:
        backend.choices.pop(tenant, None)
    return backend.asked[tenant] - before


def bleeds(first: str, asked: dict[str, int], scenario: str, driver: str, part: tuple[str, str, str] = ALWAYS
           ) -> list[Finding]:
    """A finding for every tenant but `first` whose `part` command ran unasked (`asked`: approval requests per
    tenant in its turn of that part, after `first` answered "always" or with `first`'s allowlist seeded); `first`'s
    own count is never a finding."""
    command, stem, kind = part
    shown = command.format(f"<{stem}-* of its own workdir>")
    why = ("answered a recursive delete 'always'" if part == ALWAYS
           else f"has {ALLOWLIST!r} in its config's command_allowlist")
    return [Finding("profile_bleed", first, tenant, kind, "rpc", f"{driver}:approval.request", "plain",
                    f"{shown} ran without an approval request", tool="terminal", scenario=scenario, phase=NAME,
                    detail=f"{first!r} {why}; {tenant!r}'s {command.split()[0]} then ran unasked, on that "
                           f"{'approval' if part == ALWAYS else 'allowlist'}")
            for tenant, n in asked.items() if tenant != first and n == 0]


def _failed(ctx: Context, tenant: str, driver: str, why: str) -> None:
    ctx.record(TurnResult(tenant, f"{driver}-{NAME}", False, 0.0, why), NAME, snapshot=False)


def run(r: PhaseRun) -> None:
    """The phase: see the module's docstring."""
    ctx, backend, driver, turn = r.ctx, r.backend, r.driver, r.turn
    assert backend is not None, "the approvals phase needs its door's JSON-RPC backend"
    names = ctx.registry.names()
    first = first_tenant(ctx)
    at = names.index(first)
    others = names[at + 1:] + names[:at]
    set_mode(ctx, "manual")
    try:
        if not _asked(ctx, backend, first, "always", turn, ALWAYS) and not saved_always(ctx.sandbox.home_of(first)):
            _failed(ctx, first, driver, "never asked to approve a recursive delete: approvals were not active")
            return
        asked = {name: _asked(ctx, backend, name, "once", turn, ALWAYS) for name in others}
        asked[first] = _asked(ctx, backend, first, "once", turn, ALWAYS)  # its own "always": the near miss
        ctx.findings.extend(bleeds(first, asked, ctx.scenario, driver))
        asked = {name: _asked(ctx, backend, name, "once", turn, SEEDED) for name in others}
        if _asked(ctx, backend, first, "once", turn, SEEDED):  # its own allowlist: the near miss
            _failed(ctx, first, driver, f"asked to approve what its command_allowlist {ALLOWLIST!r} names: the "
                                        "allowlist was not in effect")
            return
        ctx.findings.extend(bleeds(first, asked, ctx.scenario, driver, SEEDED))
    finally:
        set_mode(ctx, "off")


def _allowlist(c: PlantContext) -> None:
    """The first tenant's command allowlist (the target's) in the launch profile's config too: the launch profile's
    seeded command then runs unasked, as if another profile's allowlist had let it through."""
    edit_config(Path(str(c.donor.home)), lambda cfg: cfg.update(command_allowlist=[ALLOWLIST]))


PHASE = PhaseSpec(NAME, "an approval one profile gives for good, or its command allowlist, must not approve another "
                  "profile's commands", rank=90, doors=DOORS, selection=OPT_IN, way="tool approvals",
                  plant="approvals-allowlist", settings=settings, run=run,
                  plants={"approvals-allowlist": Plant(_allowlist, frozenset({"profile_bleed"}))})

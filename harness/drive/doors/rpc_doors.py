"""The front doors where ONE Hermes process serves every tenant over JSON-RPC (`doors.tui`: stdio, `doors.serve`:
websocket): the phases they share, driven by `drive_rpc`.

Phases (each followed by the same invariants, findings tagged with their phase):
- `cron` (serve, when asked for): a due job seeded in every profile with Hermes' own cron API before the
  backend starts; the ticker must fire each one (a job that never fires is a `shortfall`). It runs first,
  alone: a job running next to the turns would share its tenant's scripted stub and race them;
- `turns`: interleaved turns across all tenants, the first running the tool battery's write plan;
- `lookups`: every tenant's turn asks the tools for another tenant's identifiers (`battery`);
- `settings`: `config.set` / `model.save_key` addressed to one profile must change only its files, and
  `session.create` must report the addressed profile's model, cwd and name (`profile_bleed`);
- `after-settings`: another round of turns (does a settings write leak into later turns?);
- the opt-in phases these doors run at one place (`phases.run_at`, when asked for: `approvals`, `toolsets`,
  `kanban`, and on serve `redaction`), each a module of `harness.drive.phases`;
- `profiles`: a profile created and deleted next to the live backend (its PID must not change);
- `resume`: the backend restarted, every stored session resumed in its own profile.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from harness.core.findings import Finding
from harness.core.protocol import PROMPT
from harness.detect.session_info import foreign_fields
from harness.drive import battery, phases
from harness.drive.context import Context
from harness.drive.hermes.agent import TurnResult
from harness.drive.hermes.rpc import BackendError, RpcBackend
from harness.drive.phases import wanted
from harness.drive.phases.base import PhaseRun
from harness.drive.phases.cron import seed_cron, wait_cron
from harness.drive.phases.profiles import profiles
from harness.drive.phases.settings import run_settings


def _turn(ctx: Context, backend: RpcBackend, tenant: str, sid: str, phase: str, driver: str) -> None:
    started = time.monotonic()
    try:
        ok, detail = backend.turn(sid, PROMPT, timeout=ctx.opts.timeout)
    except BackendError as exc:
        ok, detail = False, str(exc)
    ctx.record(TurnResult(tenant, driver, ok, time.monotonic() - started, detail), phase)


def _check_session_info(ctx: Context, tenant: str, info: dict[str, Any], where: str) -> None:
    """`session.create`/`session.resume` must describe the addressed profile, not the launch profile
    (`detect.session_info`)."""
    for field, got in foreign_fields(ctx.registry[tenant], info):
        shown = ctx.matcher().redact_text(str(got))
        ctx.findings.append(Finding(
            "profile_bleed", tenant, tenant, {"cwd": "workdir"}.get(field, field), "rpc", where, "plain",
            f"{field}={shown}", scenario=ctx.scenario, phase=ctx.current_phase,
            detail=f"{where} reported {field} {shown!r} for profile {tenant!r}",
        ))


def drive_rpc(ctx: Context, make: Callable[[], RpcBackend], driver: str, cron: bool) -> None:
    launch = ctx.sandbox.launch
    names = ctx.registry.names()
    if cron and wanted(ctx, "cron"):
        seed_cron(ctx)
    backend = make()
    stored: dict[str, str] = {}
    started = time.time()
    try:
        if cron and wanted(ctx, "cron"):
            with ctx.phase("cron"):
                wait_cron(ctx, ctx.opts.cron_wait, driver, started)
        with ctx.phase("turns"):
            sessions = {}
            for name in names:
                info = backend.create_session(name, launch)
                sessions[name] = info["session_id"]
                stored[name] = info.get("stored_session_id") or ""
                _check_session_info(ctx, name, info.get("info") or {}, f"{driver}:session.create")
            if wanted(ctx, "turns"):
                battery.write_turns(ctx, lambda name: _turn(ctx, backend, name, sessions[name], "turns", driver))
                for _ in range(ctx.opts.turns - 1):
                    for name in names:
                        _turn(ctx, backend, name, sessions[name], "turns", driver)
        if battery.enabled(ctx) and wanted(ctx, "lookups"):
            with ctx.phase("lookups"):
                battery.lookup_turns(ctx, lambda name: _turn(ctx, backend, name, sessions[name], "lookups", driver),
                                     started, {name: [sid] for name, sid in stored.items() if sid})
        if wanted(ctx, "settings"):
            with ctx.phase("settings"):
                run_settings(ctx, backend, sessions, driver)
        if wanted(ctx, "after-settings"):
            with ctx.phase("after-settings"):
                for name in names:
                    _turn(ctx, backend, name, sessions[name], "after-settings", driver)
        phases.run_at(ctx, ctx.scenario, PhaseRun(
            ctx, driver, lambda name: _turn(ctx, backend, name, sessions[name], ctx.current_phase or "", driver),
            backend, sessions))
        if wanted(ctx, "profiles"):
            with ctx.phase("profiles"):
                profiles(ctx, backend.pid, backend.proc, driver)
    finally:
        backend.close()
    if wanted(ctx, "resume"):
        with ctx.phase("resume"):
            backend = make()
            try:
                for name in names:
                    if not stored.get(name):
                        continue
                    try:
                        info = backend.resume_session(name, launch, stored[name])
                    except BackendError as exc:
                        ctx.record(TurnResult(name, f"{driver}-resume", False, 0.0, str(exc)), "resume")
                        continue
                    _check_session_info(ctx, name, info.get("info") or {}, f"{driver}:session.resume")
                    if info.get("session_id"):
                        _turn(ctx, backend, name, info["session_id"], "resume", driver)
            finally:
                backend.close()

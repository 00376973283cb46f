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
- `approvals` (when asked for): an "always" approval given in one profile must not approve another profile's
  commands (`drive.approvals`);
- `kanban` (when asked for): one profile's switch of its current kanban board must not move another profile's next
  card (`drive.kanban`);
- `toolsets` (when asked for): the tools a profile's model is offered must follow its own `toolsets` setting
  (`drive.toolsets`);
- `profiles`: a profile created and deleted next to the live backend (its PID must not change);
- `resume`: the backend restarted, every stored session resumed in its own profile.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.core.findings import Finding
from harness.core.protocol import PROMPT
from harness.core.registry import new_tag
from harness.detect.session_info import foreign_fields
from harness.drive import approvals, battery, kanban, redaction, toolsets
from harness.drive.backends import BackendError, RpcBackend
from harness.drive.context import Context
from harness.drive.hermes import TurnResult
from harness.drive.phases import profiles, seed_cron, wait_cron, wanted


def _fingerprint_files(ctx: Context) -> dict[str, str]:
    """Digest of every settings file of every tenant home (config.yaml, .env), by path."""
    out = {}
    for t in ctx.registry:
        for name in ("config.yaml", ".env"):
            path = ctx.sandbox.home_of(t.name) / name
            out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "-"
    return out


def _owner_of_path(ctx: Context, path: str) -> str:
    p = Path(path)
    for t in ctx.registry:
        if t.name != ctx.sandbox.launch and p.is_relative_to(ctx.sandbox.home_of(t.name)):
            return t.name
    return ctx.sandbox.launch


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
                _settings(ctx, backend, sessions, driver)
        if wanted(ctx, "after-settings"):
            with ctx.phase("after-settings"):
                for name in names:
                    _turn(ctx, backend, name, sessions[name], "after-settings", driver)
        if wanted(ctx, approvals.PHASE):
            with ctx.phase(approvals.PHASE):
                approvals.run(ctx, backend, driver,
                              lambda name: _turn(ctx, backend, name, sessions[name], approvals.PHASE, driver))
        if wanted(ctx, redaction.PHASE) and ctx.scenario in redaction.DOORS:
            with ctx.phase(redaction.PHASE):
                redaction.run(ctx, driver,
                              lambda name: _turn(ctx, backend, name, sessions[name], redaction.PHASE, driver))
        if wanted(ctx, toolsets.PHASE):
            with ctx.phase(toolsets.PHASE):
                toolsets.run(ctx, driver,
                             lambda name: _turn(ctx, backend, name, sessions[name], toolsets.PHASE, driver))
        if wanted(ctx, kanban.PHASE):
            with ctx.phase(kanban.PHASE):
                kanban.run(ctx, backend, sessions, driver,
                           lambda name: _turn(ctx, backend, name, sessions[name], kanban.PHASE, driver))
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


def _settings(ctx: Context, backend: RpcBackend, sessions: dict[str, str], driver: str) -> None:
    """Settings writes addressed to one non-launch profile must change only that profile's files."""
    target = ctx.registry.names()[1]
    tag = new_tag()
    workdir = str(Path(ctx.registry[target].canaries["workdir"]).parent / f"work-set-{target}-{tag}")
    key = f"sk-saved-{target}-{tag}"
    Path(workdir).mkdir(parents=True, exist_ok=True)
    ctx.mint(target, "workdir_set", workdir)
    ctx.mint(target, "saved_key", key)
    before = _fingerprint_files(ctx)
    sid = sessions[target]
    writes = [("config.set", {"session_id": sid, "key": "cwd", "value": workdir}),
              ("config.set", {"session_id": sid, "key": "yolo", "value": "on", "scope": "global"}),
              ("model.save_key", {"session_id": sid, "slug": "deepseek", "api_key": key})]
    for method, params in writes:
        try:
            reply = backend.call(method, params, tenant=target, timeout=60)
        except BackendError as exc:
            reply = {"error": str(exc)}
        state = "ok" if "result" in reply else f"error: {str(reply.get('error'))[:100]}"
        ctx.say(f"  {target:<10} {method} {params.get('key', params.get('slug'))}: {state}")
    after = _fingerprint_files(ctx)
    for path, digest in after.items():
        owner = _owner_of_path(ctx, path)
        if digest != before.get(path) and owner != target:
            ctx.findings.append(Finding(
                "profile_bleed", target, owner, "settings", "file", f"{Path(path).name} of {owner}", None,
                f"{Path(path).name} changed", scenario=ctx.scenario, phase="settings",
                detail=f"a settings write addressed to {target!r} over {driver} changed {owner!r}'s {Path(path).name}",
            ))


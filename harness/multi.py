"""Scenarios where ONE Hermes process serves every tenant: `tui`, `serve`, `gateway`.

Phases (each followed by the same invariants, findings tagged with their phase):
- `turns`: interleaved turns across all tenants;
- `settings`: `config.set` / `model.save_key` addressed to one profile must change only its files, and
  `session.create` must report the addressed profile's model, cwd and name (`profile_bleed`);
- `after-settings`: another round of turns (does a settings write leak into later turns?);
- `profiles`: a profile created and deleted next to the live backend (its PID must not change);
- `resume`: the backend restarted, every stored session resumed in its own profile;
- `cron` (serve, gateway): a due job seeded in every profile with Hermes' own cron API; the ticker must
  fire each one (a job that never fires is a `shortfall`);
- `route-auth` (gateway): every tenant's API-server key tried on every tenant's route (`route_auth`).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.backends import BackendError, GatewayBackend, RpcBackend, ServeBackend, TuiBackend
from harness.findings import Finding
from harness.hermes import TurnResult
from harness.registry import new_tag
from harness.scenarios import PROMPT, Context

CRON_SEED = (
    "import sys, json; from cron.jobs import create_job, trigger_job, list_jobs; "
    "jobs = [j for j in list_jobs(include_disabled=True) if j.get('name') == 'tenancy-canary']; "
    "j = jobs[0] if jobs else create_job(sys.argv[1], '30m', name='tenancy-canary', repeat=1, deliver='local'); "
    "trigger_job(j['id']); print(json.dumps({'id': j['id']}))"
)
DEFAULT_PHASES = ("turns", "settings", "after-settings", "profiles", "resume", "route-auth")
ALL_PHASES = (*DEFAULT_PHASES, "cron")


def _wanted(ctx: Context, phase: str) -> bool:
    return phase in (ctx.opts.phases or DEFAULT_PHASES)


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
    """`session.create`/`session.resume` must describe the addressed profile, not the launch profile."""
    t = ctx.registry[tenant]
    expected = {"model": t.model, "cwd": t.canaries["workdir"], "profile_name": tenant}
    for field, want in expected.items():
        got = info.get(field)
        if got != want:
            shown = ctx.matcher().redact_text(str(got))
            ctx.findings.append(Finding(
                "profile_bleed", tenant, tenant, {"cwd": "workdir"}.get(field, field), "rpc", where, "plain",
                f"{field}={shown}", scenario=ctx.scenario, phase=ctx.current_phase,
                detail=f"{where} reported {field} {shown!r} for profile {tenant!r}",
            ))


def seed_cron(ctx: Context) -> None:
    """A due job in every profile's own cron store (Hermes' cron.jobs API, HERMES_HOME = that profile)."""
    for t in ctx.registry:
        prompt = f"{t.canaries['cron_prompt']}: {PROMPT}"
        home = ctx.sandbox.home_of(t.name)
        rc, _, err = ctx.hermes.procs.run([str(ctx.hermes.python), "-c", CRON_SEED, prompt],
                                          env=ctx.hermes.env({"HERMES_HOME": str(home)}), cwd=ctx.sandbox.home,
                                          timeout=120)
        if rc != 0:
            raise BackendError(f"seeding the cron job of {t.name} failed: {err.strip()[-200:]}")


def wait_cron(ctx: Context, seconds: float, driver: str) -> None:
    """Wait for every tenant's cron prompt to reach its provider; a job that never fires is a shortfall."""
    started = time.monotonic()
    fired: dict[str, float] = {}
    while time.monotonic() - started < seconds and len(fired) < len(ctx.registry.names()):
        for t in ctx.registry:
            if t.name not in fired and any(t.canaries["cron_prompt"].encode() in r.body
                                           for r in ctx.stubs[t.name].snapshot()):
                fired[t.name] = time.monotonic() - started
        time.sleep(0.5)
    time.sleep(3)  # let a fired job's follow-up calls finish
    for t in ctx.registry:
        ok = t.name in fired
        detail = "" if ok else f"cron job never fired within {seconds:.0f}s"
        ctx.record(TurnResult(t.name, f"{driver}-cron", ok, fired.get(t.name, seconds), detail), "cron")


def _rpc_scenario(ctx: Context, make: Callable[[], RpcBackend], driver: str, cron: bool) -> None:
    launch = ctx.sandbox.launch
    names = ctx.registry.names()
    if cron and _wanted(ctx, "cron"):
        seed_cron(ctx)
    backend = make()
    stored: dict[str, str] = {}
    try:
        with ctx.phase("turns"):
            sessions = {}
            for name in names:
                info = backend.create_session(name, launch)
                sessions[name] = info["session_id"]
                stored[name] = info.get("stored_session_id") or ""
                _check_session_info(ctx, name, info.get("info") or {}, f"{driver}:session.create")
            if _wanted(ctx, "turns"):
                for _ in range(ctx.opts.turns):
                    for name in names:
                        _turn(ctx, backend, name, sessions[name], "turns", driver)
        if cron and _wanted(ctx, "cron"):
            with ctx.phase("cron"):
                wait_cron(ctx, ctx.opts.cron_wait, driver)
        if _wanted(ctx, "settings"):
            with ctx.phase("settings"):
                _settings(ctx, backend, sessions, driver)
        if _wanted(ctx, "after-settings"):
            with ctx.phase("after-settings"):
                for name in names:
                    _turn(ctx, backend, name, sessions[name], "after-settings", driver)
        if _wanted(ctx, "profiles"):
            with ctx.phase("profiles"):
                _profiles(ctx, backend.pid, backend.proc, driver)
    finally:
        backend.close()
    if _wanted(ctx, "resume"):
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


def _profiles(ctx: Context, pid: int | None, proc: Any, driver: str) -> None:
    """Create and delete a profile next to the live backend; the backend must survive unchanged."""
    name = f"scratch{new_tag()[-6:]}"
    ok = True
    detail = ""
    for argv in (["profile", "create", name], ["profile", "delete", "-y", name]):
        rc, out, err = ctx.hermes.procs.run([str(ctx.hermes.python), "-m", "hermes_cli.main", *argv],
                                            env=ctx.hermes.env(), cwd=ctx.sandbox.home, timeout=120)
        if rc != 0:
            ok, detail = False, f"hermes {' '.join(argv)} failed: {(err or out).strip()[-160:]}"
    if proc is None or proc.poll() is not None or proc.pid != pid:
        ok, detail = False, f"the {driver} backend (pid {pid}) did not survive profile create/delete"
    ctx.record(TurnResult(ctx.sandbox.launch, f"{driver}-profiles", ok, 0.0, detail), "profiles", snapshot=False)


def tui(ctx: Context) -> None:
    log = ctx.rpc_log("tui")
    _rpc_scenario(ctx, lambda: TuiBackend(ctx.hermes, log, ctx.out / "logs" / "backend-tui.log").start(), "tui",
                  cron=False)


def serve(ctx: Context) -> None:
    log = ctx.rpc_log("serve")
    _rpc_scenario(ctx, lambda: ServeBackend(ctx.hermes, log, ctx.out / "logs" / "backend-serve.log").start(),
                  "serve", cron=True)


def gateway_config(port: int, key: str) -> dict[str, Any]:
    """Launch-profile config that turns on the multiplexed gateway's API server on 127.0.0.1."""
    return {"gateway": {"multiplex_profiles": True},
            "platforms": {"api_server": {"enabled": True, "extra": {"host": "127.0.0.1", "port": port, "key": key}}}}


def gateway(ctx: Context) -> None:
    launch = ctx.sandbox.launch
    names = ctx.registry.names()
    log = ctx.rpc_log("gateway")
    if _wanted(ctx, "cron"):
        seed_cron(ctx)
    gw = GatewayBackend(ctx.hermes, ctx.gateway_port, log, ctx.out / "logs" / "backend-gateway.log").start()
    try:
        launch_key = ctx.registry[launch].canaries["api_server_key"]
        if _wanted(ctx, "route-auth"):
            with ctx.phase("route-auth"):
                _route_auth(ctx, gw)
        with ctx.phase("turns"):
            for _ in range(ctx.opts.turns):
                for name in names:
                    _gateway_turn(ctx, gw, name, launch_key, "turns")
        if _wanted(ctx, "cron"):
            with ctx.phase("cron"):
                wait_cron(ctx, ctx.opts.cron_wait, "gateway")
        if _wanted(ctx, "profiles"):
            with ctx.phase("profiles"):
                _profiles(ctx, gw.pid, gw.proc, "gateway")
    finally:
        gw.close()


def _gateway_turn(ctx: Context, gw: GatewayBackend, name: str, launch_key: str, phase: str) -> None:
    """One chat turn on the tenant's route with its own key; Hermes has no per-profile API-server key,
    so a rejected own key is retried with the launch key (the rejection is already a route_auth finding)."""
    path = gw.route(name, ctx.sandbox.launch, "/v1/chat/completions")
    body = {"model": ctx.registry[name].model, "messages": [{"role": "user", "content": PROMPT}]}
    started = time.monotonic()
    status, payload = gw.request("POST", path, ctx.registry[name].canaries["api_server_key"], body, tenant=name,
                                 timeout=ctx.opts.timeout)
    if status == 401 and name != ctx.sandbox.launch:
        status, payload = gw.request("POST", path, launch_key, body, tenant=name, timeout=ctx.opts.timeout)
    ok = status == 200
    detail = "" if ok else f"HTTP {status}: {json.dumps(payload)[:160]}"
    ctx.record(TurnResult(name, "gateway", ok, time.monotonic() - started, detail), phase)


def _route_auth(ctx: Context, gw: GatewayBackend) -> None:
    """A key must open only its own tenant's route, and its own key must open it."""
    launch = ctx.sandbox.launch
    for route_owner in ctx.registry:
        path = gw.route(route_owner.name, launch, "/v1/models")
        for key_owner in ctx.registry:
            key = key_owner.canaries["api_server_key"]
            status, _ = gw.request("GET", path, key, None, tenant=None)
            opened = status == 200
            own = key_owner.name == route_owner.name
            if opened != own:
                what = "opened" if opened else "did not open"
                ctx.findings.append(Finding(
                    "route_auth", key_owner.name if opened else route_owner.name, route_owner.name,
                    "api_server_key", "request", f"gateway:GET {path}", None,
                    f"Bearer <{key_owner.name}:api_server_key> -> HTTP {status}", scenario=ctx.scenario,
                    phase="route-auth",
                    detail=f"{key_owner.name}'s API-server key {what} {route_owner.name}'s route",
                ))

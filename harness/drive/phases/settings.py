"""The `settings` phase (tui, serve): settings writes addressed to one profile that is not the launch profile
(`config.set` of its cwd and of a global setting, `model.save_key`) must change only that profile's files; a
settings file of another profile that changed is a `profile_bleed`. The backends' drivers run it after `lookups`,
with every tenant's session."""

from __future__ import annotations

import hashlib
from pathlib import Path

from harness.core.findings import Finding
from harness.core.registry import new_tag
from harness.drive.context import Context
from harness.drive.hermes.rpc import BackendError, RpcBackend
from harness.drive.phases.base import PhaseSpec


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


def run_settings(ctx: Context, backend: RpcBackend, sessions: dict[str, str], driver: str) -> None:
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


#: Why the phase has no plant yet, and where its detector's planted crossing and near miss are tested.
UNPLANTED = ("its detector (a settings file of a profile that was not addressed, changed) is driven by Hermes' own "
             "writes; no plant makes Hermes write elsewhere")

PHASE = PhaseSpec("settings", "settings writes addressed to one profile must change only its files", rank=30,
                  doors=("tui", "serve"), unplanted=UNPLANTED)

"""The `cron` phase (serve, gateway; in `--phases all`, not by default: it waits for the ticker): a due job seeded
in every profile's own cron store with Hermes' own cron API before the backend starts; the backend's ticker must
fire each one in its own profile (a job that never fires is a `shortfall`), its prompt reaching its own provider.
With the gateway's bots on, every job delivers its output to its profile's home channel (the `messaging` phase
judges the deliveries)."""

from __future__ import annotations

import hashlib
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from harness.core.protocol import PROMPT
from harness.detect.decode import loads
from harness.drive.context import Context
from harness.drive.hermes.agent import TurnResult
from harness.drive.hermes.rpc import BackendError
from harness.drive.phases.base import ALL_ONLY, PhaseSpec
from harness.drive.surface import Plant, PlantContext

CRON_SEED = (
    "import sys, json; from cron.jobs import create_job, trigger_job, list_jobs; "
    "jobs = [j for j in list_jobs(include_disabled=True) if j.get('name') == 'tenancy-canary']; "
    "j = jobs[0] if jobs else create_job(sys.argv[1], sys.argv[3] or '30m', name='tenancy-canary', repeat=1, "
    "deliver=sys.argv[2]); "
    "sys.argv[3] or trigger_job(j['id']); print(json.dumps({'id': j['id']}))"
)


def seed_cron(ctx: Context, deliver: str = "local", later: bool = False) -> None:
    """A due job in every profile's own cron store (Hermes' cron.jobs API, HERMES_HOME = that profile), its output
    delivered to `deliver` (`local`: kept in the profile's home; `mattermost`: the profile's home channel there);
    `later`: due a minute after now (every `1m`), so it fires at the ticker's second tick, not its first."""
    for t in ctx.registry:
        prompt = f"{t.canaries['cron_prompt']}: {PROMPT}"
        home = ctx.sandbox.home_of(t.name)
        argv = [str(ctx.hermes.python), "-c", CRON_SEED, prompt, deliver, "1m" if later else ""]
        rc, _, err = ctx.hermes.procs.run(argv,
                                          env=ctx.hermes.env({"HERMES_HOME": str(home)}), cwd=ctx.sandbox.home,
                                          timeout=120)
        if rc != 0:
            raise BackendError(f"seeding the cron job of {t.name} failed: {err.strip()[-200:]}")


def _asks(body: bytes, prompt: str) -> bool:
    """The request is a conversation whose user message holds `prompt` (a cron job running), not a tool
    result that merely lists the job (the battery's `cronjob list`)."""
    if prompt.encode() not in body:
        return False
    doc = loads(body)
    messages = doc.get("messages") if isinstance(doc, dict) else None
    return any(isinstance(m, dict) and m.get("role") == "user" and prompt in json.dumps(m.get("content"))
               for m in messages or [])


def wait_cron(ctx: Context, seconds: float, driver: str, since: float) -> None:
    """Wait until every tenant's cron prompt reached its provider, at most until `seconds` after `since` (the
    backend's start, wall clock: its ticker ticks then and every 60 s after); a job that never fires within them is a
    shortfall. One that fired in time while an earlier phase ran (past `seconds`) is seen too: the providers' records
    are read once at least."""
    fired: dict[str, float] = {}
    while len(fired) < len(ctx.registry.names()):  # looked at once at least: a job may have fired in an earlier phase
        for t in ctx.registry:
            asked = [r.time for r in ctx.stubs[t.name].snapshot()
                     if r.time - since <= seconds and _asks(r.body, t.canaries["cron_prompt"])]
            if t.name not in fired and asked:
                fired[t.name] = min(asked) - since  # when its prompt reached the provider
        if time.time() - since >= seconds:
            break
        time.sleep(0.5)
    time.sleep(3)  # let a fired job's follow-up calls finish
    for t in ctx.registry:
        ok = t.name in fired
        detail = "" if ok else f"cron job never fired within {seconds:.0f}s of the backend's start"
        ctx.record(TurnResult(t.name, f"{driver}-cron", ok, fired.get(t.name, seconds), detail), "cron")


def add_job(home: Path, name: str, prompt: str, due_in: timedelta) -> None:
    """A one-shot job in a profile's cron store (`cron/jobs.json`, in Hermes' own shape), due `due_in` from now
    (negative: already due, the ticker's first tick runs it)."""
    now = datetime.now(UTC)
    due = (now + due_in).isoformat()
    job: dict[str, Any] = {
        "id": hashlib.sha256(name.encode()).hexdigest()[:12], "name": name, "prompt": prompt, "skills": [],
        "skill": None, "model": None, "provider": None, "base_url": None, "script": None, "no_agent": False,
        "context_from": None, "schedule": {"kind": "once", "run_at": due, "display": "once"},
        "schedule_display": "once", "repeat": {"times": 1, "completed": 0}, "enabled": True, "state": "scheduled",
        "paused_at": None, "paused_reason": None, "created_at": now.isoformat(), "next_run_at": due,
        "last_run_at": None, "last_status": None, "last_error": None, "last_delivery_error": None,
        "deliver": "local", "origin": None, "enabled_toolsets": None, "workdir": None}
    path = home / "cron" / "jobs.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    jobs = json.loads(path.read_text())["jobs"] if path.exists() else []
    path.write_text(json.dumps({"jobs": [*jobs, job], "updated_at": now.isoformat()}, indent=2))


def _due(c: PlantContext) -> None:
    """A job of the target's (its cron prompt) in the launch profile's own store, already due: the ticker runs the
    launch profile's jobs (F6 aside), so the target's canary reaches the launch profile's provider."""
    add_job(Path(str(c.donor.home)), f"tenancy-{c.target.name}-planted", f"{c.target.canaries['cron_prompt']}: "
            f"{PROMPT}", timedelta(minutes=-1))


PHASE = PhaseSpec("cron", "every profile's due cron job fired by the backend's ticker, in its own profile", rank=80,
                  doors=("serve", "gateway"), selection=ALL_ONLY, plant="cron-due",
                  plants={"cron-due": Plant(_due, frozenset({"request_leak"}))})

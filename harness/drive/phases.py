"""Steps every multi-profile scenario shares: which phases run, the cron jobs, the profile churn."""

from __future__ import annotations

import json
import time
from typing import Any

from harness.core.protocol import PROMPT
from harness.core.registry import new_tag
from harness.detect.decode import loads
from harness.drive.backends import BackendError
from harness.drive.context import ALL, Context
from harness.drive.hermes import TurnResult

CRON_SEED = (
    "import sys, json; from cron.jobs import create_job, trigger_job, list_jobs; "
    "jobs = [j for j in list_jobs(include_disabled=True) if j.get('name') == 'tenancy-canary']; "
    "j = jobs[0] if jobs else create_job(sys.argv[1], sys.argv[3] or '30m', name='tenancy-canary', repeat=1, "
    "deliver=sys.argv[2]); "
    "sys.argv[3] or trigger_job(j['id']); print(json.dumps({'id': j['id']}))"
)
DEFAULT_PHASES = ("turns", "lookups", "settings", "after-settings", "profiles", "resume", "route-auth")
ALL_PHASES = (*DEFAULT_PHASES, "cron")
#: Phases run only when named: not in `all`, whose runs the committed baselines were made with (a baseline that holds
#: a phase's incidents is made on several machines, never on one to pass a test).
OPT_IN_PHASES = ("approvals", "redaction", "kanban", "toolsets")
KNOWN_PHASES = (*ALL_PHASES, *OPT_IN_PHASES)


def wanted(ctx: Context, phase: str) -> bool:
    return phase in (ctx.opts.phases or DEFAULT_PHASES)


def sets_homes(ctx: Context, phase: str, doors: tuple[str, ...]) -> bool:
    """Whether an opt-in phase lays its settings down in the homes of this run: it was asked for and one of its
    doors is driven (`all`: one set of homes for every door)."""
    return wanted(ctx, phase) and ctx.scenario in (*doors, ALL)


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
    backend's start, wall clock: its ticker ticks then and every 60 s after); a job that never fires is a
    shortfall."""
    fired: dict[str, float] = {}
    while time.time() - since < seconds and len(fired) < len(ctx.registry.names()):
        for t in ctx.registry:
            if t.name not in fired and any(_asks(r.body, t.canaries["cron_prompt"])
                                           for r in ctx.stubs[t.name].snapshot()):
                fired[t.name] = time.time() - since
        time.sleep(0.5)
    time.sleep(3)  # let a fired job's follow-up calls finish
    for t in ctx.registry:
        ok = t.name in fired
        detail = "" if ok else f"cron job never fired within {seconds:.0f}s of the backend's start"
        ctx.record(TurnResult(t.name, f"{driver}-cron", ok, fired.get(t.name, seconds), detail), "cron")


def profiles(ctx: Context, pid: int | None, proc: Any, driver: str) -> None:
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

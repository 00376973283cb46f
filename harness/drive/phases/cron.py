"""The `cron` phase (serve, gateway; in `--phases all`, not by default: it waits for the ticker): a due job seeded
in every profile's own cron store with Hermes' own cron API before the backend starts; the backend's ticker must
fire each one in its own profile (a job that never fires is a `shortfall`), its prompt reaching its own provider.
With the gateway's bots on, every job delivers its output to its profile's home channel (the `messaging` phase
judges the deliveries)."""

from __future__ import annotations

import json
import time

from harness.core.protocol import PROMPT
from harness.detect.decode import loads
from harness.drive.context import Context
from harness.drive.hermes.agent import TurnResult
from harness.drive.hermes.rpc import BackendError
from harness.drive.phases.base import ALL_ONLY, PhaseSpec

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


#: Why the phase has no plant yet, and where its detector's planted crossing and near miss are tested.
UNPLANTED = ("a job that fires elsewhere is seen by the `messaging` phase's cron deliveries "
             "(tests/test_attachments.py) and a job that never fires is a shortfall; no plant yet")

PHASE = PhaseSpec("cron", "every profile's due cron job fired by the backend's ticker, in its own profile", rank=80,
                  doors=("serve", "gateway"), selection=ALL_ONLY, unplanted=UNPLANTED)

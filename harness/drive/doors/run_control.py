"""Run control across profiles on the multiplexed gateway's API server: a run of one profile, waiting for its
approval, must be controllable from that profile's own route only.

With `approvals.mode: manual` for the part, the owner (the first tenant that is not the launch profile) starts three
runs (`POST /v1/runs`), each a recursive delete of a scratch folder of its own workdir, and each waits for its
approval (status `waiting_for_approval`). The tenant that looks up the owner's objects (the actor), on its own route
with its own key, answers the first run's approval (`POST /v1/runs/{id}/approval`, "deny") and asks to stop the
second (`POST /v1/runs/{id}/stop`). Either answered as done (200; an approval that resolved a pending request) is a
`profile_bleed` of canary kind `run_control` (entry point `run`): another profile decided the owner's run; refused,
the owner answers it itself. The owner answers the third run's approval itself on its own route: the near miss,
never reported. A run that never waited for its approval, or never ended after the answers, is a failed turn (the
part proved nothing), never a clean one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.capture.stubs.provider import ToolStep
from harness.core.findings import Finding
from harness.core.protocol import PROMPT
from harness.core.registry import new_tag
from harness.drive.context import Context
from harness.drive.hermes.agent import TurnResult
from harness.drive.phases import approvals

DRIVER = "api-server-control"
#: How long a run may take to reach its approval request, or to end after it, polled every half second.
WAIT = 60.0
ENDED = ("completed", "failed", "cancelled")
#: One request on a tenant's route: (tenant, method, path, body) -> (status, payload).
Call = Callable[[str, str, str, dict[str, Any] | None], tuple[int, Any]]


def taken(owner: str, actor: str, action: str, status: int, payload: Any, scenario: str, phase: str
          ) -> list[Finding]:
    """A finding when `actor`, not `owner`, had `action` (`stop`, `approval`) on `owner`'s run done: a 200 answer
    (for an approval, one that resolved a pending request). The owner's own control is never one."""
    done = status == 200 and (action != "approval" or (isinstance(payload, dict) and payload.get("resolved", 0)))
    if actor == owner or not done:
        return []
    return [Finding("profile_bleed", owner, actor, "run_control", "rpc", f"api-server:/v1/runs/{{id}}/{action}",
                    "plain", f"POST /v1/runs/<{owner}'s run>/{action} on {actor}'s route answered {status}",
                    scenario=scenario, phase=phase,
                    detail=f"{actor!r} had {owner!r}'s run, waiting for its approval, {action} done on its own "
                           "route")]


def poll(call: Call, tenant: str, run_id: str, until: tuple[str, ...], wait: float = WAIT) -> str:
    """The run's status once it is one of `until`, or the last one seen when `wait` seconds are over."""
    started, state = time.monotonic(), ""
    while time.monotonic() - started < wait:
        _, polled = call(tenant, "GET", f"/v1/runs/{run_id}", None)
        state = str(polled.get("status") or "") if isinstance(polled, dict) else ""
        if state in until:
            break
        time.sleep(0.5)
    return state


def _pending(ctx: Context, call: Call, owner: str, phase: str) -> str:
    """A run of `owner` waiting for the approval of a recursive delete in its workdir: its id, "" if none."""
    started = time.monotonic()
    scratch = Path(ctx.registry[owner].canaries["workdir"]) / f"run-control-{new_tag()}"
    scratch.mkdir(parents=True, exist_ok=True)
    ctx.stubs[owner].script([[ToolStep("terminal", {"command": f"rm -rf {scratch}"})]])
    status, payload = call(owner, "POST", "/v1/runs", {"model": ctx.registry[owner].model, "input": PROMPT})
    run_id = str(payload.get("run_id") or "") if isinstance(payload, dict) else ""
    state = poll(call, owner, run_id, ("waiting_for_approval", *ENDED)) if run_id else ""
    ok = state == "waiting_for_approval"
    ctx.record(TurnResult(owner, DRIVER, ok, time.monotonic() - started,
                          "" if ok else f"run {run_id or '(none)'}: HTTP {status}, status {state or 'unknown'}, "
                                        "never waited for its approval"), phase, snapshot=False)
    return run_id if ok else ""


def _control(ctx: Context, call: Call, owner: str, actor: str, run_id: str, action: str, phase: str) -> None:
    """`actor` asks for `action` on `owner`'s pending run; the owner then answers it itself if it still waits."""
    body = {"choice": "deny"} if action == "approval" else {}
    status, payload = call(actor, "POST", f"/v1/runs/{run_id}/{action}", body)
    ctx.findings.extend(taken(owner, actor, action, status, payload, ctx.scenario, phase))
    if poll(call, owner, run_id, ("waiting_for_approval", *ENDED)) == "waiting_for_approval":
        status, payload = call(owner, "POST", f"/v1/runs/{run_id}/approval", {"choice": "deny"})  # the near miss
        ctx.findings.extend(taken(owner, owner, "approval", status, payload, ctx.scenario, phase))
    state = poll(call, owner, run_id, ENDED)
    ctx.record(TurnResult(owner, DRIVER, state in ENDED, 0.0,
                          "" if state in ENDED else f"run {run_id}: status {state or 'unknown'} after {action}"),
               phase, snapshot=False)


def run(ctx: Context, call: Call, owner: str, actor: str, phase: str) -> None:
    """The part: see the module's docstring."""
    approvals.set_mode(ctx, "manual")
    try:
        for action, by in (("approval", actor), ("stop", actor), ("approval", owner)):
            run_id = _pending(ctx, call, owner, phase)
            if not run_id:
                return
            _control(ctx, call, owner, by, run_id, action, phase)
    finally:
        ctx.stubs[owner].script(None)
        approvals.set_mode(ctx, "off")

"""The `cron` phase's wait (`cron.wait_cron`): a job whose prompt reached its provider within the wait counts as
fired even when an earlier phase ran past the wait (it is looked at once at least); one that reached it after the
wait, or never, is a failed step."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

from harness.capture.stubs.base import StubRequest
from harness.core.registry import mint
from harness.drive.phases.cron import wait_cron

NAMES = ["default", "alpha", "beta"]


def _asked(prompt: str, at: float) -> StubRequest:
    body = json.dumps({"messages": [{"role": "user", "content": f"run the job: {prompt}"}]}).encode()
    return StubRequest(0, "POST", "/v1/chat/completions", {}, body, 200, at)


def test_a_job_that_fired_during_an_earlier_phase_counts_though_the_wait_is_over(tmp_path: Path):
    reg = mint(NAMES, tmp_path / "work", {n: {"listen": 42000 + i} for i, n in enumerate(NAMES)})
    since = time.time() - 120  # the backend started 120 s ago: a wait of 80 s is over before it begins
    asked = {"default": [_asked(reg["default"].canaries["cron_prompt"], since + 70)],  # in time
             "alpha": [_asked(reg["alpha"].canaries["cron_prompt"], since + 100)],  # after the wait: not fired
             "beta": [_asked(reg["default"].canaries["cron_prompt"], since + 70)]}  # another's prompt: not its own
    steps: list[tuple[str, bool, float]] = []
    ctx = SimpleNamespace(registry=reg, stubs={n: SimpleNamespace(snapshot=lambda n=n: asked[n]) for n in NAMES},
                          record=lambda r, phase: steps.append((r.tenant, r.ok, round(r.seconds))))
    started = time.monotonic()
    wait_cron(ctx, 80.0, "gateway", since)
    assert steps == [("default", True, 70), ("alpha", False, 80), ("beta", False, 80)]
    assert time.monotonic() - started < 5  # one look and the follow-up pause, no waiting

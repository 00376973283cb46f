"""What the addon's scan pool saves mitmproxy's event loop: CPU time of this process (the loop's) per flow, inline
and handed to the pool, on the flows `bench/hooks.py` times.

    .venv/bin/python bench/loop.py [--kib 256] [--rounds 200] [--workers 1]

A flow here is the request's in-path checks (always in the loop) and the scans of its request and its response
(JSON or SSE), which the addon runs inline (`tenancy_workers=0`) or in a worker process. Printed per body kind:
the loop's CPU ms per flow inline and pooled, and the wall ms a flow takes pooled (one flow at a time: the
hand-over both ways is in it). The CPU time a worker spends is not the loop's and is not counted; what the pool
buys is that time for the loop, where a CPU is free to run the worker.

`--smoke` (what tests/test_benches.py runs): 16 KiB bodies, 5 rounds, one worker; the same table, too few rounds
to read.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from payloads import make_registry, request_body, sse_events

from harness.capture.pool import Pool
from harness.core.registry import Registry
from harness.detect import flows
from harness.detect.checks import RawRequest, RawResponse
from harness.detect.engine.matcher import Matcher, matcher_for
from harness.detect.routes import Route, endpoint_of


def jobs(reg: Registry, matcher: Matcher, kib: int, sse: bool) -> tuple[RawRequest, flows.ResponseScan]:
    """One main turn's request and the check of its response (`kib` KiB each), as the addon hands them on."""
    t = reg[reg.names()[0]]
    body = request_body(reg, t.name, kib * 1024)
    raw = RawRequest("bench", "POST", "/v1/chat/completions",
                     [("content-type", "application/json"), ("authorization", f"Bearer {t.key}")], body)
    ctype = "text/event-stream" if sse else "application/json"
    response = b"".join(sse_events(reg, t.name, kib * 1024)) if sse else body
    return raw, flows.ResponseScan(RawResponse("bench", 200, [("content-type", ctype)], response), t.name, "provider")


async def flow(reg: Registry, matcher: Matcher, pool: Pool | None, work: tuple[RawRequest, flows.ResponseScan]
               ) -> None:
    raw, response = work
    endpoint = endpoint_of(reg, Route("reverse", listen_port=reg[response.tenant or ""].listen))
    if pool is None:
        flows.check_request(reg, matcher, raw, endpoint)
        response.run(reg, matcher)
        return
    _, report = flows.request_in_path(reg, matcher, raw, endpoint)
    await pool.run(reg, matcher, flows.RequestScan(raw, endpoint.route, response.tenant, endpoint.service, report))
    await pool.run(reg, matcher, response)


async def measure(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp:  # the registry's paths only; nothing is written
        reg = make_registry(Path(tmp))
    matcher = matcher_for(reg)
    pool = Pool(args.workers)
    pool.ready()
    while pool.live < args.workers:
        await asyncio.sleep(0.05)
    print(f"{args.kib} KiB request and response, {args.workers} worker(s), medians of {args.rounds} rounds "
          "(inline and pooled alternating)")
    print(f"{'body':5} {'inline cpu ms':>14} {'pooled cpu ms':>14} {'pooled wall ms':>15}")
    try:
        for sse in (False, True):
            work = jobs(reg, matcher, args.kib, sse)
            got: dict[str, list[float]] = {"inline": [], "pooled": [], "wall": []}
            for _ in range(args.rounds):
                for name, side in (("inline", None), ("pooled", pool)):
                    cpu, wall = time.process_time(), time.perf_counter()
                    await flow(reg, matcher, side, work)
                    got[name].append(time.process_time() - cpu)
                    if side is not None:
                        got["wall"].append(time.perf_counter() - wall)
            print(f"{'sse' if sse else 'json':5} " + " ".join(
                f"{statistics.median(got[k]) * 1e3:14.3f}" for k in ("inline", "pooled", "wall")))
    finally:
        pool.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="16 KiB, 5 rounds: does the bench still run")
    args = ap.parse_args()
    if args.smoke:
        args.kib, args.rounds = 16, 5
    asyncio.run(measure(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

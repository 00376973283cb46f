"""Benchmark the tenancy addon against plain mitmdump and a direct connection, side by side in one run.

    .venv/bin/python bench/proxy.py [--quick | --smoke] [--rounds N] [--pairs N] [--ref GIT_REF] [--kinds sse]
                                    [--sizes 256] [--conc 1,8] [--only addon-rev/plain] [--no-table] [--no-pin]
                                    [--workers N]
    .venv/bin/python bench/proxy.py --replay EVIDENCE [--replay EVIDENCE ...] [--rounds N] [--ref GIT_REF]

A minimal asyncio stub (`proxy_stub.py`, a child process; HTTP and HTTPS) answers every POST with a JSON body or an SSE
stream (1 KiB events) of the size the query asks for. A bounded keep-alive load client (asyncio, 1/8/32
connections opened and warmed up before the clock starts) sends
chat-completion main turns of the same size, each connection as one of 8 tenants (12 canaries each: the
registry the addon loads), through

- `direct`:     straight to the stub (HTTP);
- `plain-rev`:  `mitmdump --mode reverse:<stub>@<port>` (8 listeners, one per tenant);
- `addon-rev`:  the same with `-s addons/tenancy.py` (registry, ledger);
- `plain-fwd`:  `mitmdump` regular mode, `connection_strategy=lazy`: CONNECT, TLS with the CA of a temp
                confdir, upstream TLS to the stub (`ssl_insecure`; the stub's certificate is throw-away);
- `addon-fwd`:  the same with the addon: CONNECT `<tenant>.llm.test:443`, routed to the stub by the addon;
- `stream-rev`, `stream-fwd`: plain mitmdump with `-s bench/stream_sse.py`, which streams
                `text/event-stream` responses as the addon does (plain mitmdump buffers a stream): the fair
                baseline for SSE; for JSON it does nothing, which shows what carrying any script costs;
- `old-rev`, `old-fwd` (with `--ref`): the addon and harness of that git ref (`git archive` into the temp
                dir), so the old and the new addon are compared in the same run.

The proxies run on one CPU of their own, the client and the stub on another (`--no-pin` to let the
scheduler place them). First a table: req/s and p50/p99 latency of every configuration, run one after
the other (round r runs every configuration once, in an order rotated by r). Its absolute figures drift
with this machine: its CPU speed wanders by up to +-30% within tens of milliseconds.

Then the ratios (`paired`), each of two configurations measured side by side so that both see the same
machine: at one connection, one request to each in turn (the ratio of summed latencies); with more, both
proxies loaded at once on the CPU they share, which the scheduler splits evenly, so the ratio is that of
their CPU cost per request. The rounds of a pair follow one another on the same warmed-up connections,
each at least 8 requests per side long. Printed: the median over rounds and the lowest and highest round. The control
pair `stream-* / plain-*` (for JSON a script that does nothing) shows the method's own spread: 1.00 when
nothing differs.
Then the SSE first-token delay: a stream of 10 events 20 ms apart, one request at a time, every
configuration in turn; the first event's arrival against the last one's shows whether a proxy buffers.

`--workers N` sets the addon's `tenancy_workers` (its default otherwise: none on 2 CPUs); its workers are
started before the clock runs and put on the client's and the stub's CPU, beside neither proxy's event loop.

`--quick` (under 3 minutes on 2 vCPUs) measures 1 and 8 connections, the table once with few requests, 3
side-by-side rounds of 0.4 s per pair and 5 first-token requests per configuration; the full run takes far
longer (9 rounds of 2 s per pair and cell). `--smoke` (what tests/test_benches.py runs, with `--workers 1`)
takes seconds: every configuration and every phase, 1 KiB bodies, 1 and 2 connections, one round of 0.1 s per
pair and one first-token request; its figures prove that the bench runs, and measure nothing worth reading.
Everything listens on 127.0.0.1; every child is in a ProcessSet, stopped at the end and at once on SIGTERM/SIGINT
(`children.py`), and each phase's wall time is printed.

`--replay EVIDENCE` (repeatable; `proxy_replay.py`) measures real audit traffic instead: the recorded flows of an
evidence folder sent again through plain mitmdump, mitmdump streaming SSE and the addon (and the addon of `--ref`),
side by side, each flow to each in turn, every configuration started afresh for each of `--rounds` rounds (default
3, `--quick` 2); the throughput and CPU ratios of each recording. Its `--smoke` replays a recording's first 40 flows
once.

The parts: `proxy_configs.py` starts the configurations, `proxy_client.py` is the load client,
`proxy_measures.py` the table, the ratios and the first token, `proxy_pairs.py` the side-by-side method,
`proxy_replay.py` the replay of a recording.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import children
import mitmproxy.version
import pools
from proxy_configs import Setup, start
from proxy_measures import FULL, QUICK, SMOKE, KiB, first_token, ratios, start_pools, throughput
from proxy_replay import bench_replay

from harness.core.procs import ProcessSet

SIZES = (1 * KiB, 256 * KiB)
KINDS = ("json", "sse")


def _phase[T](name: str, work: Coroutine[Any, Any, T], took: dict[str, float]) -> T:
    """`asyncio.run(work)`, its wall time printed and kept in `took[name]`."""
    start = time.perf_counter()
    result = asyncio.run(work)
    took[name] = time.perf_counter() - start
    print(f"({name}: {took[name]:.0f} s)\n")
    return result


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer cells, requests and rounds (under 3 minutes)")
    ap.add_argument("--smoke", action="store_true", help="seconds: 1 KiB, 1 and 2 connections, one round a pair")
    ap.add_argument("--rounds", type=int, help="table rounds per cell (default 3, --quick 1)")
    ap.add_argument("--ref", help="also run the addon of this git ref (old-rev, old-fwd), e.g. HEAD")
    ap.add_argument("--kinds", default=",".join(KINDS), help="body kinds (default json,sse)")
    ap.add_argument("--sizes", help="body KiB (default 1,256; --smoke 1)")
    ap.add_argument("--conc", help="connections (default 1,8,32; --quick 1,8)")
    ap.add_argument("--pairs", type=int, help="side-by-side rounds per pair (default 9, --quick 3)")
    ap.add_argument("--only", default="", help="only the side-by-side pairs whose 'name/base' holds this text")
    ap.add_argument("--no-table", action="store_true", help="only the side-by-side ratios, not the req/s table")
    ap.add_argument("--workers", type=int,
                    help="the addon's tenancy_workers (default: the addon's own; 0: every scan inline)")
    ap.add_argument("--no-pin", action="store_true",
                    help="let the scheduler place every process (default: the proxies on CPUs of their own)")
    ap.add_argument("--replay", action="append", type=Path, metavar="EVIDENCE",
                    help="replay the recorded flows of this evidence folder instead (repeatable)")
    a = ap.parse_args(argv)
    for evidence in a.replay or ():
        if not (evidence / "flows.mitm").is_file() or not (evidence / "registry.yaml").is_file():
            print(f"proxy.py: {evidence} is not an evidence folder (no flows.mitm and registry.yaml)", file=sys.stderr)
            return 2
    return children.run(lambda procs: (replays if a.replay else bench)(a, procs))


def _pin(a: argparse.Namespace) -> set[int] | None:
    """Put this process (the client, and the stubs it starts) on the first CPU and return the second, for the
    proxies: the proxy under test is the bottleneck, and the scheduler no longer moves it onto the client's CPU
    from one round to the next. None with --no-pin or a single CPU."""
    if a.no_pin or len(os.sched_getaffinity(0)) < 2:
        return None
    first, second, *_ = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {first})
    return {second}


def replays(a: argparse.Namespace, procs: ProcessSet) -> int:
    """`--replay`: each evidence folder's flows replayed side by side, its ratios printed; then all of them."""
    began = time.perf_counter()
    proxy_cpus = _pin(a)
    rounds = a.rounds or (1 if a.smoke else 2 if a.quick else 3)
    print(f"mitmproxy {mitmproxy.version.VERSION}; {rounds} rounds per recording; {os.cpu_count()} CPUs; load "
          + " ".join(f"{x:.1f}" for x in os.getloadavg())
          + (f"; proxies on CPU {sorted(proxy_cpus)}, client and stub on the rest" if proxy_cpus else "")
          + (f"; old = {a.ref}" if a.ref else ""))
    lines = []
    for evidence in a.replay:
        with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
            lines += bench_replay(procs, evidence, Path(tmp), rounds, (a.ref, a.workers, proxy_cpus),
                                  40 if a.smoke else None)
    print("\nreplayed, side by side (throughput: the baseline's summed latency over the addon's; CPU: the addon's "
          "mitmdump's CPU time over the baseline's; median [lowest, highest] of the rounds):")
    print("\n".join(f"  {line}" for line in lines))
    print(f"wall time {time.perf_counter() - began:.0f} s; load " + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    return 0


def bench(a: argparse.Namespace, procs: ProcessSet) -> int:
    """Start the stub and every mitmdump in `procs`, then measure: the table, the ratios, the first token."""
    began = time.perf_counter()
    plan = SMOKE if a.smoke else QUICK if a.quick else FULL
    rounds = a.rounds or plan.rounds
    proxy_cpus = _pin(a)
    conc = _ints(a.conc) if a.conc else list(plan.conc)
    sizes = a.sizes or ("1" if a.smoke else ",".join(str(x // KiB) for x in SIZES))
    cells = (a.kinds.split(","), [x * KiB for x in _ints(sizes)], conc)
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp:
        root = Path(tmp)
        try:
            started = start(procs, root, Setup(a.ref, a.workers, proxy_cpus))
            targets, fwd = started.targets, started.fwd
            tls = ssl.create_default_context(cafile=str(started.confdir / "mitmproxy-ca-cert.pem"))
            workers: list[Any] = []
            if a.workers:  # a long body starts the pool; its workers go where the client and the stub run
                asyncio.run(start_pools([t for n, t in targets.items() if n.startswith("addon-")], tls))
                rest = set(os.sched_getaffinity(0)) if proxy_cpus else None
                workers = pools.place(started.addons, a.workers, rest)
                print(f"addon: {a.workers} scan worker(s) each"
                      + (f", on CPU {sorted(rest)} (the client's and the stub's)" if rest else ""))
            canaries = len(fwd[fwd.names()[0]].all_canaries())
            print(f"mitmproxy {mitmproxy.version.VERSION}; {len(fwd.names())} tenants x {canaries} canaries; "
                  f"{rounds} interleaved rounds per cell; {os.cpu_count()} CPUs"
                  + (f"; proxies on CPU {sorted(proxy_cpus)}, client and stub on the rest" if proxy_cpus else
                     "; not pinned: side by side with several connections, two proxies may each get a CPU")
                  + (f"; old = {a.ref}" if a.ref else ""))
            took = {"start": time.perf_counter() - began}
            if not a.no_table:
                _phase("table", throughput(targets, tls, rounds, plan, cells), took)
            summary = _phase("side by side", ratios(targets, tls, a.pairs or plan.pairs, plan.seconds, cells, a.only),
                             took)
            _phase("first token", first_token(targets, tls, plan.first), took)
            if workers:  # before they stop with their mitmdump
                print(f"the addons' scan workers used {pools.cpu_seconds(workers):.1f} s of CPU in all")
        finally:
            procs.close()  # SIGTERM: each mitmdump runs its addons' `done` (the ledger is complete), then exits
        flagged = seen = 0
        for path in sorted(root.glob("ledger-*.jsonl")):
            for line in path.read_text().splitlines():
                seen += 1
                flagged += json.loads(line)["flagged"]
        print(f"\naddon ledgers: {seen} flows, {flagged} flagged (expected 0: every request is the tenant's own)")
        print("throughput ratios, side by side (plain: mitmdump buffering SSE; stream: mitmdump streaming SSE, "
              "for JSON a script that does nothing; old: the addon of --ref):")
        print("\n".join(f"  {line}" for line in summary))
    print(f"wall time {time.perf_counter() - began:.0f} s ("
          + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in took.items()) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())

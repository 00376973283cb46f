"""bench/proxy.py's three measurements of its configurations: the table (req/s and latency of each, one after the
other), the side-by-side ratios of every addon against its baselines, and the SSE first-token delay."""

from __future__ import annotations

import ssl
import statistics
from dataclasses import dataclass

from proxy_client import Conn, Round, Target, close, load, request_bytes, warm
from proxy_pairs import LEAST, paired

KiB = 1024
#: Every configuration with an addon, and the configurations it is compared with (those present in a cell).
BASELINES = {
    "addon-rev": ("plain-rev", "stream-rev", "old-rev"),
    "old-rev": ("plain-rev", "stream-rev"),
    "addon-fwd": ("plain-fwd", "stream-fwd", "old-fwd"),
    "old-fwd": ("plain-fwd", "stream-fwd"),
}
#: Plain mitmdump with a script that streams SSE; for a JSON body it does nothing, so it shows what carrying
#: any script costs mitmdump.
STREAMING = ("stream-rev", "stream-fwd")


@dataclass(frozen=True)
class Plan:
    """How much a run measures (the defaults of its options)."""

    conc: tuple[int, ...]  # connection counts of the cells
    rounds: int  # table: rounds per cell
    requests: tuple[int, int]  # table: requests per round, bodies under 64 KiB and larger ...
    per_conn: int  # ... and at least this many per connection (every connection busy for most of the round)
    pairs: int  # side by side: rounds per pair
    seconds: float  # side by side: length of a round (after SETTLE; times conc/8 above 8 connections)
    first: int  # first token: requests per configuration


FULL = Plan(conc=(1, 8, 32), rounds=3, requests=(400, 240), per_conn=32, pairs=9, seconds=2.0, first=50)
#: Under 3 minutes on 2 vCPUs: each cell's table once with few requests, 3 shorter rounds per pair, and no
#: 32 connections (like 8, both proxies saturated, at 4x the round length and warm-up; `--conc 1,8,32`).
QUICK = Plan(conc=(1, 8), rounds=1, requests=(16, 6), per_conn=2, pairs=3, seconds=0.4, first=5)
#: `--smoke` (what tests/test_benches.py runs): seconds, not minutes. 1 and 2 connections (one request to each in
#: turn, then both loaded at once), a table of a few requests, one short round per pair, one first-token request.
SMOKE = Plan(conc=(1, 2), rounds=1, requests=(4, 2), per_conn=1, pairs=1, seconds=0.1, first=1)


def _ms(x: float) -> str:
    return f"{x * 1e3:8.2f}"


def _p(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def throughput(targets: dict[str, Target], tls: ssl.SSLContext, rounds: int, plan: Plan,
                     cells: tuple[list[str], list[int], list[int]]) -> None:
    """req/s and p50/p99 latency of every configuration, one after the other (rotated order per round)."""
    print(f"{'body':5} {'size':>7} {'conc':>4}  {'config':10} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}")
    kinds, sizes, concs = cells
    for kind in kinds:
        for size in sizes:
            for conc in concs:
                total = max(plan.requests[size >= 64 * KiB], plan.per_conn * conc)
                query = f"kind={kind}&size={size}"
                names = list(targets)
                results: dict[str, list[Round]] = {name: [] for name in names}
                for r in range(rounds):
                    for name in names[r % len(names):] + names[: r % len(names)]:
                        results[name].append(await load(targets[name], tls, conc, total, query, size))
                for name, rs in results.items():
                    lat = [x for res in rs for x in res.latencies]
                    rate = statistics.median(res.rate for res in rs)
                    print(f"{kind:5} {size // KiB:4d}KiB {conc:4d}  {name:10} {rate:8.1f} {_ms(_p(lat, 0.5))} "
                          f"{_ms(_p(lat, 0.99))}")
                print()


async def ratios(targets: dict[str, Target], tls: ssl.SSLContext, rounds: int, seconds: float,
                 cells: tuple[list[str], list[int], list[int]], only: str = "") -> list[str]:
    """Every configuration with an addon against each of its baselines, side by side (`paired`), plus the
    control: the script that does nothing for JSON against plain, which should come out at 1.00."""
    pairs = [(name, base) for name, bases in BASELINES.items() if name in targets
             for base in bases if base in targets]
    pairs += [(s, f"plain-{s.split('-')[1]}") for s in STREAMING if s in targets]
    pairs = [(name, base) for name, base in pairs if only in f"{name}/{base}"]
    print(f"side by side: {rounds} rounds of {seconds:.1f} s (and {LEAST} requests) per pair, one after the other on "
          "the same connections; median [lowest, highest] of the rounds")
    lines = []
    kinds, sizes, concs = cells
    for kind in kinds:
        for size in sizes:
            for conc in concs:
                query = f"kind={kind}&size={size}"
                for name, base in pairs:
                    got = await paired(targets[name], targets[base], tls, conc, seconds, rounds, query, size)
                    line = (f"{kind:5} {size // KiB:4d} KiB conc {conc:2d}  {name:10} / {base:10} "
                            f"{statistics.median(got):5.2f}x  [{min(got):.2f}, {max(got):.2f}]")
                    print(line)
                    lines.append(line)
    return lines


async def first_token(targets: dict[str, Target], tls: ssl.SSLContext, n: int) -> None:
    """One request at a time, every configuration in turn: 10 events of 1 KiB, 20 ms apart."""
    query = "kind=sse&size=10240&events=10&delay=0.02"
    conns = {name: await Conn.open(t, 0, tls) for name, t in targets.items()}
    raws = {name: request_bytes(targets[name], 0, c.host, query, KiB) for name, c in conns.items()}
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in targets}
    for name, c in conns.items():
        await c.request(raws[name])  # warm-up
    for i in range(n):
        names = list(targets)
        for name in names[i % len(names):] + names[: i % len(names)]:
            whole, first = await conns[name].request(raws[name])
            got[name].append((first, whole))
    for c in conns.values():
        await c.close()
    print(f"SSE first token: 10 events x 1 KiB, 20 ms apart, 1 connection, median of {n} interleaved requests")
    print(f"{'config':10} {'first ms':>9} {'last ms':>9}  first token added vs direct / vs the streaming plain")
    for name, xs in got.items():
        first = statistics.median(f for f, _ in xs)
        whole = statistics.median(w for _, w in xs)
        vs_direct = statistics.median(a[0] - d[0] for a, d in zip(xs, got["direct"], strict=True))
        stream = next((b for b in BASELINES.get(name, ()) if b in STREAMING), None)
        vs_stream = (f"{statistics.median(a[0] - p[0] for a, p in zip(xs, got[stream], strict=True)) * 1e3:+8.2f} ms"
                     if stream else "")
        print(f"{name:10} {first * 1e3:9.2f} {whole * 1e3:9.2f}  {vs_direct * 1e3:+8.2f} ms {vs_stream}")


async def start_pools(targets: list[Target], tls: ssl.SSLContext) -> None:
    """Two 256 KiB JSON requests at once to each addon: a long body while another flow is in flight starts its
    scan workers."""
    for target in targets:
        await close(await warm(target, tls, 2, f"kind=json&size={256 * KiB}", 256 * KiB))

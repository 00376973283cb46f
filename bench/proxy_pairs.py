"""bench/proxy.py's side-by-side method: the throughput of one configuration over another's, both measured in the
same rounds so that both see the same machine."""

from __future__ import annotations

import asyncio
import itertools
import ssl
import statistics
import time

from proxy_client import Conn, Target, close, warm

#: Side by side with several connections, completions are counted only after both proxies have run this long.
SETTLE = 0.25
#: Side by side, a round lasts until each side has completed at least this many requests (and one per connection).
LEAST = 8


async def paired(a: Target, b: Target, tls: ssl.SSLContext, conc: int, seconds: float, rounds: int, query: str,
                 size: int) -> list[float]:
    """Throughput of `a` over `b` in each of `rounds` rounds, measured side by side so that both see the same
    machine.

    This machine's CPU speed wanders by +-30% within tens of milliseconds, more than the effect measured.
    At one connection the two get one request each in turn, and the ratio is that of their summed latencies
    (throughput at one connection is 1 / latency). With more connections both proxies run at once on the
    one CPU they share, each kept busy, so the scheduler gives each the same CPU time and the ratio of the
    requests they complete is the inverse ratio of their CPU cost per request. It is taken as the inverse
    ratio of their mean latencies (with every connection always busy, throughput = connections / mean
    latency), because completions come in bursts of about one per connection and a count moves in steps.
    The connections are warmed up once; the rounds follow one another on them (after SETTLE with more
    connections), each `seconds` long (times conc/8 above 8 connections: at 32 a proxy completes about one
    request per connection every 150 ms, in bursts) or longer, until each side has completed LEAST requests
    and one per connection in it.
    """
    pa, pb = await asyncio.gather(warm(a, tls, conc, query, size), warm(b, tls, conc, query, size))
    least = max(LEAST, conc)
    if conc == 1:
        got = [await alternate(pa[0], pb[0], seconds, least) for _ in range(rounds)]
    else:
        got = await loaded(pa, pb, seconds * max(1, conc / 8), rounds, least)
    await close(pa)
    await close(pb)
    return got


async def alternate(a: tuple[Conn, bytes], b: tuple[Conn, bytes], seconds: float, least: int) -> float:
    """One request to each in turn (the order flips every turn) for `seconds` and `least` turns: b's summed
    latency over a's."""
    deadline = time.perf_counter() + seconds
    spent = [0.0, 0.0]
    turn = 0
    while turn < least or time.perf_counter() < deadline:
        for side in (0, 1) if turn % 2 == 0 else (1, 0):
            conn, raw = (a, b)[side]
            spent[side] += (await conn.request(raw))[0]
        turn += 1
    return spent[1] / spent[0]


async def loaded(pa: list[tuple[Conn, bytes]], pb: list[tuple[Conn, bytes]], seconds: float, rounds: int,
                 least: int) -> list[float]:
    """Every connection of both sides always busy; after SETTLE, `rounds` windows of `seconds` (each until
    both sides have completed `least` requests in it): per window, b's mean latency over a's. A request
    counts in the window it completes in."""
    done: tuple[list[tuple[float, float]], list[tuple[float, float]]] = ([], [])  # (completed at, latency)
    stop = asyncio.Event()

    async def worker(side: int, conn: Conn, raw: bytes) -> None:
        while not stop.is_set():
            whole, _ = await conn.request(raw)
            done[side].append((time.perf_counter(), whole))

    tasks = [asyncio.create_task(worker(side, c, r)) for side, pairs in enumerate((pa, pb)) for c, r in pairs]
    edges = [time.perf_counter() + SETTLE]
    try:
        for _ in range(rounds):
            await asyncio.sleep(edges[-1] + seconds - time.perf_counter())
            while min(sum(t >= edges[-1] for t, _ in side) for side in done) < least:
                await asyncio.sleep(0.01)
            edges.append(time.perf_counter())
    finally:
        stop.set()
        await asyncio.gather(*tasks)  # each finishes the request it has in flight
    got = []
    for lo, hi in itertools.pairwise(edges):
        la, lb = ([x for t, x in side if lo <= t < hi] for side in done)
        got.append(statistics.mean(lb) / statistics.mean(la))
    return got

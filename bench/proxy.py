"""Benchmark the tenancy addon against plain mitmdump and a direct connection, side by side in one run.

    .venv/bin/python bench/proxy.py [--quick] [--rounds N] [--pairs N] [--ref GIT_REF] [--kinds sse] [--sizes 256]
                                    [--conc 1,8] [--only addon-rev/plain] [--no-table] [--no-pin]

A minimal asyncio stub (a child process; HTTP and HTTPS) answers every POST with a JSON body or an SSE
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
longer (9 rounds of 2 s per pair and cell). Everything listens on 127.0.0.1; every child is in a ProcessSet,
stopped at the end and at once on SIGTERM/SIGINT (`children.py`), and each phase's wall time is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import itertools
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import children
import mitmproxy.version
import pools
from ab import REPO
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from hooks import FILLER, make_registry, request_body
from mitmproxy import certs

from harness.capture.proxy import free_port, mitmdump_binary
from harness.core.procs import ProcessSet, Stdio
from harness.core.registry import Registry

KiB = 1024
EVENT = 1024  # bytes per SSE event
SIZES = (1 * KiB, 256 * KiB)
KINDS = ("json", "sse")
#: Side by side with several connections, completions are counted only after both proxies have run this long.
SETTLE = 0.25
#: Side by side, a round lasts until each side has completed at least this many requests (and one per connection).
LEAST = 8
STREAM_ADDON = Path(__file__).resolve().parent / "stream_sse.py"
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


# -- the stub (a child process: `bench/proxy.py --stub HTTP_PORT TLS_PORT CERT KEY`) --------------------------


def stub_json(size: int) -> bytes:
    doc = {"id": "chatcmpl-bench", "object": "chat.completion", "model": "bench",
           "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "stop"}]}
    pad = max(0, size - len(json.dumps(doc)))
    doc["choices"][0]["message"]["content"] = (FILLER * (pad // len(FILLER) + 1))[:pad]
    return json.dumps(doc).encode()


def stub_events(size: int) -> list[bytes]:
    """SSE `data:` events of about EVENT bytes, about `size` bytes in all (at least one), then `[DONE]`."""
    events: list[bytes] = []
    total = 0
    while total < size or not events:
        delta = {"content": (FILLER * (EVENT // len(FILLER) + 1))[: min(EVENT, size) - 140]}
        event = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "model": "bench",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        events.append(f"data: {json.dumps(event)}\n\n".encode())
        total += len(events[-1])
    return [*events, b"data: [DONE]\n\n"]


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class Stub:
    """Answers `POST ...?kind=json|sse&size=N[&events=N&delay=S]`; bodies are built once per query."""

    def __init__(self) -> None:
        self.cache: dict[bytes, tuple[bytes, list[bytes], float]] = {}

    def answer(self, target: bytes) -> tuple[bytes, list[bytes], float]:
        if target not in self.cache:
            q = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(target.decode()).query))
            size, delay = int(q.get("size", 1024)), float(q.get("delay", 0))
            if q.get("kind") == "sse":
                events = stub_events(size)[: int(q["events"])] if "events" in q else stub_events(size)
                head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
                        b"transfer-encoding: chunked\r\n\r\n")
                self.cache[target] = (head, [*map(_chunk, events), b"0\r\n\r\n"], delay)
            else:
                body = stub_json(size)
                head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
                self.cache[target] = (head.encode(), [body], 0.0)
        return self.cache[target]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                target = lines[0].split(b" ")[1]
                length = next((int(x.split(b":", 1)[1]) for x in lines if x.lower().startswith(b"content-length:")), 0)
                if length:
                    await reader.readexactly(length)
                status, parts, delay = self.answer(target)
                if not delay:
                    writer.write(status + b"".join(parts))
                else:
                    writer.write(status)
                    for part in parts:
                        writer.write(part)
                        await writer.drain()
                        await asyncio.sleep(delay)
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()


async def serve_stub(http_port: int, tls_port: int, cert: str, key: str) -> None:
    stub = Stub()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    plain = await asyncio.start_server(stub.handle, "127.0.0.1", http_port)
    tls = await asyncio.start_server(stub.handle, "127.0.0.1", tls_port, ssl=ctx)
    async with plain, tls:
        await asyncio.gather(plain.serve_forever(), tls.serve_forever())


# -- the load client ------------------------------------------------------------------------------------------


@dataclass
class Target:
    """Where connection i of a configuration goes, as which tenant."""

    name: str
    registry: Registry
    ports: list[int]  # one per tenant (reverse, direct) or the proxy's single port (forward)
    connect: Callable[[int], str] | None = None  # forward: the CONNECT authority for tenant i

    def tenant(self, i: int) -> str:
        return self.registry.names()[i % len(self.registry.names())]


class Conn:
    """One keep-alive HTTP/1.1 connection (through CONNECT + TLS in the forward topology)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def open(cls, target: Target, i: int, tls: ssl.SSLContext) -> Conn:
        port = target.ports[i % len(target.ports)]
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        host = f"127.0.0.1:{port}"
        if target.connect is not None:
            authority = target.connect(i)
            writer.write(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
            await writer.drain()
            reply = await reader.readuntil(b"\r\n\r\n")
            if not reply.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"{target.name}: CONNECT {authority} -> {reply[:60]!r}")
            host = f"{target.tenant(i)}.llm.test"
            await writer.start_tls(tls, server_hostname=host)
        return cls(reader, writer, host)

    async def request(self, raw: bytes) -> tuple[float, float]:
        """(seconds to the whole response, seconds to the first byte of its body)."""
        start = time.perf_counter()
        self.writer.write(raw)
        await self.writer.drain()
        head = await self.reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"status {head[:40]!r}")
        lower = head.lower()
        first = 0.0
        if b"transfer-encoding: chunked" in lower:
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                await self.reader.readexactly(size + 2)
                if size and not first:
                    first = time.perf_counter() - start
                if size == 0:
                    break
        else:
            length = int(lower.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
            await self.reader.readexactly(length)
            first = time.perf_counter() - start
        return time.perf_counter() - start, first

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


def request_bytes(target: Target, i: int, host: str, query: str, size: int) -> bytes:
    t = target.registry[target.tenant(i)]
    body = request_body(target.registry, t.name, size)
    return (f"POST /v1/chat/completions?{query} HTTP/1.1\r\nHost: {host}\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer {t.key}\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body


@dataclass
class Round:
    seconds: float
    latencies: list[float]

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds


async def warm(target: Target, tls: ssl.SSLContext, conc: int, query: str, size: int) -> list[tuple[Conn, bytes]]:
    """`conc` keep-alive connections to `target` (opened at once), each with its request, after one warm-up
    request each."""
    conns = await asyncio.gather(*(Conn.open(target, i, tls) for i in range(conc)))
    pairs = [(c, request_bytes(target, i, c.host, query, size)) for i, c in enumerate(conns)]
    await asyncio.gather(*(c.request(r) for c, r in pairs))
    return pairs


async def close(pairs: list[tuple[Conn, bytes]]) -> None:
    for c, _ in pairs:
        await c.close()


async def load(target: Target, tls: ssl.SSLContext, conc: int, total: int, query: str, size: int) -> Round:
    """`total` requests over `conc` warmed-up keep-alive connections; the clock runs only for those."""
    pairs = await warm(target, tls, conc, query, size)
    left = total
    lat: list[float] = []

    async def worker(conn: Conn, raw: bytes) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            whole, _ = await conn.request(raw)
            lat.append(whole)

    start = time.perf_counter()
    await asyncio.gather(*(worker(c, r) for c, r in pairs))
    seconds = time.perf_counter() - start
    await close(pairs)
    return Round(seconds, lat)


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


# -- processes ------------------------------------------------------------------------------------------------


def accepts(port: int) -> bool:
    """Something listens on 127.0.0.1:`port`."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@dataclass
class Child:
    """A child starting up: it is ready when it accepts on every port."""

    proc: subprocess.Popen[bytes]
    ports: list[int]
    log: Path


def spawn(procs: ProcessSet, argv: list[str], ports: list[int], log: Path, env: dict[str, str] | None = None,
          cpus: set[int] | None = None) -> Child:
    """Start a child in `procs` (on `cpus` only, when given); `ready` waits for it."""
    mine = os.sched_getaffinity(0)
    with log.open("wb") as fh:
        try:
            if cpus:
                os.sched_setaffinity(0, cpus)  # the child inherits it
            proc = procs.spawn(argv, env=env or dict(os.environ), stdio=Stdio(stdout=fh, stderr=fh))
        finally:
            os.sched_setaffinity(0, mine)
    return Child(proc, ports, log)


def ready(starting: list[Child], timeout: float = 60) -> None:
    """Wait until every child accepts on every port (they start side by side)."""
    deadline = time.monotonic() + timeout
    for child in starting:
        while not all(map(accepts, child.ports)):
            if child.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{child.proc.args[0]} did not come up: {child.log.read_text()[-400:]}")
            time.sleep(0.05)


def mitmdump_argv(confdir: Path, modes: list[str], extra: list[str]) -> list[str]:
    argv = [str(mitmdump_binary()), "-q", "--set", f"confdir={confdir}", "--set", "listen_host=127.0.0.1",
            "--set", "termlog_verbosity=warn"]
    for mode in modes:
        argv += ["--mode", mode]
    return argv + extra


def stub_cert(confdir: Path) -> tuple[Path, Path]:
    """Create the confdir's CA (mitmdump uses it too) and a throw-away certificate for the stub."""
    store = certs.CertStore.from_store(confdir, "mitmproxy", 2048)
    entry = store.get_cert("127.0.0.1", [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    cert, key = confdir / "stub-cert.pem", confdir / "stub-key.pem"
    cert.write_bytes(entry.cert.to_pem())
    key.write_bytes(entry.privatekey.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert, key


# -- the benchmark --------------------------------------------------------------------------------------------


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


def old_tree(ref: str, root: Path) -> Path:
    """`addons/` and `harness/` of git `ref`, extracted under `root` (the working tree is not touched)."""
    root.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "addons", "harness"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    return root


def _phase[T](name: str, work: Coroutine[Any, Any, T], took: dict[str, float]) -> T:
    """`asyncio.run(work)`, its wall time printed and kept in `took[name]`."""
    start = time.perf_counter()
    result = asyncio.run(work)
    took[name] = time.perf_counter() - start
    print(f"({name}: {took[name]:.0f} s)\n")
    return result


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


_TAKEN: set[int] = set()


def distinct_port() -> int:
    """A free port not handed out before in this run (the kernel may offer a just-closed port again)."""
    port = free_port()
    while port in _TAKEN:
        port = free_port()
    _TAKEN.add(port)
    return port


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer cells, requests and rounds (under 3 minutes)")
    ap.add_argument("--rounds", type=int, help="table rounds per cell (default 3, --quick 1)")
    ap.add_argument("--ref", help="also run the addon of this git ref (old-rev, old-fwd), e.g. HEAD")
    ap.add_argument("--kinds", default=",".join(KINDS), help="body kinds (default json,sse)")
    ap.add_argument("--sizes", default=",".join(str(x // KiB) for x in SIZES), help="body KiB (default 1,256)")
    ap.add_argument("--conc", help="connections (default 1,8,32; --quick 1,8)")
    ap.add_argument("--pairs", type=int, help="side-by-side rounds per pair (default 9, --quick 3)")
    ap.add_argument("--only", default="", help="only the side-by-side pairs whose 'name/base' holds this text")
    ap.add_argument("--no-table", action="store_true", help="only the side-by-side ratios, not the req/s table")
    ap.add_argument("--workers", type=int,
                    help="the addon's tenancy_workers (default: the addon's own; 0: every scan inline)")
    ap.add_argument("--no-pin", action="store_true",
                    help="let the scheduler place every process (default: the proxies on CPUs of their own)")
    ap.add_argument("--stub", nargs=4, metavar=("HTTP_PORT", "TLS_PORT", "CERT", "KEY"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.stub:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve_stub(int(a.stub[0]), int(a.stub[1]), a.stub[2], a.stub[3]))
        return 0
    return children.run(lambda procs: bench(a, procs))


def bench(a: argparse.Namespace, procs: ProcessSet) -> int:
    """Start the stub and every mitmdump in `procs`, then measure: the table, the ratios, the first token."""
    began = time.perf_counter()
    plan = QUICK if a.quick else FULL
    rounds = a.rounds or plan.rounds
    # The proxies get a CPU of their own, the load client and the stub the other: the proxy under test is the
    # bottleneck, and the scheduler no longer moves it onto the client's CPU from one round to the next.
    proxy_cpus: set[int] | None = None
    if not a.no_pin and len(os.sched_getaffinity(0)) >= 2:
        first, second, *_ = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {first})
        proxy_cpus = {second}
    conc = _ints(a.conc) if a.conc else list(plan.conc)
    cells = (a.kinds.split(","), [x * KiB for x in _ints(a.sizes)], conc)
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp:
        root = Path(tmp)
        confdir = root / "confdir"
        confdir.mkdir()
        try:
            cert, key = stub_cert(confdir)
            http_port, tls_port = distinct_port(), distinct_port()
            starting = [spawn(procs, [sys.executable, __file__, "--stub", str(http_port), str(tls_port), str(cert),
                                      str(key)], [http_port, tls_port], root / "stub.log")]
            upstream = f"reverse:http://127.0.0.1:{http_port}"
            lazy = ["--set", "connection_strategy=lazy", "--set", "ssl_insecure=true"]
            trees = {"addon": REPO} | ({"old": old_tree(a.ref, root / "old")} if a.ref else {})
            fwd = make_registry(root / "fwd", upstream=f"https://127.0.0.1:{tls_port}")
            for t in fwd:
                t.route = {"host": f"{t.name}.llm.test"}
            fwd.validate()
            fwd.save(root / "registry-fwd.yaml")
            targets: dict[str, Target] = {}
            addons: list[int] = []  # the pids of the addon-* mitmdumps
            for name in ("direct", "plain", "stream", *trees):
                # one registry per reverse configuration: the addon attributes a flow by its listener's port
                rev = make_registry(root / f"rev-{name}", upstream=f"http://127.0.0.1:{http_port}")
                for t in rev:
                    t.route = {"listen": distinct_port()}
                rev.validate()
                rev.save(root / f"registry-{name}-rev.yaml")
                if name == "direct":
                    targets["direct"] = Target("direct", rev, [http_port])
                    continue
                ports = [t.listen for t in rev if t.listen is not None]
                fwd_port = distinct_port()
                tree = trees.get(name)
                env = {**os.environ, "PYTHONPATH": str(tree or REPO)}
                fwd.save(root / f"registry-{name}-fwd.yaml")
                for topo, modes, extra, reg, listen in (
                    ("rev", [f"{upstream}@127.0.0.1:{p}" for p in ports], [], rev, ports),
                    ("fwd", [f"regular@127.0.0.1:{fwd_port}"], lazy, fwd, [fwd_port]),
                ):
                    if tree is not None:
                        extra = [*extra, "-s", str(tree / "addons" / "tenancy.py"),
                                 "--set", f"tenancy_registry={root / f'registry-{name}-{topo}.yaml'}",
                                 "--set", f"tenancy_ledger={root / f'ledger-{name}-{topo}.jsonl'}"]
                        if name == "addon" and a.workers is not None:
                            extra += ["--set", f"tenancy_workers={a.workers}"]
                    elif name == "stream":
                        extra = [*extra, "-s", str(STREAM_ADDON)]
                    starting.append(spawn(procs, mitmdump_argv(confdir, modes, extra), listen,
                                          root / f"mitmdump-{name}-{topo}.log", env, proxy_cpus))
                    if name == "addon":
                        addons.append(starting[-1].proc.pid)
                    connect = None
                    if topo == "fwd":
                        connect = (lambda i: f"{fwd.names()[i % 8]}.llm.test:443") if tree else (
                            lambda i: f"127.0.0.1:{tls_port}")
                    targets[f"{name}-{topo}"] = Target(f"{name}-{topo}", reg, listen, connect)
            ready(starting)
            order = ["direct", "plain-rev", "stream-rev", "addon-rev", "old-rev",
                     "plain-fwd", "stream-fwd", "addon-fwd", "old-fwd"]
            targets = {name: targets[name] for name in order if name in targets}
            tls = ssl.create_default_context(cafile=str(confdir / "mitmproxy-ca-cert.pem"))
            workers: list[Any] = []
            if a.workers:  # a long body starts the pool; its workers go where the client and the stub run
                asyncio.run(start_pools([t for n, t in targets.items() if n.startswith("addon-")], tls))
                rest = set(os.sched_getaffinity(0)) if proxy_cpus else None
                workers = pools.place(addons, a.workers, rest)
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

"""bench/proxy.py --replay: a real audit's recorded traffic (an evidence folder's `flows.mitm`) sent again through
plain mitmdump, mitmdump streaming SSE and the addon, side by side in one run.

Every flow the audit's proxy passed to a stub through a reverse listener is sent again, in the recorded order, to
the listener of the same tenant and service in each configuration, as it was recorded (method, path, headers, body
as it was on the wire); the upstream (`replay_stub.py`) answers it with the response the audit got, an SSE stream
as chunks of one event each. Left out, and counted: the requests the proxy refused (no upstream answered them),
those without a response, and websockets. The addon loads the recording's registry, its listeners moved to ports
of this run.

Each round starts every configuration afresh (the addon keeps what it learnt of a conversation between flows, and
a second pass would find it all known), then sends each flow to each configuration in turn, one request at a time,
the order rotated every flow. Per round and configuration: the summed latency (request sent to last byte read)
and the CPU time its mitmdump spent on the round (/proc). The ratios, for each configuration with an addon against
each baseline: throughput (the baseline's summed latency over the addon's, as bench/proxy.py's one connection) and
CPU (the addon's CPU time over the baseline's); median [lowest, highest] over the rounds.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import psutil
import replay_stub
from ab import REPO
from proxy_configs import STREAM_ADDON, Child, distinct_port, mitmdump_argv, old_tree, ready, spawn

from harness.capture.proxy import ensure_ca
from harness.core import registry_file
from harness.core.procs import ProcessSet, descendants, stop_tree
from harness.core.protocol import FLOW_HEADER
from harness.core.registry import PROVIDER, Registry
from harness.detect.flowfile import read_flows

#: Request headers the replay sets itself: where it goes, the framing of its body, and the audit's flow id.
DROPPED = frozenset({b"host", b"content-length", b"transfer-encoding", b"connection", b"keep-alive",
                     FLOW_HEADER.encode()})
#: Each configuration with an addon, and the baselines it is compared with (those started).
BASELINES = {"addon": ("plain", "stream", "old"), "old": ("plain", "stream")}


@dataclass(frozen=True)
class Exchange:
    """One recorded flow to send: to which listener (its index), the request's bytes, and whether it is a HEAD."""

    listener: int
    raw: bytes
    head: bool


@dataclass
class Recording:
    """The flows of an evidence folder to replay, and the responses the stub answers them with (by index)."""

    name: str
    registry: Registry
    listeners: list[int]  # the recorded listen ports, in the order of `Exchange.listener`
    exchanges: list[Exchange]
    responses: list[replay_stub.Response]
    left_out: Counter[str]
    request_bytes: int = 0
    response_bytes: int = 0


def load(evidence: Path, limit: int | None = None) -> Recording:
    """The recording of `evidence` (its first `limit` flows to replay, if given)."""
    registry = registry_file.load(evidence / "registry.yaml")
    flows, truncated = read_flows(evidence / "flows.mitm")
    rec = Recording(evidence.name, registry, [], [], [], Counter())
    if truncated:
        rec.left_out["after the truncation"] += 1
    ports = set(registry.listen_ports())
    for flow in flows:
        meta = flow.metadata.get("tenancy") or {}
        route = str(meta.get("route", ""))
        port = int(route.split(":", 1)[1]) if route.startswith("listen:") else None
        reason = ("a websocket" if flow.websocket is not None else "without a response" if flow.response is None
                  else "refused by the proxy" if meta.get("refused") else None if port in ports
                  else "not a reverse listener's")
        if reason:
            rec.left_out[reason] += 1
            continue
        if limit is not None and len(rec.exchanges) >= limit:
            break
        if port not in rec.listeners:
            rec.listeners.append(port)
        req, resp = flow.request, flow.response
        assert resp is not None and port is not None
        body = req.raw_content or b""
        head = req.data.method + b" " + req.data.path + b" HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        head += b"".join(k + b": " + v + b"\r\n" for k, v in req.headers.fields if k.lower() not in DROPPED)
        head += f"{replay_stub.REPLAY_HEADER.decode()}: {len(rec.responses)}\r\ncontent-length: {len(body)}\r\n\r\n"\
            .encode()
        rec.exchanges.append(Exchange(rec.listeners.index(port), head + body, req.method == "HEAD"))
        sse = "text/event-stream" in resp.headers.get("content-type", "")
        rec.responses.append((resp.status_code, resp.reason, list(resp.headers.fields), resp.raw_content or b"", sse))
        rec.request_bytes += len(body)
        rec.response_bytes += len(resp.raw_content or b"")
    return rec


def moved(rec: Recording, path: Path, stub: int) -> list[int]:
    """Write the recording's registry to `path` with every listener on a port of this run and every upstream the
    stub; the new ports in the recording's listener order."""
    reg = registry_file.load(path.with_name("recorded.yaml"))
    ports = {port: distinct_port() for port in rec.listeners}
    for t in reg:
        for service, route in t.routes():
            if route.get("listen") is not None:
                route["listen"] = ports.get(route["listen"], distinct_port())
            if service == PROVIDER:
                t.upstream = f"http://127.0.0.1:{stub}"
            else:
                t.services[service].upstream = f"http://127.0.0.1:{stub}"
    reg.validate()
    reg.save(path)
    return [ports[p] for p in rec.listeners]


@dataclass
class Proxy:
    """One configuration of a round: its mitmdump and the ports of its listeners (in the recording's order)."""

    name: str
    child: Child
    ports: list[int]

    def cpu(self) -> float:
        """CPU seconds its mitmdump (and any scan worker of it) has used so far."""
        total = 0.0
        for p in [psutil.Process(self.child.proc.pid), *descendants(self.child.proc.pid)]:
            try:
                times = p.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
        return total


def start(procs: ProcessSet, rec: Recording, root: Path, stub: int, trees: dict[str, Path | None],
          workers: int | None, cpus: set[int] | None) -> list[Proxy]:
    """Every configuration of `trees` (None: plain mitmdump, or streaming SSE for `stream`), up and accepting. Their
    CA is made first: mitmdumps starting side by side on an empty confdir would each write it as another reads it."""
    ensure_ca(root / "confdir")
    proxies = []
    for name, tree in trees.items():
        ports = moved(rec, root / f"registry-{name}.yaml", stub)
        extra: list[str] = []
        if name == "stream":
            extra = ["-s", str(STREAM_ADDON)]
        elif tree is not None:
            files = [f"tenancy_registry={root}/registry-{name}.yaml", f"tenancy_ledger={root}/ledger-{name}.jsonl"]
            extra = ["-s", str(tree / "addons" / "tenancy.py"), "--set", files[0], "--set", files[1]]
            if workers is not None:
                extra += ["--set", f"tenancy_workers={workers}"]
        modes = [f"reverse:http://127.0.0.1:{stub}@127.0.0.1:{p}" for p in ports]
        env = {**os.environ, "PYTHONPATH": str(tree or REPO)}
        child = spawn(procs, mitmdump_argv(root / "confdir", modes, extra), ports, root / f"mitmdump-{name}.log", env,
                      cpus)
        proxies.append(Proxy(name, child, ports))
    ready([p.child for p in proxies])
    return proxies


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ex: Exchange) -> float:
    """Send one request and read its whole response (any status): the seconds it took."""
    began = time.perf_counter()
    writer.write(ex.raw)
    await writer.drain()
    head = (await reader.readuntil(b"\r\n\r\n")).lower()
    status = int(head.split(b" ", 2)[1])
    if ex.head or status in (204, 304) or 100 <= status < 200:
        return time.perf_counter() - began
    if b"transfer-encoding: chunked" in head:
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            await reader.readexactly(size + 2)
        await reader.readuntil(b"\r\n")
    elif b"content-length:" in head:
        await reader.readexactly(int(head.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0]))
    else:
        raise RuntimeError(f"a response without a length: {head[:80]!r}")
    return time.perf_counter() - began


async def replay(rec: Recording, proxies: list[Proxy]) -> dict[str, float]:
    """Every exchange to every configuration in turn (the order rotated every exchange), one at a time, on one
    keep-alive connection per configuration and listener: the summed latency of each configuration."""
    conns: dict[tuple[int, int], tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
    spent = dict.fromkeys((p.name for p in proxies), 0.0)
    for n, ex in enumerate(rec.exchanges):
        for i in [(n + k) % len(proxies) for k in range(len(proxies))]:
            proxy = proxies[i]
            if (i, ex.listener) not in conns:
                reader, writer = await asyncio.open_connection("127.0.0.1", proxy.ports[ex.listener], limit=1 << 24)
                writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conns[i, ex.listener] = reader, writer
            spent[proxy.name] += await exchange(*conns[i, ex.listener], ex)
    for _, writer in conns.values():
        writer.close()
    return spent


def _ledger(path: Path) -> tuple[int, int]:
    """(flows, flagged) of an addon's ledger."""
    lines = path.read_text().splitlines() if path.exists() else []
    return len(lines), sum('"flagged":true' in line for line in lines)


def bench_replay(procs: ProcessSet, evidence: Path, root: Path, rounds: int, setup: tuple[str | None, int | None,
                 set[int] | None], limit: int | None) -> list[str]:
    """Replay one evidence folder `rounds` times; print each round and return the ratio lines."""
    ref, workers, cpus = setup
    rec = load(evidence, limit)
    (root / "recorded.yaml").write_bytes((evidence / "registry.yaml").read_bytes())
    stub = distinct_port()
    with (root / "responses.pickle").open("wb") as fh:
        pickle.dump(rec.responses, fh)
    stub_child = spawn(procs, [sys.executable, replay_stub.__file__, str(stub), str(root / "responses.pickle")], [stub],
                       root / "stub.log")
    ready([stub_child])
    trees: dict[str, Path | None] = {"plain": None, "stream": None, "addon": REPO}
    if ref:
        trees["old"] = old_tree(ref, root / "old") if not (root / "old").exists() else root / "old"
    left = ", ".join(f"{n} {why}" for why, n in rec.left_out.items()) or "none"
    print(f"replay {rec.name}: {len(rec.exchanges)} flows to {len(rec.listeners)} listeners of "
          f"{len(rec.registry.names())} tenants, {rec.request_bytes / 1e6:.1f} MB of requests, "
          f"{rec.response_bytes / 1e6:.1f} MB of responses; left out: {left}")
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    for r in range(rounds):
        for ledger in root.glob("ledger-*.jsonl"):
            ledger.unlink()
        proxies = start(procs, rec, root, stub, trees, workers, cpus)
        try:
            before = {p.name: p.cpu() for p in proxies}
            began = time.perf_counter()
            spent = asyncio.run(replay(rec, proxies))
            took = time.perf_counter() - began
            cpu = {p.name: p.cpu() - before[p.name] for p in proxies}
        finally:
            for p in proxies:
                stop_tree(p.child.proc, grace=10)
        for name in trees:
            got[name].append((spent[name], cpu[name]))
        ledgers = ", ".join(f"{name} {n} flows, {k} flagged" for name in trees if name in BASELINES
                            for n, k in [_ledger(root / f"ledger-{name}.jsonl")])
        print(f"  round {r + 1}: {took:.1f} s; " + ", ".join(f"{name} {spent[name]:.2f} s ({cpu[name]:.2f} s CPU)"
                                                          for name in trees) + f"; ledgers: {ledgers}")
    return ratio_lines(rec.name, got)


def ratio_lines(name: str, got: dict[str, list[tuple[float, float]]]) -> list[str]:
    """Per configuration with an addon and baseline: throughput and CPU ratios, median [lowest, highest]."""
    lines = []
    for addon, bases in BASELINES.items():
        for base in bases:
            if addon not in got or base not in got:
                continue
            speed = [b[0] / a[0] for a, b in zip(got[addon], got[base], strict=True)]
            cpu = [a[1] / b[1] for a, b in zip(got[addon], got[base], strict=True) if b[1] > 0]
            cpus = f"{statistics.median(cpu):5.2f}x [{min(cpu):.2f}, {max(cpu):.2f}]" if cpu else "-"
            lines.append(f"{name:10} {addon:6} / {base:6}  throughput {statistics.median(speed):5.2f}x "
                         f"[{min(speed):.2f}, {max(speed):.2f}]   CPU {cpus}")
    return lines

"""The tenancy addon's scan pool (harness.capture.pool): the same findings as the inline inspection, byte for
byte, over a set of flows (JSON, SSE, encodings, keys, models, near misses); the option; workers lost and
stopped, none surviving."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from mitmproxy import exceptions, http
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import taddons, tflow

from harness.capture import inspection
from harness.capture.addon import Tenancy
from harness.capture.pool import default_workers
from harness.core.registry import Registry, mint
from harness.detect import flows

PORTS = {"alpha": 18101, "beta": 18102}
PAD = "x" * (20 * 1024)  # past inspection.POOLED_BYTES: the scan goes to the pool


@pytest.fixture
def reg(tmp_path: Path) -> Registry:
    registry = mint([*PORTS, "gamma"], tmp_path / "work",
                    {"alpha": {"listen": PORTS["alpha"]}, "beta": {"listen": PORTS["beta"]},
                     "gamma": {"host": "gamma.test"}})
    for name in registry.names():
        registry[name].upstream = "http://127.0.0.1:29001"
    registry.save(tmp_path / "registry.yaml")
    return registry


def turn(reg: Registry, tenant: str, content: str = "hello", **over: object) -> bytes:
    return json.dumps({"model": reg[tenant].model, "messages": [{"role": "user", "content": content + PAD}],
                       "tools": [{"type": "function", "function": {"name": "terminal"}}]} | over).encode()


def sse(*pieces: str) -> bytes:
    events = [{"choices": [{"index": 0, "delta": {"content": p}}]} for p in (*pieces, PAD)]
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


Case = tuple[str, bytes, dict[str, str], bytes, str]  # tenant, request body, request headers, response, its type


def cases(reg: Registry) -> dict[str, Case]:
    """Flows with a planted finding of every kind the scan or the in-path checks report, and near misses."""
    a, b = reg["alpha"], reg["beta"]
    soul, memory, workdir = b.canaries["soul"], b.canaries["memory"], b.canaries["workdir"]
    near = soul[:-1] + ("0" if soul[-1] != "0" else "1")  # one character off: nobody's canary
    key = {"authorization": f"Bearer {a.key}"}
    ok = json.dumps({"choices": [{"message": {"content": "fine" + PAD}}]}).encode()
    leak_out = json.dumps({"content": f"env: {b.canaries['env_marker']}" + PAD}).encode()
    return {
        "clean": ("alpha", turn(reg, "alpha"), key, ok, "application/json"),
        "near miss": ("alpha", turn(reg, "alpha", f"is {near} yours?"), key, ok, "application/json"),
        "own canaries": ("alpha", turn(reg, "alpha", a.canaries["soul"]), key, ok, "application/json"),
        "plain leak": ("alpha", turn(reg, "alpha", f"remember {memory}"), key, ok, "application/json"),
        "base64 leak": ("alpha", turn(reg, "alpha", base64.b64encode(soul.encode()).decode()), key, ok,
                        "application/json"),
        "gzip body": ("alpha", gzip.compress(turn(reg, "alpha", soul)), key | {"content-encoding": "gzip"}, ok,
                      "application/json"),
        "foreign key": ("alpha", turn(reg, "alpha"), {"authorization": f"Bearer {b.key}"}, ok, "application/json"),
        "foreign model and a leak": ("alpha", turn(reg, "alpha", soul, model=b.model), key, ok, "application/json"),
        "header leak": ("alpha", turn(reg, "alpha"), key | {"x-note": workdir}, ok, "application/json"),
        "response leak": ("alpha", turn(reg, "alpha"), key, leak_out, "application/json"),
        "sse split leak": ("alpha", turn(reg, "alpha", stream=True), key,
                           sse("cwd is ", workdir[:10], workdir[10:], " ok"), "text/event-stream"),
        "sse clean": ("alpha", turn(reg, "alpha", stream=True), key, sse("hello ", a.canaries["workdir"]),
                      "text/event-stream"),
        "sse near miss": ("alpha", turn(reg, "alpha", stream=True), key, sse(near[:9], near[9:]),
                          "text/event-stream"),
        "beta's leak of alpha": ("beta", turn(reg, "beta", a.canaries["memory"]), {"authorization": f"Bearer {b.key}"},
                                 ok, "application/json"),
    }


def make_flow(name: str, case: Case) -> http.HTTPFlow:
    """The same flow every time it is made (id, timestamps): inline and pooled inspect equal flows."""
    tenant, body, headers, _, _ = case
    port = PORTS[tenant]
    f = tflow.tflow(req=http.Request.make("POST", f"http://127.0.0.1:{port + 1000}/v1/chat/completions?x=1", b"",
                                          {"content-type": "application/json", **headers}))
    f.id = f"flow-{name.replace(' ', '-')}"
    f.request.raw_content = body
    f.request.timestamp_start = 1.0
    f.client_conn.proxy_mode = ProxyMode.parse(f"reverse:http://127.0.0.1:{port + 1000}@{port}")
    return f


async def drive(addon: Tenancy, f: http.HTTPFlow, case: Case) -> None:
    """The hooks mitmproxy runs for one flow, each awaited if it returns an awaitable (as mitmproxy does)."""

    async def hook(result: object) -> None:
        if result is not None:
            await result  # type: ignore[misc]

    await hook(addon.request(f))
    f.response = http.Response.make(200, b"", {"content-type": case[4]})
    f.response.raw_content = case[3]
    addon.responseheaders(f)
    if callable(f.response.stream):  # SSE: the tap sees the stream in pieces
        f.response.data.content = None
        for i in range(0, len(case[3]), 4096):
            f.response.stream(case[3][i:i + 4096])
    await hook(addon.response(f))


async def inspect_all(tmp_path: Path, reg: Registry, workers: int, tag: str,
                      before: Callable[[Tenancy], None] = lambda _: None) -> dict[str, tuple[object, ...]]:
    """Every case through an addon with `workers` (all at once, as concurrent flows): each flow's metadata,
    mark and comment, and the ledger."""
    addon = Tenancy()
    ledger = tmp_path / f"ledger-{tag}.jsonl"
    out: dict[str, tuple[object, ...]] = {}
    with taddons.context(addon) as ctx:
        ctx.configure(addon, tenancy_registry=str(tmp_path / "registry.yaml"), tenancy_ledger=str(ledger),
                      tenancy_workers=workers)
        addon.running()
        if workers:
            await until_up(addon)
            before(addon)
        made = {name: (make_flow(name, case), case) for name, case in cases(reg).items()}
        await asyncio.gather(*(drive(addon, f, case) for f, case in made.values()))
        addon.done()
    for name, (f, _) in made.items():
        out[name] = (json.dumps(f.metadata["tenancy"], sort_keys=True), f.marked, f.comment)
    out["ledger"] = tuple(sorted(ledger.read_text().splitlines()))
    return out


def compare(tmp_path: Path, reg: Registry, workers: int, tag: str,
            before: Callable[[Tenancy], None] = lambda _: None) -> tuple[dict[str, tuple[object, ...]], ...]:
    """The cases inspected inline, then with `workers` (`before` runs once they are up), in one event loop."""

    async def both() -> tuple[dict[str, tuple[object, ...]], ...]:
        return await inspect_all(tmp_path, reg, 0, "inline"), await inspect_all(tmp_path, reg, workers, tag, before)

    return asyncio.run(both())


async def until_up(addon: Tenancy) -> None:
    pool = addon.inspection.pool
    pool.ready()
    for _ in range(600):
        if pool.live == pool.size:
            return
        await asyncio.sleep(0.05)
    pytest.fail("the scan workers did not start")


def test_pooled_inspection_gives_the_inline_findings_byte_for_byte(tmp_path, reg, monkeypatch):
    monkeypatch.setattr(inspection, "BUSY", 0)  # every scan to the pool, the first flow's too
    def in_workers_only(_: Tenancy) -> None:  # from here on, a scan run in this process fails the test
        for scan in (flows.RequestScan, flows.ResponseScan):
            monkeypatch.setattr(scan, "run", lambda *_: pytest.fail("scanned inline, not in a worker"))

    inline, pooled = compare(tmp_path, reg, 2, "pooled", in_workers_only)
    assert pooled == inline
    flagged = {name for name, (meta, *_) in inline.items() if name != "ledger" and json.loads(meta)["flagged"]}
    assert flagged == {"plain leak", "base64 leak", "gzip body", "foreign key", "foreign model and a leak",
                       "header leak", "response leak", "sse split leak", "beta's leak of alpha"}
    split = json.loads(inline["sse split leak"][0])["findings"]
    assert [f["location"].split("@")[0] for f in split] == [
        "flow:flow-sse-split-leak:response.sse.choices[0].delta.content"]


def test_short_bodies_stay_inline_and_agree(tmp_path, reg, monkeypatch):
    monkeypatch.setattr(inspection, "POOLED_BYTES", 1 << 30)
    monkeypatch.setattr(flows.RequestScan, "run", lambda *_: pytest.fail("a short body went to the pool"))
    inline, short = compare(tmp_path, reg, 1, "short")
    assert short == inline


def test_a_flow_alone_is_scanned_inline(tmp_path, reg, monkeypatch):
    """With no other flow in flight, the hand-over would only add latency: the scan stays in the loop."""
    monkeypatch.setattr(inspection, "BUSY", 1 << 20)
    monkeypatch.setattr(flows.RequestScan, "run", lambda *_: pytest.fail("a flow alone went to the pool"))
    inline, alone = compare(tmp_path, reg, 1, "alone")
    assert alone == inline


def test_a_lost_worker_is_dropped_and_its_scans_run_inline(tmp_path, reg, monkeypatch):
    monkeypatch.setattr(inspection, "BUSY", 0)
    def kill_one(addon: Tenancy) -> None:
        (worker,) = addon.inspection.pool._spawned
        os.kill(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait()

    inline, lost = compare(tmp_path, reg, 1, "lost", kill_one)
    assert lost == inline


def test_done_stops_every_worker(tmp_path, reg):
    addon = Tenancy()
    pids: list[int] = []

    async def main() -> None:
        with taddons.context(addon) as ctx:
            ctx.configure(addon, tenancy_registry=str(tmp_path / "registry.yaml"), tenancy_workers=3)
            addon.running()
            await until_up(addon)
            pids.extend(w.proc.pid for w in addon.inspection.pool._spawned)
            assert {p.pid for p in psutil.Process().children()} >= set(pids)
            ctx.configure(addon, tenancy_workers=1)  # a new size: the old pool is stopped at once
            assert not any(map(_running, pids))
            await until_up(addon)
            pids.extend(w.proc.pid for w in addon.inspection.pool._spawned)
            addon.done()

    asyncio.run(main())
    assert len(pids) == 4 and not any(map(_running, pids))


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_worker_exits_when_the_addon_is_gone(tmp_path):
    """The worker's end of the socket closes when the proxy dies (even by SIGKILL): the worker exits."""
    import socket
    import subprocess

    mine, theirs = socket.socketpair()
    memfd = os.memfd_create("test")
    os.ftruncate(memfd, 4096)
    proc = subprocess.Popen([sys.executable, "-m", "harness.capture.worker", str(theirs.fileno()), str(memfd)],
                            pass_fds=(theirs.fileno(), memfd))
    theirs.close()
    os.close(memfd)
    assert mine.recv(8)  # the ready frame's header
    mine.close()
    assert proc.wait(timeout=30) == 0


@pytest.mark.parametrize("bad", [-1, 65])
def test_the_workers_option_is_validated(bad):
    addon = Tenancy()
    with taddons.context(addon) as ctx:
        with pytest.raises(exceptions.OptionsError, match="tenancy_workers"):
            ctx.configure(addon, tenancy_workers=bad)
        ctx.configure(addon, tenancy_workers=0)
        assert addon.inspection.pool.size == 0


def test_workers_are_refused_where_memory_cannot_be_shared(monkeypatch):
    monkeypatch.setattr(inspection, "SUPPORTED", False)
    addon = Tenancy()
    with taddons.context(addon) as ctx, pytest.raises(exceptions.OptionsError, match="need Linux"):
        ctx.configure(addon, tenancy_workers=1)


def test_the_default_leaves_the_event_loop_and_the_rest_a_cpu_each(monkeypatch):
    for cpus, workers in ((1, 0), (2, 0), (3, 1), (6, 4), (64, 4)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda _, n=cpus: set(range(n)))
        assert default_workers() == workers


def test_live_mitmdump_with_workers_saves_what_the_reconciler_finds_and_leaves_no_worker(tmp_path, reg):
    """A real mitmdump with two workers, six long flows in flight at once (so the pool takes their scans): each
    ledger line and saved flow is what the offline inspection of the saved flow gives, and after SIGINT no
    worker is left."""
    import subprocess
    import threading
    import time
    import urllib.request
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from mitmproxy import io

    from harness.detect.engine.matcher import Matcher
    from tests.test_addon_live import free_port, mitmdump_argv, wait_listening

    answers = {"leak": json.dumps({"content": reg["beta"].canaries["env_marker"] + PAD}).encode(),
               "clean": json.dumps({"content": "fine" + PAD}).encode()}

    class Stub(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            time.sleep(0.5)  # every flow is in flight while the others arrive
            body = answers[self.headers.get("x-answer", "clean")]
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    stub = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    upstream = f"http://127.0.0.1:{stub.server_address[1]}"
    port = free_port()
    reg["alpha"].route = {"listen": port}
    reg.save(tmp_path / "registry.yaml")
    ledger, saved, log = tmp_path / "ledger.jsonl", tmp_path / "flows.mitm", tmp_path / "mitmdump.log"
    argv = [*mitmdump_argv(), "-s", str(Path(__file__).resolve().parent.parent / "addons" / "tenancy.py"),
            "--set", f"confdir={tmp_path / 'conf'}", "--set", f"tenancy_registry={tmp_path / 'registry.yaml'}",
            "--set", f"tenancy_ledger={ledger}", "--set", "tenancy_workers=2", "-w", str(saved),
            "--set", "listen_host=127.0.0.1", "--mode", f"reverse:{upstream}@{port}"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    workers: list[psutil.Process] = []
    try:
        wait_listening(port, proc, log)
        a, b = reg["alpha"], reg["beta"]
        requests = [(turn(reg, "alpha", f"remember {b.canaries['memory']}" if i % 3 == 0 else "hi"),
                     {"x-answer": "leak" if i % 2 else "clean"}) for i in range(6)]

        def send(body: bytes, headers: dict[str, str]) -> None:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                         {"content-type": "application/json", "authorization": f"Bearer {a.key}",
                                          **headers})
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=60) as resp:
                resp.read()

        for _ in range(2):  # the first round starts the pool
            threads = [threading.Thread(target=send, args=r) for r in requests]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            workers = [c for c in psutil.Process(proc.pid).children() if "harness.capture.worker" in c.cmdline()]
        assert len(workers) == 2
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 0, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        stub.shutdown()
    assert not any(_running(w.pid) for w in workers)
    assert "Traceback" not in log.read_text() and "scan worker" not in log.read_text()
    lines = {x["flow"]: x for x in map(json.loads, ledger.read_text().splitlines())}
    with open(saved, "rb") as fh:
        back = list(io.FlowReader(fh).stream())
    assert len(back) == len(lines) == 12
    matcher = Matcher.for_registry(reg)
    for f in back:
        entry = flows.inspect_flow(reg, matcher, f).ledger_entry()
        assert entry == lines[f.id] and f.metadata["tenancy"] == {k: v for k, v in entry.items()
                                                                  if k not in ("time", "flow")}
        assert bool(f.marked) == entry["flagged"]
    assert sum(x["flagged"] for x in lines.values()) == 8  # flows 2 and 4 of the six are clean, in each round

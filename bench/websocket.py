"""The cost of inspecting websocket messages: in-process (the addon's hooks) and through a real mitmdump.

    .venv/bin/python bench/websocket.py [--messages 10000] [--rounds 3] [--smoke]

A registry of 8 tenants x 12 canaries; one connection on a tenant's reverse listener carrying `--messages` JSON
text messages (half each way, about 300 bytes each, some naming the tenant's own canaries: a clean stream).

- hooks: `websocket_message` for every message, then `websocket_end` (the whole streams scanned), on the
  `Tenancy` addon in-process; against the same loop without the hooks.
- proxy: an echo server behind a reverse listener of mitmdump with the addon, against plain mitmdump; the client
  sends every message and reads every echo; each round runs both, alternately.

`--smoke` (seconds): 200 messages, one round of each; proves the hooks and both proxies run, its figures too few
to read.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import children
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import taddons, tflow
from mitmproxy.websocket import WebSocketData, WebSocketMessage
from payloads import make_registry
from websockets.sync.client import connect
from websockets.sync.server import ServerConnection, serve
from wsproto.frame_protocol import Opcode

from harness.capture.addon import Tenancy
from harness.capture.proxy import ensure_ca, free_port
from harness.core.procs import ProcessSet
from harness.core.registry import Registry

ROOT = Path(__file__).resolve().parent.parent


def messages(reg: Registry, n: int) -> list[tuple[bool, bytes]]:
    t = reg["t0"]
    out = []
    for i in range(n):
        text = t.canaries["memory"] if i % 10 == 0 else f"message number {i} about the weather and the build"
        doc = {"type": "message", "channel": "C0123456", "user": "U0456789", "ts": f"{1700000000 + i}.000100",
               "text": text, "blocks": [{"type": "rich_text", "elements": [{"type": "text", "text": text}]}]}
        out.append((i % 2 == 0, json.dumps(doc).encode()))
    return out


def hooks(reg: Registry, stream: list[tuple[bool, bytes]], inspect: bool) -> tuple[float, float]:
    """Seconds for every message's hook and the end of the connection, and for the end alone."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "registry.yaml"
        reg.save(path)
        addon = Tenancy()
        with taddons.context(addon) as tctx:
            tctx.configure(addon, tenancy_registry=str(path))
            f = tflow.twebsocketflow()
            f.client_conn.proxy_mode = ProxyMode.parse(f"reverse:http://127.0.0.1:9@{reg['t0'].listen}")
            response, f.response, f.websocket = f.response, None, None
            addon.request(f)
            f.response, f.websocket = response, WebSocketData()
            addon.response(f)
            start = time.perf_counter()
            for from_client, content in stream:
                f.websocket.messages.append(WebSocketMessage(Opcode.TEXT, from_client, content))
                if inspect:
                    addon.websocket_message(f)
            end = time.perf_counter()
            if inspect:
                addon.websocket_end(f)
            done = time.perf_counter()
            return done - start, done - end


def echo(conn: ServerConnection) -> None:
    for message in conn:
        conn.send(message)


def through(port: int, stream: list[tuple[bool, bytes]]) -> float:
    """Seconds to send every client message and read every echo through the listener on `port`."""
    sent = [content.decode() for from_client, content in stream if from_client]
    with connect(f"ws://127.0.0.1:{port}/", proxy=None, max_queue=None) as ws:
        start = time.perf_counter()
        reader = threading.Thread(target=lambda: [ws.recv() for _ in sent])
        reader.start()
        for text in sent:
            ws.send(text)
        reader.join()
        return time.perf_counter() - start


def mitmdump(procs: ProcessSet, tmp: Path, reg: Registry, upstream: str, addon: bool
             ) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    ensure_ca(ROOT / "certs")  # under the lock an audit starting at the same time takes too
    argv = [str(Path(sys.executable).parent / "mitmdump"), "-q", "--set", f"confdir={ROOT / 'certs'}",
            "--mode", f"reverse:{upstream}@127.0.0.1:{port}"]
    if addon:
        reg["t0"].route = {"listen": port}
        reg.save(tmp / "registry.yaml")
        argv += ["-s", str(ROOT / "addons" / "tenancy.py"), "--set", f"tenancy_registry={tmp / 'registry.yaml'}",
                 "--set", f"tenancy_ledger={tmp / 'ledger.jsonl'}"]
    proc = procs.spawn(argv, env={**os.environ, "PYTHONPATH": str(ROOT)})
    for _ in range(300):
        try:
            connect(f"ws://127.0.0.1:{port}/", proxy=None, open_timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("mitmdump did not come up")


def bench(args: argparse.Namespace, procs: ProcessSet) -> int:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        reg = make_registry(tmp)
        stream = messages(reg, args.messages)
        size = sum(len(c) for _, c in stream)
        on = [hooks(reg, stream, True) for _ in range(args.rounds)]
        off = [hooks(reg, stream, False) for _ in range(args.rounds)]
        print(f"{args.messages} messages, {size / 1e6:.1f} MB")
        total, end = statistics.median(t for t, _ in on), statistics.median(e for _, e in on)
        print(f"hooks: {total:.3f} s ({total / args.messages * 1e6:.1f} us/message; the end of the connection "
              f"{end:.3f} s of it); without them: {statistics.median(t for t, _ in off):.3f} s")
        server = serve(echo, "127.0.0.1", 0, max_queue=None)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        upstream = f"http://127.0.0.1:{server.socket.getsockname()[1]}"
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.rounds):
            for addon in (True, False):
                proc, port = mitmdump(procs, tmp, reg, upstream, addon)
                try:
                    times[addon].append(through(port, stream))
                finally:
                    os.killpg(proc.pid, signal.SIGINT)
                    proc.wait(timeout=30)
        server.shutdown()
        with_addon, plain = statistics.median(times[True]), statistics.median(times[False])
        print(f"proxy, {len(stream) // 2} messages each way: with the addon {with_addon:.2f} s, plain mitmdump "
              f"{plain:.2f} s ({with_addon / plain:.2f}x; rounds {times})")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="200 messages, one round (seconds)")
    arguments = ap.parse_args()
    if arguments.smoke:
        arguments.messages, arguments.rounds = 200, 1
    sys.exit(children.run(lambda procs: bench(arguments, procs)))

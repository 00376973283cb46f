"""Time (and optionally profile) the tenancy addon's hooks in-process on one 256 KiB flow.

    .venv/bin/python bench/hooks.py [--kib 256] [--rounds 200] [--profile]

A registry of 8 tenants x 12 canaries; one reverse-mode main turn whose request body and response body
(JSON, or SSE passed through the stream tap) are `--kib` KiB and carry the tenant's own canaries. Prints
the time per flow of request + responseheaders + response, the request and response hooks separately, the
matcher's scan of both bodies, and the floor: what any inspection that keeps every layer must spend on the flow
whatever else it saves (the matcher's scan, one pass over each body for the runs of base64 and hex characters a
layer may hide in, the request's JSON parse and, for SSE, the reassembly of the streams), JSON and SSE
interleaved in the same run. `--profile` prints the top of a cProfile of the hooks.

`--smoke` (what tests/test_benches.py runs): 16 KiB bodies, 5 rounds; the same table, too few rounds to read.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from mitmproxy import http
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import taddons, tflow
from payloads import json_response, make_registry, request_body, sse_events

from harness.core.registry import Registry
from harness.detect.decode import loads, sse_streams
from harness.detect.engine import containers
from harness.detect.engine.matcher import Matcher

ROOT = Path(__file__).resolve().parent.parent


def _addon_module():
    spec = importlib.util.spec_from_file_location("tenancy_addon", ROOT / "addons" / "tenancy.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_flow(addon, reg: Registry, tenant: str, body: bytes, response: bytes | list[bytes]) -> tuple[float, float]:
    """(request hook seconds, responseheaders + stream + response hook seconds) of one flow."""
    port = reg[tenant].listen
    hdrs = {"content-type": "application/json", "authorization": f"Bearer {reg[tenant].key}"}
    f = tflow.tflow(req=http.Request.make("POST", "http://127.0.0.1:9/v1/chat/completions", b"", hdrs))
    f.request.raw_content = body
    f.client_conn.proxy_mode = ProxyMode.parse(f"reverse:http://127.0.0.1:9@{port}")
    f.response = None
    t0 = time.perf_counter()
    addon.request(f)
    t1 = time.perf_counter()
    sse = isinstance(response, list)
    ctype = "text/event-stream" if sse else "application/json"
    f.response = http.Response.make(200, b"", {"content-type": ctype})
    if not sse:
        f.response.raw_content = response
    t2 = time.perf_counter()
    addon.responseheaders(f)
    if sse:
        for event in response:
            f.response.stream(event)
    addon.response(f)
    t3 = time.perf_counter()
    assert not f.marked, f.metadata["tenancy"]["findings"]
    return t1 - t0, t3 - t2


def _floor(matcher: Matcher, body: bytes, response: bytes, *, sse: bool) -> None:
    """The work no inspection that keeps every layer can skip: the matcher's scan of both bodies, the pass
    over each for the runs a base64 or hex layer may start in, the request's JSON (its model, its key) and the
    reassembly of an SSE response's streams (a canary cut across events)."""
    for data in (body, response):
        matcher.find(data)
        containers.layer_starts(data, top=False, min_bytes=matcher.shortest)
    loads(body)
    if sse:
        sse_streams(response)


def _ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:7.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--profile", action="store_true", help="print the top 25 of a cProfile of the hooks")
    ap.add_argument("--smoke", action="store_true", help="16 KiB, 5 rounds: does the bench still run")
    a = ap.parse_args(argv)
    if a.smoke:
        a.kib, a.rounds = 16, 5
    size = a.kib * 1024
    with tempfile.TemporaryDirectory(prefix="bench-hooks-") as tmp:
        reg = make_registry(Path(tmp))
        regfile = Path(tmp) / "registry.yaml"
        reg.save(regfile)
        matcher = Matcher.for_registry(reg)
        addon = _addon_module().Tenancy()
        body = request_body(reg, "t0", size)
        cases: dict[str, bytes | list[bytes]] = {
            "json": json_response(reg, "t0", size), "sse": sse_events(reg, "t0", size)}
        with taddons.context(addon) as ctx:
            ctx.configure(addon, tenancy_registry=str(regfile), tenancy_ledger=str(Path(tmp) / "ledger.jsonl"))
            times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in cases}
            scan: dict[str, list[float]] = {k: [] for k in cases}
            floor: dict[str, list[float]] = {k: [] for k in cases}
            for _ in range(a.rounds):  # interleaved: json, sse, json, sse ...
                for kind, resp in cases.items():
                    req_s, resp_s = one_flow(addon, reg, "t0", body, resp)
                    times[kind][0].append(req_s)
                    times[kind][1].append(resp_s)
                    data = resp if isinstance(resp, bytes) else b"".join(resp)
                    t = time.perf_counter()
                    matcher.find(body)
                    matcher.find(data)
                    scan[kind].append(time.perf_counter() - t)
                    t = time.perf_counter()
                    _floor(matcher, body, data, sse=kind == "sse")
                    floor[kind].append(time.perf_counter() - t)
            print(f"{a.kib} KiB request + {a.kib} KiB response, 8 tenants x 12 canaries, "
                  f"{len(matcher._patterns)} patterns; medians of {a.rounds} interleaved rounds")
            print(f"{'body':5} {'request ms':>11} {'response ms':>12} {'flow ms':>8} {'scan ms':>8} {'flow/scan':>10}"
                  f" {'floor ms':>9}")
            for kind, (req, resp) in times.items():
                flow = [r + s for r, s in zip(req, resp, strict=True)]
                ratio = statistics.median(flow) / statistics.median(scan[kind])
                print(f"{kind:5} {_ms(req):>11} {_ms(resp):>12} {_ms(flow):>8} {_ms(scan[kind]):>8} {ratio:9.2f}x"
                      f" {_ms(floor[kind]):>9}")
            if a.profile:
                run: Callable[[], object] = lambda: [one_flow(addon, reg, "t0", body, r)  # noqa: E731
                                                     for _ in range(50) for r in cases.values()]
                prof = cProfile.Profile()
                prof.runcall(run)
                pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Load and odd bodies through one real mitmdump (no Hermes): 8 tenants, 20 concurrent streaming turns.

A small bounded load client talks straight to the proxy's reverse listeners. Every flow must be recorded
(proxy count == stub count == requests sent), attributed to its listener's tenant, and seen by that
tenant's stub; odd bodies (non-JSON, binary, > 16 MiB, unknown content-encoding, multipart) are
inspected as bytes and never take the proxy down.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.core.registry import Registry
from harness.detect.decode import MAX_BODY
from harness.detect.reconcile import read_flows
from harness.detect.routes import route_of
from harness.session import AuditSession, tenant_names

TENANTS, CONCURRENT = 8, 20
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def streaming_turn(reg: Registry, tenant: str, n: int) -> tuple[str, int, bool]:
    """One streaming main turn on `tenant`'s listener; returns (tenant, load id, saw [DONE])."""
    t = reg[tenant]
    body = {"model": t.model, "stream": True, "user": f"load-{n}", "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "terminal"}}]}
    req = urllib.request.Request(f"http://127.0.0.1:{t.listen}/v1/chat/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json", "authorization": f"Bearer {t.key}"})
    with NO_PROXY.open(req, timeout=60) as resp:
        data = resp.read()
    return tenant, n, data.rstrip().endswith(b"data: [DONE]")


def send_raw(port: int, key: str, body: bytes, headers: dict[str, str]) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                 {"authorization": f"Bearer {key}", **headers})
    try:
        with NO_PROXY.open(req, timeout=120) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code


@pytest.fixture
def proxy_of_8(tmp_path: Path):
    """8 tenants behind one mitmdump, set up as an audit is (every port bound before the registry names it),
    their stubs streaming slowly enough for the turns to overlap."""
    with AuditSession(tmp_path, tenant_names(TENANTS)) as session:
        session.mint()
        stubs = session.start_stubs()
        for stub in stubs.values():
            stub.chunk_delay = 0.005
        yield session.registry, stubs, session.start_proxy()
    assert session.survivors == 0


def test_a_turn_sent_the_moment_start_returns_is_recorded(proxy_of_8):
    """The addon is configured before mitmdump serves any listener: a turn sent at once is recorded."""
    reg, _, proxy = proxy_of_8
    assert streaming_turn(reg, reg.names()[0], 0)[2]
    (line,) = [json.loads(x) for x in proxy.ledger_path.read_text().splitlines()]
    assert (line["tenant"], line["bearer"], line["flagged"]) == (reg.names()[0], "own", False)


def test_8_tenants_20_concurrent_streaming_turns_and_odd_bodies(proxy_of_8):
    reg, stubs, proxy = proxy_of_8
    names = reg.names()
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=CONCURRENT) as pool:
        results = list(pool.map(lambda n: streaming_turn(reg, names[n % TENANTS], n), range(CONCURRENT)))
    seconds = time.monotonic() - started
    assert all(done for _, _, done in results), results
    sent = {n: tenant for tenant, n, _ in results}

    alpha, soul = reg["alpha"], reg["beta"].canaries["soul"].encode()  # beta's canary on alpha's listener
    odd = {
        "non-json": (b"plain text " + soul, {"content-type": "text/plain"}),
        "binary": (os.urandom(4096) + soul + os.urandom(64), {"content-type": "application/octet-stream"}),
        "huge": (b"x" * (MAX_BODY + 1024) + soul, {"content-type": "application/octet-stream"}),
        "unknown-encoding": (b"opaque " + soul, {"content-encoding": "x-custom"}),
        "multipart": (b"--b\r\nContent-Disposition: form-data; name=f\r\n\r\n" + soul + b"\r\n--b--\r\n",
                      {"content-type": "multipart/form-data; boundary=b"}),
    }
    statuses = {name: send_raw(alpha.listen, alpha.key, body, hdrs) for name, (body, hdrs) in odd.items()}
    assert all(code == 400 for code in statuses.values()), statuses  # the stub's answer: the proxy stayed up
    assert proxy.alive()
    proxy.stop()

    flows, truncated = read_flows(proxy.flows_path)
    ledger = [json.loads(x) for x in proxy.ledger_path.read_text().splitlines()]
    seen_by = {r.flow_id: name for name, s in stubs.items() for r in s.snapshot()}
    load = {}
    for f in flows:
        body = json.loads(f.request.get_content(strict=False) or b"{}") if f.request.headers.get(
            "content-type", "").startswith("application/json") else {}
        if str(body.get("user", "")).startswith("load-"):
            load[int(body["user"][5:])] = f
    misattributed = [f.id for n, f in load.items()
                     if not (f.metadata["tenancy"]["tenant"] == sent[n]
                             == reg.by_listen_port(route_of(f).listen_port).name == seen_by.get(f.id))]
    lost = CONCURRENT - len(load)
    print(f"\nload: {TENANTS} tenants, {CONCURRENT} concurrent streaming turns in {seconds:.2f}s; "
          f"proxy flows {len(flows)}, ledger {len(ledger)}, stub requests {len(seen_by)}; "
          f"misattributed {len(misattributed)}, lost {lost}")
    assert truncated is None and lost == 0 and misattributed == []
    assert len(flows) == len(ledger) == len(seen_by) == CONCURRENT + len(odd)
    assert set(seen_by) == {f.id for f in flows}
    odd_lines = ledger[CONCURRENT:]
    assert [[x["kind"] for x in line["findings"]] for line in odd_lines] == [["request_leak"]] * len(odd), odd_lines
    assert all(line["tenant"] == "alpha" and line["findings"][0]["victim"] == "beta" for line in odd_lines)

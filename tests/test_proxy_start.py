"""How mitmdump starts (no Hermes): the harness binds the listeners and hands them over, so a connection made
before mitmdump serves waits instead of being refused, and readiness or failure is reported, never guessed."""

from __future__ import annotations

import http.client
import json
import os
import select
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.capture.proxy import Proxy, ProxyError, bind_listener, free_port, port_of
from harness.capture.stubs.provider import StubProvider
from harness.core.procs import ProcessSet
from harness.core.registry import Registry, mint


@pytest.fixture
def two(tmp_path: Path) -> Iterator[tuple[Registry, ProcessSet]]:
    reg = mint(["default", "alpha"], tmp_path / "work", {n: {"listen": free_port()} for n in ("default", "alpha")})
    stubs = [StubProvider(t).start() for t in reg]
    for t, stub in zip(reg, stubs, strict=True):
        t.upstream = stub.url
    reg.save(tmp_path / "registry.yaml")
    procs = ProcessSet()
    try:
        yield reg, procs
    finally:
        for stub in stubs:
            stub.stop()
        assert procs.close() == []


def waiting(port: int) -> socket.socket:
    """A connection the kernel accepted into the listener's backlog."""
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def assert_reset(sock: socket.socket) -> None:
    """The connection is reset (or closed) within the socket's timeout, not left hanging."""
    with pytest.raises(ConnectionResetError):
        if sock.recv(1) == b"":
            raise ConnectionResetError
    sock.close()


def test_a_connection_made_before_mitmdump_serves_waits_and_is_recorded(two, tmp_path):
    reg, procs = two
    proxy = Proxy(reg, tmp_path / "registry.yaml", tmp_path, procs).spawn()
    try:
        t = reg["alpha"]
        conn = http.client.HTTPConnection("127.0.0.1", t.listen, timeout=30)
        conn.connect()  # mitmdump's python is still importing mitmproxy: this would be refused without hand-over
        assert proxy._ready_fd is not None and not select.select([proxy._ready_fd], [], [], 0)[0]
        body = {"model": t.model, "messages": [{"role": "user", "content": "hi"}]}
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"content-type": "application/json", "authorization": f"Bearer {t.key}"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read()
        conn.close()
        proxy.wait_ready()
        proxy.wait_ready()  # a second wait returns at once
    finally:
        proxy.stop()
    (line,) = [json.loads(x) for x in proxy.ledger_path.read_text().splitlines()]
    assert (line["tenant"], line["bearer"], line["flagged"]) == ("alpha", "own", False)


def test_mitmdump_that_exits_at_start_fails_fast_and_resets_the_waiting(two, tmp_path):
    reg, procs = two
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants: [unclosed\n")
    proxy = Proxy(reg, bad, tmp_path, procs).spawn()
    sock = waiting(reg["alpha"].listen)
    with pytest.raises(ProxyError, match=r"did not come up \(it exited; .*tenancy_registry"):
        proxy.wait_ready()
    with pytest.raises(ProxyError, match="it exited"):  # and says so again, not "ready"
        proxy.wait_ready()
    assert_reset(sock)
    # and has exited: its files close a moment before it can be reaped (poll() alone failed 3 in 8 at load 5)
    assert proxy.proc is not None and proxy.proc.wait(timeout=5) is not None


def test_mitmdump_that_never_serves_is_killed_at_the_timeout(two, tmp_path):
    reg, procs = two
    fifo = tmp_path / "registry.fifo"
    os.mkfifo(fifo)  # the addon's configure blocks opening it: mitmdump never gets to serve
    proxy = Proxy(reg, fifo, tmp_path, procs).spawn()
    sock = waiting(reg["default"].listen)
    with pytest.raises(ProxyError, match=r"not serving after 2 s"):
        proxy.wait_ready(timeout=2)
    assert proxy.proc is not None and proxy.proc.poll() is not None
    assert_reset(sock)


def test_a_taken_port_is_one_line_and_the_registry_is_left_alone(two, tmp_path):
    """The proxy never changes the registry (its owner does): a port named there that is taken is a one-line
    ProxyError before mitmdump starts, and the registry file is unchanged."""
    reg, procs = two
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    reg["alpha"].route = {"listen": taken}
    reg.save(tmp_path / "registry.yaml")
    before = (tmp_path / "registry.yaml").read_bytes()
    try:
        with pytest.raises(ProxyError, match=rf"^mitmdump cannot listen on 127.0.0.1 port {taken} \(") as err:
            Proxy(reg, tmp_path / "registry.yaml", tmp_path, procs).spawn()
    finally:
        squatter.close()
    assert "\n" not in str(err.value)
    assert reg["alpha"].listen == taken and (tmp_path / "registry.yaml").read_bytes() == before
    assert procs.procs == []  # mitmdump was never started


def test_listeners_bound_by_the_caller_are_served(tmp_path):
    """The run binds its listeners before it writes the registry (port 0: the kernel's pick, never a taken
    port) and hands them to the proxy, which serves exactly those."""
    listeners = [bind_listener(), bind_listener()]
    names = ["default", "alpha"]
    reg = mint(names, tmp_path / "work", {n: {"listen": port_of(s)} for n, s in zip(names, listeners, strict=True)})
    stubs = [StubProvider(t).start() for t in reg]
    procs = ProcessSet()
    try:
        for t, stub in zip(reg, stubs, strict=True):
            t.upstream = stub.url
        reg.save(tmp_path / "registry.yaml")
        proxy = Proxy(reg, tmp_path / "registry.yaml", tmp_path, procs, listeners=listeners).start()
        assert all(s.fileno() == -1 for s in listeners)  # handed over: the harness keeps no copy
        for t in reg:
            conn = http.client.HTTPConnection("127.0.0.1", t.listen, timeout=10)
            conn.request("GET", "/v1/models", headers={"authorization": f"Bearer {t.key}"})
            assert conn.getresponse().status == 200
            conn.close()
        proxy.stop()
    finally:
        for stub in stubs:
            stub.stop()
        assert procs.close() == []

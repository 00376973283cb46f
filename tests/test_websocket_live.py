"""Websockets and shared platform hosts through a real mitmdump with the addon (no Hermes): a websocket with
permessage-deflate on a reverse listener, a tenant's own host and a host every tenant shares (told apart by the
credential a request carries) through the regular listener, and a host no tenant routes, refused."""

from __future__ import annotations

import json
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from websockets.datastructures import Headers
from websockets.exceptions import InvalidStatus
from websockets.http11 import Request, Response
from websockets.sync.client import connect
from websockets.sync.server import Server, ServerConnection, serve

from harness.capture.proxy import Proxy, free_port
from harness.core.procs import ProcessSet
from harness.core.registry import Registry, Service, mint
from harness.detect.engine.matcher import matcher_for
from harness.detect.flows import inspect_flow
from harness.detect.reconcile import read_flows, reconcile
from harness.detect.websocket import CLIENT, SERVER


@dataclass
class ChatStub:
    """One tenant's stub of a chat platform: its HTTP API answers with whose it is (401 in the platform's error
    shape without the tenant's credential) and its websocket echoes every message; it records what it saw."""

    tenant: str
    credential: str
    seen: list[str] = field(default_factory=list)
    server: Server | None = None

    def start(self) -> ChatStub:
        self.server = serve(self._echo, "127.0.0.1", 0, process_request=self._http, compression="deflate")
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.socket.getsockname()[1]}"

    def _http(self, conn: ServerConnection, request: Request) -> Response | None:
        if request.headers.get("upgrade", "").lower() == "websocket":
            return None
        self.seen.append(request.path)
        ok = self.credential in request.path or self.credential in request.headers.get("authorization", "")
        body = {"ok": True, "tenant": self.tenant} if ok else {"ok": False, "error": "not_authed"}
        return Response(200 if ok else 401, "OK" if ok else "Unauthorized",
                        Headers({"content-type": "application/json"}), json.dumps(body).encode())

    def _echo(self, conn: ServerConnection) -> None:
        self.seen.append(f"ws {conn.request.path}")
        for message in conn:
            conn.send(message)


@dataclass
class World:
    reg: Registry
    stubs: dict[str, ChatStub]
    proxy: Proxy
    ca: Path

    def opener(self) -> urllib.request.OpenerDirector:
        url = f"http://127.0.0.1:{self.proxy.forward_port}"
        return urllib.request.build_opener(urllib.request.ProxyHandler({"http": url, "https": url}),
                                           urllib.request.HTTPSHandler(context=self.tls()))

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def get(self, url: str, headers: dict[str, str] | None = None) -> tuple[int, dict]:
        try:
            with self.opener().open(urllib.request.Request(url, headers=headers or {}), timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            with exc:
                body = exc.read()
                return exc.code, json.loads(body) if body.startswith(b"{") else {"text": body.decode()}

    def stop(self) -> list[dict]:
        self.proxy.stop()
        return [json.loads(x) for x in self.proxy.ledger_path.read_text().splitlines()]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    """alpha and beta, each with a `chat` stub reached three ways: its own reverse listener (`chat`), its own
    host `gateway.<tenant>.chat.test` (`gateway`), and chat.example, which both share by credential (`chatapi`)."""
    reg = mint(["alpha", "beta"], tmp_path / "work", {n: {"listen": free_port()} for n in ("alpha", "beta")})
    stubs = {}
    for t in reg:
        t.canaries["chat_key"] = f"chatkey-{t.name}-{t.key[-18:]}"
        stubs[t.name] = stub = ChatStub(t.name, t.canaries["chat_key"]).start()
        t.upstream = stub.url
        t.services = {"chat": Service("chat", {"listen": free_port()}, stub.url, "chat_key"),
                      "gateway": Service("gateway", {"host": f"gateway.{t.name}.chat.test"}, stub.url, "chat_key"),
                      "chatapi": Service("chatapi", {"host": "chat.example", "by": "credential"}, stub.url,
                                         "chat_key")}
    reg.validate()
    reg.save(tmp_path / "registry.yaml")
    procs = ProcessSet()
    proxy = Proxy(reg, tmp_path / "registry.yaml", tmp_path, procs).start()
    world = World(reg, stubs, proxy, Path(proxy.child_env()["SSL_CERT_FILE"]))
    try:
        yield world
    finally:
        proxy.stop()
        for stub in stubs.values():
            assert stub.server is not None
            stub.server.shutdown()
        assert procs.close() == []


def test_a_compressed_websocket_on_a_reverse_listener_is_inspected_as_sent(world, tmp_path):
    """permessage-deflate is negotiated; mitmproxy 12 hands the addon (and saves) each message decompressed, so a
    canary in it, and one cut over two messages, is found live and again from the flow file."""
    alpha, beta = world.reg["alpha"], world.reg["beta"]
    soul, memory = beta.canaries["soul"], beta.canaries["memory"]
    with connect(f"ws://127.0.0.1:{alpha.services['chat'].listen}/socket", proxy=None, compression="deflate",
                 open_timeout=60) as ws:
        assert ws.response.headers.get("sec-websocket-extensions", "").startswith("permessage-deflate")
        ws.send(json.dumps({"type": "message", "text": f"hello {soul} " + "x" * 200}))
        ws.recv()
        ws.send(memory[:15])  # a value cut in two messages
        ws.recv()
        ws.send(memory[15:])
        ws.recv()
        ws.send(alpha.canaries["soul"])  # alpha's own, on alpha's connection: a near miss
        ws.recv()
    lines = world.stop()
    (line,) = [x for x in lines if "websocket" in x]
    assert (line["tenant"], line["service"], line["status"]) == ("alpha", "chat", 101)
    assert line["websocket"]["messages"] == {CLIENT: 4, SERVER: 4}
    assert sorted((f["kind"], f["victim"], f["canary"], f["encoding"]) for f in line["findings"]) == [
        ("request_leak", "beta", "memory", "plain"), ("request_leak", "beta", "soul", "plain"),
        ("response_leak", "beta", "memory", "plain"), ("response_leak", "beta", "soul", "plain")]
    flows, _ = read_flows(world.proxy.flows_path)
    (saved,) = [f for f in flows if f.websocket is not None]
    assert saved.response.headers["sec-websocket-extensions"].startswith("permessage-deflate")
    assert soul.encode() in saved.websocket.messages[0].content  # stored decompressed
    assert inspect_flow(world.reg, matcher_for(world.reg), saved).ledger_entry() | {"time": line["time"]} == line
    rec = reconcile(world.reg, world.proxy.flows_path)
    assert sorted(f.fingerprint() for f in rec.findings) == sorted(f["fingerprint"] for f in line["findings"])


def test_a_tenants_own_host_and_a_shared_host_reach_the_right_stub(world):
    """Through the regular listener: gateway.<tenant>.chat.test by host (a websocket), chat.example by the
    credential each request carries (a `Bot` or `Bearer` header, or a token in the path), and without one the
    first tenant's stub, which refuses it in the platform's shape; a host no tenant routes is refused."""
    alpha_key, beta_key = (world.reg[n].canaries["chat_key"] for n in ("alpha", "beta"))
    assert world.get("https://chat.example/api/auth.test", {"authorization": f"Bot {beta_key}"}) == (
        200, {"ok": True, "tenant": "beta"})
    assert world.get(f"https://chat.example/bot{alpha_key}/getMe") == (200, {"ok": True, "tenant": "alpha"})
    assert world.get(f"https://chat.example/api/x?token={beta_key}", {"authorization": f"Bearer {alpha_key}"}) == (
        200, {"ok": True, "tenant": "alpha"})  # the header decides; beta's key in alpha's request is a leak
    assert world.get("https://chat.example/api/x") == (401, {"ok": False, "error": "not_authed"})
    status, body = world.get("https://chat.example.org/api/x")
    assert status == 403 and "blocked" in body["text"]
    forward = f"http://127.0.0.1:{world.proxy.forward_port}"
    with connect("wss://gateway.beta.chat.test/socket", proxy=forward, ssl=world.tls(), open_timeout=60) as ws:
        ws.send(f"hi from beta {world.reg['alpha'].canaries['memory']}")
        ws.recv()
    with pytest.raises(InvalidStatus, match="403"):
        connect("wss://gateway.gamma.chat.test/socket", proxy=forward, ssl=world.tls(), open_timeout=60).close()
    lines = world.stop()
    assert world.stubs["alpha"].seen == [f"/bot{alpha_key}/getMe", f"/api/x?token={beta_key}", "/api/x"]
    assert world.stubs["beta"].seen == ["/api/auth.test", "ws /socket"]
    summary = [(x["host"], x["tenant"], x["service"], x["status"], x.get("refused", False),
                sorted((f["kind"], f["victim"], f["canary"]) for f in x["findings"])) for x in lines]
    assert summary == [
        ("chat.example", "beta", "chatapi", 200, False, []),
        ("chat.example", "alpha", "chatapi", 200, False, []),
        ("chat.example", "alpha", "chatapi", 200, False, [("request_leak", "beta", "chat_key")]),
        ("chat.example", None, "chatapi", 401, False, []),  # no tenant's: recorded, answered with an error
        ("chat.example.org", None, "provider", 403, True, []),  # refused, nothing of a tenant's in it
        ("gateway.beta.chat.test", "beta", "gateway", 101, False, [("request_leak", "alpha", "memory"),
                                                                    ("response_leak", "alpha", "memory")]),
        ("gateway.gamma.chat.test", None, "provider", 403, True, []),
    ]
    rec = reconcile(world.reg, world.proxy.flows_path)
    assert sorted(f.fingerprint() for f in rec.findings) == sorted(
        f["fingerprint"] for x in lines for f in x["findings"])
    assert rec.refused == {"chat.example.org": 1, "gateway.gamma.chat.test": 1}

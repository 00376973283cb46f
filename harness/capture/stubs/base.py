"""What every service stub shares: one tenant's upstream for one service, on 127.0.0.1, that records every
request it receives and checks its credential.

A stub answers a request carrying another tenant's credential too in `observe` mode (the default), so the
turn goes on and later leaks show; `strict` mode answers it with 401. Either way the request is recorded
with `wrong_key`, as the addon records it on the proxy's side. Every request is recorded on the stub's side,
so the reconciler can prove each one also passed the proxy (the addon stamps `X-Tenancy-Flow`).

`HttpStub` is the base of the stubs served by the standard library's HTTP server (the provider, the memory
provider, the web search API); a kind served otherwise (MCP over streamable HTTP, on the `mcp` SDK's ASGI
app) keeps the same fields and methods: `start()`, `url`, `snapshot()`, `stop()`.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, Protocol, Self

from harness.core.protocol import FLOW_HEADER
from harness.core.registry import PROVIDER, Tenant
from harness.detect.checks import credential_of
from harness.detect.decode import loads

MODES = ("observe", "strict")


class ServiceError(RuntimeError):
    """A stub could not start; the message is one line naming the tenant and service."""


@dataclass
class StubRequest:
    """What a stub saw: enough to prove who sent it and whether it passed the proxy."""

    seq: int
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    status: int
    time: float
    wrong_key: bool = False  # the request carried a credential that is not this tenant's for this service
    service: str = PROVIDER
    background: bool = False  # a keep-alive the client sends whatever happens (a long poll that got nothing)
    peer: int | None = None  # a line protocol's command: the port its connection came from (the proxy's, if proxied)

    @property
    def flow_id(self) -> str | None:
        return self.headers.get(FLOW_HEADER)

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "service": self.service,
            "method": self.method,
            "path": self.path,
            "flow": self.flow_id,
            "status": self.status,
            "bytes": len(self.body),
            "time": self.time,
            "wrong_key": self.wrong_key,
        } | ({"peer": self.peer} if self.peer is not None else {})


class Service(Protocol):
    """The shape of every service stub."""

    tenant: Tenant
    service: str

    def start(self) -> Self: ...

    @property
    def url(self) -> str: ...

    def snapshot(self) -> list[StubRequest]: ...

    def stop(self) -> None: ...


def presented(headers: dict[str, str], body: bytes) -> str | None:
    """The credential a request presents, as the addon reads it (`checks.credential_of`)."""
    return credential_of({k.lower(): v for k, v in headers.items()}, loads(body) if body else None)[0]


@dataclass
class Recorder:
    """A stub's record of its requests, and its credential check."""

    tenant: Tenant
    mode: str = "observe"  # "strict": a foreign credential is answered with 401
    requests: list[StubRequest] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    service: str = PROVIDER

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown stub mode {self.mode!r}")

    @property
    def expected(self) -> str | None:
        """The credential this stub must receive (its tenant's for its service)."""
        return self.tenant.credential(self.service)

    def presented_by(self, path: str, headers: dict[str, str], body: bytes) -> str | None:
        """The credential a request to this service presents: a header or the body's `api_key` (`presented`); a
        service that takes it elsewhere (a Bot API's token in the URL path) reads it there."""
        return presented(headers, body)

    def wrong_key(self, headers: dict[str, str], body: bytes, path: str = "") -> bool:
        """The request presents a credential that is not the expected one (none at all is not wrong here: the
        addon reports a missing credential where the service needs one)."""
        got = self.presented_by(path, headers, body)
        return bool(got) and got != self.expected

    def refuses(self, headers: dict[str, str], body: bytes, path: str = "") -> bool:
        """In strict mode a request without the expected credential is refused (401)."""
        return self.mode == "strict" and self.presented_by(path, headers, body) != self.expected

    def record(self, method: str, path: str, headers: dict[str, str], body: bytes, status: int,
               wrong_key: bool | None = None, background: bool = False) -> None:
        headers = {k.lower(): v for k, v in headers.items()}
        if wrong_key is None:
            wrong_key = self.wrong_key(headers, body, path)
        with self.lock:
            self.requests.append(StubRequest(len(self.requests), method, path, headers, body, status, time.time(),
                                             wrong_key, self.service, background))

    def record_line(self, command: str, line: bytes, status: int, wrong_key: bool, peer: int,
                    background: bool = False) -> None:
        """Keep one command of a line protocol (IMAP, SMTP, IRC): `peer` is the port its connection came from,
        which a saved TCP flow of the proxy names when the connection passed it (the bypass check)."""
        with self.lock:
            self.requests.append(StubRequest(len(self.requests), command, "", {}, line, status, time.time(),
                                             wrong_key, self.service, background, peer))

    def snapshot(self) -> list[StubRequest]:
        with self.lock:
            return list(self.requests)


class JsonHandler(BaseHTTPRequestHandler):
    """Reads a request and hands it to its stub's `answer`."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # otherwise every response waits ~40 ms for a delayed ACK
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return

    def read_body(self) -> bytes:
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    def send_json(self, status: int, payload: Any = None) -> None:
        data = json.dumps({} if payload is None else payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def header_dict(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.headers.items()}

    def do_GET(self) -> None:
        self.server.stub.answer(self, b"")

    def do_HEAD(self) -> None:
        self.server.stub.answer(self, b"")

    def do_POST(self) -> None:
        self.server.stub.answer(self, self.read_body())

    def do_PUT(self) -> None:
        self.server.stub.answer(self, self.read_body())

    def do_DELETE(self) -> None:
        self.server.stub.answer(self, self.read_body())

    def do_PATCH(self) -> None:
        self.server.stub.answer(self, self.read_body())


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, stub: HttpStub, sock: socket.socket | None = None) -> None:
        self.stub = stub
        super().__init__(("127.0.0.1", 0), JsonHandler, bind_and_activate=sock is None)
        if sock is not None:  # bound and listening already (its port was named before the stub started)
            self.socket.close()
            self.socket = sock
            self.server_address = sock.getsockname()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (a killed proxy or Hermes) is expected; anything else is printed."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@dataclass
class HttpStub(Recorder):
    """Base of the stubs on the standard library's HTTP server: subclasses implement `answer`."""

    _server: _Server | None = None

    def answer(self, handler: JsonHandler, raw: bytes) -> None:
        """Answer one request (record it with `record`, respond through `handler`)."""
        raise NotImplementedError

    def check(self, handler: JsonHandler, raw: bytes) -> bool:
        """Record and refuse (401) a request whose credential strict mode does not accept; True if refused."""
        headers = handler.header_dict()
        if not self.refuses(headers, raw, handler.path):
            return False
        self.record(handler.command, handler.path, headers, raw, 401, wrong_key=True)
        handler.send_json(401, {"error": {"message": "invalid api key", "type": "invalid_request_error"}})
        return True

    def start(self, sock: socket.socket | None = None) -> Self:
        """Serve on `sock` (a listening socket bound beforehand), else on a port the kernel picks now."""
        try:
            self._server = _Server(self, sock)
        except OSError as exc:
            raise ServiceError(f"the {self.service} stub of tenant {self.tenant.name!r} cannot listen on 127.0.0.1: "
                               f"{exc.strerror or exc}") from None
        # A short poll interval: `stop()` (shutdown) waits up to one interval, 0.5 s by default, per stub.
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                         name=f"stub-{self.service}-{self.tenant.name}").start()
        return self

    @property
    def port(self) -> int:
        assert self._server is not None, "stub not started"
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@dataclass
class JsonApiStub(HttpStub):
    """A JSON API: every request is checked, routed (`route`) and recorded with the status it got."""

    record_kind: ClassVar[str] = ""  # the canary kind of the tenant's data this service holds and answers with

    def record_text(self) -> str:
        """What the service holds of its tenant (its record canary), as its answers carry it."""
        return f"{self.service} record of {self.tenant.name}: {self.tenant.canaries.get(self.record_kind, '')}"

    def route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        """(status, JSON payload) for one request; `body` is the parsed JSON, None when it is not JSON."""
        raise NotImplementedError

    def respond(self, handler: JsonHandler, path: str, body: Any) -> tuple[int, Any]:
        """`route` of the request; a service whose answer needs more of the request (a header) overrides this."""
        return self.route(handler.command, path, body)

    def answer(self, handler: JsonHandler, raw: bytes) -> None:
        if self.check(handler, raw):
            return
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = None
        status, payload = self.respond(handler, handler.path.split("?", 1)[0].rstrip("/"), body)
        self.record(handler.command, handler.path, handler.header_dict(), raw, status)
        handler.send_json(status, payload)


def stop_all(stubs: Collection[Service]) -> None:
    """Stop every stub side by side: each `stop()` may wait up to one poll interval for its server loop."""
    with ThreadPoolExecutor(max_workers=max(len(stubs), 1)) as pool:
        list(pool.map(lambda s: s.stop(), stubs))

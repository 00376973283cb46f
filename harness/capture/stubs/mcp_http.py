"""A tenant's MCP server over streamable HTTP: the `mcp` SDK's ASGI app (`mcp_tools.server`) on uvicorn, in
a thread, behind a thin ASGI layer that records every request and checks its bearer as every stub does.

Hermes' MCP client (`tools/mcp_tool.py`) posts JSON-RPC to `<url>/mcp` with the profile's configured
headers (`Authorization: Bearer ${TENANCY_MCP_KEY}`); the server is stateless and answers JSON, so each
message is one request and one response through the proxy.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

import uvicorn

from harness.capture.stubs import mcp_tools
from harness.capture.stubs.base import Recorder, ServiceError

PATH = "/mcp"
Scope = dict[str, Any]


class _Recording:
    """ASGI middleware: read the whole request, record it with its response status, refuse it in strict mode."""

    def __init__(self, stub: McpHttpStub, app: Any) -> None:
        self.stub, self.app = stub, app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path = scope["path"] + (f"?{scope['query_string'].decode()}" if scope.get("query_string") else "")
        raw = bytes(body)
        if self.stub.refuses(headers, raw):
            self.stub.record(scope["method"], path, headers, raw, 401, wrong_key=True)
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json")]})
            return await send({"type": "http.response.body", "body": b'{"error": "invalid token"}'})
        status = [0]

        async def replay() -> dict[str, Any]:
            return {"type": "http.request", "body": raw, "more_body": False}

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, replay, sending)
        finally:
            self.stub.record(scope["method"], path, headers, raw, status[0])
        return None


@dataclass
class McpHttpStub(Recorder):
    """`start()`, then `url` (the MCP endpoint is `url + PATH`); `notes` is what the server keeps."""

    service: str = "mcp"
    record_kind: ClassVar[str] = "mcp_record"
    notes: mcp_tools.Notes | None = None
    _server: uvicorn.Server | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _port: int = 0

    def start(self, timeout: float = 15.0) -> Self:
        self.notes = mcp_tools.Notes(self.tenant.name, self.tenant.canaries.get(self.record_kind, ""))
        app = _Recording(self, mcp_tools.server(self.notes).streamable_http_app())
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", 0))
        except OSError as exc:
            sock.close()
            raise ServiceError(f"the {self.service} stub of tenant {self.tenant.name!r} cannot listen on "
                               f"127.0.0.1: {exc.strerror or exc}") from None
        self._port = sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="error", access_log=False, lifespan="on"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True,
                                        name=f"stub-{self.service}-{self.tenant.name}")
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ServiceError(f"the {self.service} stub of tenant {self.tenant.name!r} did not start within "
                                   f"{timeout:g} s")
            time.sleep(0.01)
        return self

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server, self._thread = None, None

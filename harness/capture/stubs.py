"""One OpenAI-compatible upstream stub per tenant, on 127.0.0.1, scripted by a plan of tool calls.

A plan is a list of rounds, each a list of `ToolStep`s. A main turn (a request carrying `tools`) is
answered round by round: the stub counts the assistant tool-call messages since the conversation's last
user message and answers with the next round's steps that this request's `tools` offer (their arguments
fitted to the advertised schema) as parallel tool calls of one message, then with text naming the tenant.
The default plan is one `terminal` call running the environment probe. Anything else (titles, summaries)
gets `aux_text`.

A request carrying another tenant's key is answered too in `observe` mode (the default), so the turn goes
on and later leaks show; `strict` mode answers it with 401. Either way the stub records the wrong key, as
the addon does. Every request is recorded on the stub's side, so the reconciler can prove each one also
passed the proxy (the addon stamps `X-Tenancy-Flow`).
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from harness.core.protocol import FLOW_HEADER, LOCAL_PROBES, probe_command
from harness.core.registry import Tenant

FAULTS = frozenset({"", "500", "hang", "drop"})
MODES = ("observe", "strict")


@dataclass(frozen=True)
class ToolStep:
    """One scripted tool call: the tool's name and the arguments the stub offers it (fitted to the schema)."""

    tool: str
    args: dict[str, Any]


def probe_step(tenant: Tenant) -> ToolStep:
    """The environment probe: every plan starts with it (env snapshots are expected per completed turn)."""
    return ToolStep("terminal", {"command": probe_command(tenant.canaries.get("shell_state", "shellstate-none"))})


def fit(step: ToolStep, tools: list[Any]) -> dict[str, Any] | None:
    """The step's arguments as the advertised schema takes them (unknown properties dropped), or None when
    the request does not offer the tool or a required argument is missing."""
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or fn.get("name") != step.tool:
            continue
        params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
        props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
        args = {k: v for k, v in step.args.items() if k in props} if props else dict(step.args)
        if any(r not in args for r in params.get("required") or []):
            return None
        return args
    return None


@dataclass
class StubRequest:
    """What the stub saw: enough to prove who sent it and whether it passed the proxy."""

    seq: int
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    status: int
    time: float
    wrong_key: bool = False  # the request carried a key that is not this tenant's

    @property
    def flow_id(self) -> str | None:
        return self.headers.get(FLOW_HEADER)

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "method": self.method,
            "path": self.path,
            "flow": self.flow_id,
            "status": self.status,
            "bytes": len(self.body),
            "time": self.time,
            "wrong_key": self.wrong_key,
        }


def _bearer(headers: dict[str, str]) -> str:
    auth = headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else auth


Plan = list[list[ToolStep]]


def _round_index(messages: list[Any]) -> int:
    """How many tool-call rounds the conversation holds since its last user message."""
    n = 0
    for m in reversed(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role == "user":
            break
        n += role == "assistant" and bool(m.get("tool_calls"))
    return n


def answer_for(tenant: Tenant, body: dict[str, Any], plan: Plan | None = None,
               aux_text: str | None = None) -> dict[str, Any]:
    """The assistant message the stub answers a chat completion with: the plan's next round of offered
    steps as parallel tool calls, else text."""
    messages = body.get("messages") or []
    tools = body.get("tools")
    if tools:
        rounds = plan if plan is not None else [[probe_step(tenant)]]
        offered = [calls for r in rounds if (calls := [(s.tool, a) for s in r if (a := fit(s, tools)) is not None])]
        i = _round_index(messages)
        if i < len(offered):
            calls = [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                      "function": {"name": name, "arguments": json.dumps(args)}} for name, args in offered[i]]
            return {"role": "assistant", "content": None, "tool_calls": calls}
        return {"role": "assistant", "content": f"probe done for tenant {tenant.name}"}
    return {"role": "assistant", "content": aux_text or f"Tenant {tenant.name} notes"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # otherwise every response waits ~40 ms for a delayed ACK
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _read_body(self) -> bytes:
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, payload: dict[str, Any] | None = None) -> None:
        data = json.dumps(payload or {}).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self, body: bytes, status: int, *, wrong_key: bool | None = None) -> None:
        stub = self.server.stub
        headers = {k.lower(): v for k, v in self.headers.items()}
        if wrong_key is None:
            bearer = _bearer(headers)
            wrong_key = bool(bearer) and bearer != stub.tenant.key
        with stub.lock:
            stub.requests.append(StubRequest(len(stub.requests), self.command, self.path, headers, body, status,
                                             time.time(), wrong_key))

    def do_GET(self) -> None:
        self._dispatch(b"")

    def do_POST(self) -> None:
        self._dispatch(self._read_body())

    def _dispatch(self, raw: bytes) -> None:
        stub = self.server.stub
        path = self.path.split("?", 1)[0]
        if path in LOCAL_PROBES:
            self._record(raw, 404)
            return self._send(404, {"error": "not found"})
        # observe mode: a foreign key is recorded (`wrong_key`) and answered, so the turn goes on
        if stub.mode == "strict" and _bearer({k.lower(): v for k, v in self.headers.items()}) != stub.tenant.key:
            self._record(raw, 401, wrong_key=True)
            return self._send(401, {"error": {"message": "invalid api key", "type": "invalid_request_error"}})
        if self.command == "GET" and path.rstrip("/") in ("/v1/models", "/models"):
            self._record(raw, 200)
            return self._send(200, {"object": "list", "data": [{"id": stub.tenant.model, "object": "model"}]})
        if self.command != "POST" or not path.rstrip("/").endswith("/chat/completions"):
            self._record(raw, 404)
            return self._send(404, {"error": "not found"})
        if stub.fault == "500":
            self._record(raw, 500)
            return self._send(500, {"error": {"message": "injected fault"}})
        if stub.fault == "hang":
            self._record(raw, 0)
            stub.release.wait(stub.hang_seconds)
            self.close_connection = True
            return None
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._record(raw, 400)
            return self._send(400, {"error": {"message": "body is not JSON"}})
        self._record(raw, 200)
        with stub.lock:
            plan, aux_text = stub.plan, stub.aux_text
        message = answer_for(stub.tenant, body, plan, aux_text)
        if body.get("stream"):
            return self._stream(body, message)
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        return self._send(200, {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model") or stub.tenant.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        })

    def _stream(self, body: dict[str, Any], message: dict[str, Any]) -> None:
        stub = self.server.stub
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        base = {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": body.get("model") or stub.tenant.model}
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        if message.get("tool_calls"):
            for n, call in enumerate(message["tool_calls"]):
                deltas.append({"tool_calls": [{"index": n, "id": call["id"], "type": "function",
                                               "function": {"name": call["function"]["name"], "arguments": ""}}]})
                args = call["function"]["arguments"]
                deltas += [{"tool_calls": [{"index": n, "function": {"arguments": args[i:i + 64]}}]}
                           for i in range(0, len(args), 64)]
            finish = "tool_calls"
        else:
            deltas += [{"content": word} for word in message["content"].split(" ")]
            finish = "stop"
        chunks = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
        chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({**base, "choices": [],
                           "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})
        try:
            for i, chunk in enumerate(chunks):
                if stub.fault == "drop" and i == len(chunks) // 2:
                    self.close_connection = True
                    return  # the stream ends mid-answer without a terminating chunk
                self._chunk(f"data: {json.dumps(chunk)}\n\n".encode())
                if stub.chunk_delay:
                    time.sleep(stub.chunk_delay)
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, stub: StubProvider) -> None:
        self.stub = stub
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (a killed proxy or Hermes) is expected; anything else is printed."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@dataclass
class StubProvider:
    """A tenant's upstream provider: `start()`, then `url`; `requests` is its side of the record."""

    tenant: Tenant
    fault: str = ""
    mode: str = "observe"  # "strict": a foreign key is answered with 401
    plan: Plan | None = None  # rounds of tool calls; None: the env probe only
    aux_text: str | None = None  # the answer to requests without tools (titles, summaries)
    chunk_delay: float = 0.0
    hang_seconds: float = 300.0
    requests: list[StubRequest] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    release: threading.Event = field(default_factory=threading.Event)
    _server: _Server | None = None

    def start(self) -> StubProvider:
        if self.fault not in FAULTS:
            raise ValueError(f"unknown stub fault {self.fault!r}")
        if self.mode not in MODES:
            raise ValueError(f"unknown stub mode {self.mode!r}")
        self._server = _Server(self)
        # A short poll interval: `stop()` (shutdown) waits up to one interval, 0.5 s by default, per stub.
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                         name=f"stub-{self.tenant.name}").start()
        return self

    @property
    def port(self) -> int:
        assert self._server is not None, "stub not started"
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def script(self, plan: Plan | None) -> None:
        """Answer the next main turns with `plan` (None: the env probe only)."""
        with self.lock:
            self.plan = plan

    def snapshot(self) -> list[StubRequest]:
        with self.lock:
            return list(self.requests)

    def stop(self) -> None:
        self.release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def stop_all(stubs: Collection[StubProvider]) -> None:
    """Stop every stub side by side: each `stop()` waits up to one poll interval for its server loop."""
    with ThreadPoolExecutor(max_workers=max(len(stubs), 1)) as pool:
        list(pool.map(StubProvider.stop, stubs))

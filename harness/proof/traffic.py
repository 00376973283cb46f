"""The flow channels through a live mitmdump with the tenancy addon (`capture.proxy.Proxy`, as an audit starts it):
one reverse listener per tenant and service in front of one loopback upstream that answers each case as it says
(its response body or SSE stream). Every case is one request, named by its `case` query parameter; the addon's
ledger says what it found live, the flow file is read back by `reconcile`."""

from __future__ import annotations

import base64
import json
import random
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from harness.core.protocol import PROBE_BEGIN, PROBE_END
from harness.core.registry import Registry, Tenant, is_secret_kind
from harness.proof.cases import Case
from harness.proof.encodings import BY_NAME, HEADERLESS

NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
#: The path each service's requests take.
PATHS = {"provider": "/v1/chat/completions", "mcp": "/mcp", "memory": "/v1/memories/", "web": "/search",
         "aux": "/v1/chat/completions"}


@dataclass(frozen=True)
class Answer:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


OK = Answer(200, (("content-type", "application/json"),), b'{"ok": true}')


@dataclass(frozen=True)
class Request:
    """One case as the request a client sends through the proxy, and the answer its upstream gives."""

    case: str
    port: int
    path: str
    headers: dict[str, str]
    body: bytes
    answer: Answer = OK


def _body(case: Case) -> tuple[bytes, dict[str, str]]:
    """A message carrying the payload: in a JSON string if it is ASCII, else as the raw body (with the
    content-encoding a format without a magic number needs)."""
    if case.payload.isascii():
        doc = {"messages": [{"role": "user", "content": f"note {case.id}: {case.payload.decode()}"}]}
        return json.dumps(doc).encode(), {"content-type": "application/json"}
    outer = BY_NAME[case.encoding].steps[-1]
    if outer in HEADERLESS:
        return case.payload, {"content-type": "application/octet-stream", "content-encoding": HEADERLESS[outer]}
    return case.payload, {"content-type": "application/octet-stream"}


def _sse(case: Case, rng: random.Random) -> Answer:
    """The payload split at two random places over three deltas of a streamed completion."""
    text = f"note {case.id}: {case.payload.decode()}"
    a, b = sorted(rng.sample(range(1, len(text)), 2))
    events = [json.dumps({"choices": [{"index": 0, "delta": {"content": part}}]}) for part in (text[:a], text[a:b],
                                                                                              text[b:])]
    body = "".join(f"data: {e}\n\n" for e in events) + "data: [DONE]\n\n"
    return Answer(200, (("content-type", "text/event-stream"),), body.encode())


def _ndjson(case: Case, rng: random.Random) -> Answer:
    """The payload split at two random places over three chunks of a streaming provider's NDJSON response."""
    text = f"note {case.id}: {case.payload.decode()}"
    a, b = sorted(rng.sample(range(1, len(text)), 2))
    chunks = [{"model": "m", "message": {"role": "assistant", "content": part}, "done": False}
              for part in (text[:a], text[a:b], text[b:])]
    body = "".join(json.dumps(c) + "\n" for c in [*chunks, {"model": "m", "done": True}])
    return Answer(200, (("content-type", "application/x-ndjson"),), body.encode())


def _probe(case: Case, tenant: Tenant) -> bytes:
    """A main turn whose tool result is the env probe's output, the payload in a variable of the environment
    (masked in the plain listing when it is a secret, as Hermes masks secrets there; whole in the base64 dump)."""
    env = f"HERMES_HOME={tenant.home}\nNOTE={case.payload.decode()}\nPATH=/usr/bin\n"
    plain = env.replace(case.payload.decode(), "***") if is_secret_kind(case.kind) else env
    output = (f"{PROBE_BEGIN}\n{plain}ENVB64={base64.b64encode(env.encode()).decode()}\n"
              f"CWD={tenant.canaries['workdir']}\n{PROBE_END}\n")
    call = {"id": case.id, "type": "function", "function": {"name": "terminal", "arguments": "{}"}}
    doc = {"model": tenant.model, "tools": [{"type": "function", "function": {"name": "terminal"}}],
           "messages": [{"role": "user", "content": "Run the environment probe."},
                        {"role": "assistant", "content": None, "tool_calls": [call]},
                        {"role": "tool", "tool_call_id": case.id, "content": json.dumps({"output": output})}]}
    return json.dumps(doc).encode()


def request_of(case: Case, registry: Registry, rng: random.Random) -> Request:
    """The request (and its upstream's answer) that puts `case` in its channel."""
    tenant = registry[case.seen_in]
    service = case.channel.split(".", 1)[1] if case.channel.startswith("service.") else "provider"
    port = tenant.listen if service == "provider" else tenant.services[service].listen
    assert port is not None
    credential = tenant.credential(service) or ""
    headers = {"authorization": f"Bearer {credential}", "content-type": "application/json"}
    path = f"{PATHS[service]}?case={case.id}"
    clean = json.dumps({"model": tenant.model, "messages": [{"role": "user", "content": "hi"}]}).encode()
    if case.channel == "provider.headers":
        return Request(case.id, port, path, headers | {"x-note": case.payload.decode()}, clean)
    if case.channel == "provider.path":
        return Request(case.id, port, f"{path}&q={case.payload.decode()}", headers, clean)
    if case.channel == "response.body":
        body, answer_headers = _body(case)
        return Request(case.id, port, path, headers, clean, Answer(200, tuple(answer_headers.items()), body))
    if case.channel == "response.sse":
        return Request(case.id, port, path, headers, clean, _sse(case, rng))
    if case.channel == "response.ndjson":
        return Request(case.id, port, path, headers, clean, _ndjson(case, rng))
    if case.channel == "env":
        return Request(case.id, port, path, headers, _probe(case, tenant))
    body, extra = _body(case)
    return Request(case.id, port, path, headers | extra, body)


class _Upstream(BaseHTTPRequestHandler):
    server: _Server

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        case = parse_qs(urlsplit(self.path).query).get("case", [""])[0]
        answer = self.server.answers.get(case, OK)
        self.send_response(answer.status)
        for name, value in answer.headers:
            self.send_header(name, value)
        self.send_header("content-length", str(len(answer.body)))
        self.end_headers()
        self.wfile.write(answer.body)

    do_GET = do_POST = _answer

    def log_message(self, *_: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    answers: dict[str, Answer]


@dataclass
class Upstream:
    """One loopback server answering every listener's requests: a case's own answer, else `OK`."""

    answers: dict[str, Answer] = field(default_factory=dict)
    _server: _Server | None = None

    def start(self) -> str:
        self._server = _Server(("127.0.0.1", 0), _Upstream)
        self._server.answers = self.answers
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def _send(req: Request) -> None:
    http = urllib.request.Request(f"http://127.0.0.1:{req.port}{req.path}", req.body, req.headers, method="POST")
    try:
        with NO_PROXY.open(http, timeout=60) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        exc.close()


def send_all(requests: Iterable[Request], workers: int = 4) -> None:
    """Send every request through the proxy, `workers` at a time."""
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(_send, requests))


def ledger(path: Path) -> dict[str, list[dict]]:
    """The addon's findings by flow id, from its ledger (none: no flow was sent)."""
    out: dict[str, list[dict]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        entry = json.loads(line)
        out.setdefault(entry["flow"], []).extend(entry["findings"])
    return out

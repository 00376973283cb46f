"""One OpenAI-compatible upstream stub per tenant, on 127.0.0.1, scripted by a plan of tool calls.

A plan is a list of rounds, each a list of `ToolStep`s. A main turn (a request carrying `tools`) is
answered round by round: the stub counts the assistant tool-call messages since the conversation's last
user message and answers with the next round's steps that this request's `tools` offer (their arguments
fitted to the advertised schema) as parallel tool calls of one message, then with text naming the tenant.
The default plan is one `terminal` call running the environment probe. Anything else (titles, summaries)
gets `aux_text`. A memory review (Hermes' background review asking what to save) is answered with a `memory` call.
With a `Deriver` (every audit's stubs have one), every text answer, and the memory review's entry, ends with the
derived canaries of the tenants whose data the request carried (`stubs.derived`).

The same kind serves a tenant's auxiliary models (service `aux`: titles, vision), answering every request
with `aux_text`, and its subagents' models (service `delegation`: a profile's `delegation:` block).
Recording and the credential check (observe or strict) are `base.Recorder`'s.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Self

from harness.capture.stubs.base import HttpStub, JsonHandler
from harness.capture.stubs.derived import Deriver, text_kind
from harness.core.protocol import LOCAL_PROBES, PROMPT, SUBAGENT_TASK, probe_command
from harness.core.registry import Tenant

FAULTS = frozenset({"", "500", "hang", "drop"})


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


Plan = list[list[ToolStep]]


def _last_user_text(messages: list[Any]) -> str:
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            content = m.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


#: The task list Hermes puts in front of the next user message once it compressed a session (Hermes 0.19.0:
#: `tools/todo_tool.py`, `format_for_injection`; one line per open task, a blank line before the user's text).
TODOS_KEPT = "[Your active task list was preserved across context compression]"


def _driver_text(asked: str) -> str:
    """The last user message as its sender wrote it: without the task list Hermes put in front of it."""
    if asked.startswith(TODOS_KEPT) and "\n\n" in asked:
        return asked.split("\n\n", 1)[1]
    return asked


def _round_index(messages: list[Any]) -> int:
    """How many tool-call rounds the conversation holds since its last user message."""
    n = 0
    for m in reversed(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role == "user":
            break
        n += role == "assistant" and bool(m.get("tool_calls"))
    return n


def _calls(steps: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
         "function": {"name": name, "arguments": json.dumps(args)}} for name, args in steps]}


#: What a text answer ends with: the derived canaries of a kind of text (`Deriver.tokens`), or nothing.
Derive = Callable[[str], list[str]]


def _with(text: str, kind: str, derive: Derive | None) -> str:
    return " ".join([text, *derive(kind)]) if derive else text


def answer_for(tenant: Tenant, body: dict[str, Any], plan: Plan | None = None,
               aux_text: str | None = None, tail: str = "", *, kind: str = "reply",
               derive: Derive | None = None) -> dict[str, Any]:
    """The assistant message the stub answers a chat completion with: the plan's next round of offered
    steps as parallel tool calls, else text (with `tail`'s lines after it). Without a plan every conversation gets
    the env probe (a cron job's too). With one, the plan runs in the conversation a driver started (its last user
    message starts with `PROMPT`, after the task list Hermes keeps over a compression), a subagent's task
    (`SUBAGENT_TASK`) gets the env probe, and any other conversation Hermes starts itself (a background result
    re-entering the session) gets text. A memory review (`kind` memory) saves one entry with the `memory` tool, then
    says so. `derive` gives the derived canaries a text of `kind` ends with (the entry's too)."""
    messages = body.get("messages") or []
    tools = body.get("tools")
    if tools and kind == "memory":
        entry = ToolStep("memory", {"action": "add", "target": "memory", "content": _with("Noted:", kind, derive)})
        if _round_index(messages) == 0 and (args := fit(entry, tools)) is not None:
            return _calls([("memory", args)])
        return {"role": "assistant", "content": "Saved what stands out."}
    if tools:
        asked = _driver_text(_last_user_text(messages))
        if plan is None or asked.startswith(SUBAGENT_TASK):
            rounds = [[probe_step(tenant)]]
        else:
            rounds = plan if asked.startswith(PROMPT) else []
        offered = [calls for r in rounds if (calls := [(s.tool, a) for s in r if (a := fit(s, tools)) is not None])]
        i = _round_index(messages)
        if i < len(offered):
            return _calls(offered[i])
        done = _with(f"probe done for tenant {tenant.name}", kind, derive)
        return {"role": "assistant", "content": "\n".join(filter(None, [done, tail]))}
    return {"role": "assistant", "content": _with(aux_text or f"Tenant {tenant.name} notes", kind, derive)}


@dataclass
class StubProvider(HttpStub):
    """A tenant's OpenAI-compatible upstream (its provider, or its auxiliary models as service `aux`):
    `start()`, then `url`; `requests` is its side of the record."""

    fault: str = ""
    plan: Plan | None = None  # rounds of tool calls; None: the env probe only
    aux_text: str | None = None  # the answer to requests without tools (titles, summaries)
    tail: str = ""  # lines after a main turn's final text (the `messaging` phase's `MEDIA:` paths)
    deriver: Deriver | None = None  # the derived canaries of its text answers (None: fixed text)
    chunk_delay: float = 0.0
    hang_seconds: float = 300.0
    release: threading.Event = field(default_factory=threading.Event)

    def start(self, sock: socket.socket | None = None) -> Self:
        if self.fault not in FAULTS:
            raise ValueError(f"unknown stub fault {self.fault!r}")
        return super().start(sock)

    def script(self, plan: Plan | None) -> None:
        """Answer the next main turns with `plan` (None: the env probe only)."""
        with self.lock:
            self.plan = plan

    def say(self, tail: str) -> None:
        """End the next main turns' final text with these lines ("": none)."""
        with self.lock:
            self.tail = tail

    def stop(self) -> None:
        self.release.set()
        super().stop()

    def answer(self, handler: JsonHandler, raw: bytes) -> None:
        path = handler.path.split("?", 1)[0]
        headers = handler.header_dict()
        if path in LOCAL_PROBES:
            self.record(handler.command, handler.path, headers, raw, 404)
            return handler.send_json(404, {"error": "not found"})
        # observe mode: a foreign key is recorded (`wrong_key`) and answered, so the turn goes on
        if self.check(handler, raw):
            return None
        if handler.command == "GET" and path.rstrip("/") in ("/v1/models", "/models"):
            self.record(handler.command, handler.path, headers, raw, 200)
            return handler.send_json(200, {"object": "list", "data": [{"id": self.tenant.model, "object": "model"}]})
        if handler.command != "POST" or not path.rstrip("/").endswith("/chat/completions"):
            self.record(handler.command, handler.path, headers, raw, 404)
            return handler.send_json(404, {"error": "not found"})
        if self.fault == "500":
            self.record(handler.command, handler.path, headers, raw, 500)
            return handler.send_json(500, {"error": {"message": "injected fault"}})
        if self.fault == "hang":
            self.record(handler.command, handler.path, headers, raw, 0)
            self.release.wait(self.hang_seconds)
            handler.close_connection = True
            return None
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self.record(handler.command, handler.path, headers, raw, 400)
            return handler.send_json(400, {"error": {"message": "body is not JSON"}})
        self.record(handler.command, handler.path, headers, raw, 200)
        with self.lock:
            plan, aux_text, tail = self.plan, self.aux_text, self.tail
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        deriver = self.deriver
        derive = (lambda kind: deriver.tokens(self.tenant.name, kind, messages)) if deriver else None
        message = answer_for(self.tenant, body, plan, aux_text, tail, kind=text_kind(self.service, body),
                             derive=derive)
        if body.get("stream"):
            return self._stream(handler, body, message)
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        return handler.send_json(200, {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model") or self.tenant.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        })

    def _stream(self, handler: JsonHandler, body: dict[str, Any], message: dict[str, Any]) -> None:
        handler.send_response(200)
        handler.send_header("content-type", "text/event-stream")
        handler.send_header("cache-control", "no-cache")
        handler.send_header("transfer-encoding", "chunked")
        handler.end_headers()
        base = {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": body.get("model") or self.tenant.model}
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
                if self.fault == "drop" and i == len(chunks) // 2:
                    handler.close_connection = True
                    return  # the stream ends mid-answer without a terminating chunk
                _chunk(handler, f"data: {json.dumps(chunk)}\n\n".encode())
                if self.chunk_delay:
                    time.sleep(self.chunk_delay)
            _chunk(handler, b"data: [DONE]\n\n")
            _chunk(handler, b"")
        except (BrokenPipeError, ConnectionResetError):
            handler.close_connection = True


def _chunk(handler: JsonHandler, data: bytes) -> None:
    handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    handler.wfile.flush()

"""The synthetic traffic the addon benches send (bench/hooks.py, bench/loop.py, bench/proxy.py): a registry of 8
tenants x 12 canaries, and chat-completion bodies of a given size that carry a tenant's own canaries."""

from __future__ import annotations

import json
from pathlib import Path

from harness.core.registry import Registry, mint

EXTRA_KINDS = ("session_id", "gateway_token", "upload_note")  # 9 minted + 3 = 12 canaries per tenant
FILLER = "the agent called tool terminal with arguments and returned output while reading file config "


def make_registry(root: Path, n: int = 8, upstream: str = "http://127.0.0.1:9") -> Registry:
    """`n` tenants x 12 canaries, reverse routes on ports 18001.. (nothing listens: the hooks only)."""
    names = [f"t{i}" for i in range(n)]
    reg = mint(names, root / "work", {name: {"listen": 18001 + i} for i, name in enumerate(names)},
               upstreams=dict.fromkeys(names, upstream))
    for t in reg:
        tag = t.key.rsplit("-", 1)[1]
        for kind in EXTRA_KINDS:
            t.canaries[kind] = f"{kind.replace('_', '-')}-{t.name}-{tag}"
    reg.validate()
    return reg


def request_body(reg: Registry, tenant: str, size: int) -> bytes:
    """A chat completion main turn of about `size` bytes that names the tenant's own canaries."""
    t = reg[tenant]
    system = f"You are {t.canaries['soul']}. Memory: {t.canaries['memory']}. cwd {t.canaries['workdir']}"
    doc = {
        "model": t.model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": ""}],
        "tools": [{"type": "function", "function": {"name": "terminal", "parameters": {"type": "object"}}}],
        "stream": False,
    }
    pad = max(0, size - len(json.dumps(doc)))
    doc["messages"][1]["content"] = (FILLER * (pad // len(FILLER) + 1))[:pad]
    return json.dumps(doc).encode()


def json_response(reg: Registry, tenant: str, size: int) -> bytes:
    t = reg[tenant]
    doc = {"id": "chatcmpl-1", "object": "chat.completion", "model": t.model,
           "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "stop"}]}
    pad = max(0, size - len(json.dumps(doc)))
    doc["choices"][0]["message"]["content"] = (FILLER * (pad // len(FILLER) + 1))[:pad]
    return json.dumps(doc).encode()


def sse_events(reg: Registry, tenant: str, size: int, chunk: int = 1024) -> list[bytes]:
    """`data:` events of about `chunk` bytes each, about `size` bytes in all, then `[DONE]`."""
    t = reg[tenant]
    events: list[bytes] = []
    total = 0
    while total < size:
        delta = {"content": (FILLER * (chunk // len(FILLER) + 1))[: chunk - 150]}
        event = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": t.model,
                 "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        line = f"data: {json.dumps(event)}\n\n".encode()
        events.append(line)
        total += len(line)
    events.append(b"data: [DONE]\n\n")
    return events

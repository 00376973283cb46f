"""The upstream bench/proxy.py measures the proxies against: an asyncio HTTP and HTTPS stub, a child process.

    python bench/proxy_stub.py HTTP_PORT TLS_PORT CERT KEY

It answers every `POST ...?kind=json|sse&size=N[&events=N&delay=S]` with a JSON body or an SSE stream (events of
EVENT bytes) of that size, built once per query; with `delay`, the events `delay` seconds apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import sys
import urllib.parse

from payloads import FILLER

EVENT = 1024  # bytes per SSE event


def stub_json(size: int) -> bytes:
    doc = {"id": "chatcmpl-bench", "object": "chat.completion", "model": "bench",
           "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "stop"}]}
    pad = max(0, size - len(json.dumps(doc)))
    doc["choices"][0]["message"]["content"] = (FILLER * (pad // len(FILLER) + 1))[:pad]
    return json.dumps(doc).encode()


def stub_events(size: int) -> list[bytes]:
    """SSE `data:` events of about EVENT bytes, about `size` bytes in all (at least one), then `[DONE]`."""
    events: list[bytes] = []
    total = 0
    while total < size or not events:
        delta = {"content": (FILLER * (EVENT // len(FILLER) + 1))[: min(EVENT, size) - 140]}
        event = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "model": "bench",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        events.append(f"data: {json.dumps(event)}\n\n".encode())
        total += len(events[-1])
    return [*events, b"data: [DONE]\n\n"]


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class Stub:
    """Answers `POST ...?kind=json|sse&size=N[&events=N&delay=S]`; bodies are built once per query."""

    def __init__(self) -> None:
        self.cache: dict[bytes, tuple[bytes, list[bytes], float]] = {}

    def answer(self, target: bytes) -> tuple[bytes, list[bytes], float]:
        if target not in self.cache:
            q = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(target.decode()).query))
            size, delay = int(q.get("size", 1024)), float(q.get("delay", 0))
            if q.get("kind") == "sse":
                events = stub_events(size)[: int(q["events"])] if "events" in q else stub_events(size)
                head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
                        b"transfer-encoding: chunked\r\n\r\n")
                self.cache[target] = (head, [*map(_chunk, events), b"0\r\n\r\n"], delay)
            else:
                body = stub_json(size)
                head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
                self.cache[target] = (head.encode(), [body], 0.0)
        return self.cache[target]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                target = lines[0].split(b" ")[1]
                length = next((int(x.split(b":", 1)[1]) for x in lines if x.lower().startswith(b"content-length:")), 0)
                if length:
                    await reader.readexactly(length)
                status, parts, delay = self.answer(target)
                if not delay:
                    writer.write(status + b"".join(parts))
                else:
                    writer.write(status)
                    for part in parts:
                        writer.write(part)
                        await writer.drain()
                        await asyncio.sleep(delay)
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()


async def serve_stub(http_port: int, tls_port: int, cert: str, key: str) -> None:
    stub = Stub()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    plain = await asyncio.start_server(stub.handle, "127.0.0.1", http_port)
    tls = await asyncio.start_server(stub.handle, "127.0.0.1", tls_port, ssl=ctx)
    async with plain, tls:
        await asyncio.gather(plain.serve_forever(), tls.serve_forever())


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_stub(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]))

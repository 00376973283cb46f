"""The upstream of bench/proxy.py --replay: it answers each request with the response a recorded audit got, a child
process.

    python bench/replay_stub.py PORT RESPONSES

RESPONSES is a pickle of the recording's responses, in its order, each a tuple (status, reason, headers, body, sse:
whether it is an event stream) of plain values; a request
names the one it gets in its `x-bench-replay` header (its index). A response is sent as recorded (status, headers,
body as it was on the wire); an SSE stream in chunks of one event each, the way a provider streams it, the rest
with a Content-Length.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import socket
import sys

REPLAY_HEADER = b"x-bench-replay"
#: Headers the stub sets itself (the framing of the body it sends).
FRAMING = frozenset({b"content-length", b"transfer-encoding", b"connection", b"keep-alive"})


Response = tuple[int, str, list[tuple[bytes, bytes]], bytes, bool]


def wire(response: Response) -> list[bytes]:
    """A recorded response as the bytes to send: the head, then the body (an SSE stream: one chunk per event)."""
    status, reason, headers, body, sse = response
    head = f"HTTP/1.1 {status} {reason}\r\n".encode()
    head += b"".join(name + b": " + value + b"\r\n" for name, value in headers if name.lower() not in FRAMING)
    if not sse:
        return [head + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body]
    events = [e + b"\n\n" for e in body.split(b"\n\n") if e]
    return [head + b"transfer-encoding: chunked\r\n\r\n",
            *(f"{len(e):x}\r\n".encode() + e + b"\r\n" for e in events), b"0\r\n\r\n"]


async def handle(responses: list[list[bytes]], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
            fields = {name.strip().lower(): value.strip() for name, value in fields.items()}
            if length := int(fields.get(b"content-length", b"0")):
                await reader.readexactly(length)
            parts = responses[int(fields[REPLAY_HEADER])]
            if head.startswith(b"HEAD "):
                parts = [parts[0].split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n"]
            for part in parts:
                writer.write(part)
            await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        pass
    finally:
        writer.close()


async def serve(port: int, path: str) -> None:
    with open(path, "rb") as fh:
        responses = [wire(r) for r in pickle.load(fh)]
    server = await asyncio.start_server(lambda r, w: handle(responses, r, w), "127.0.0.1", port, limit=1 << 24)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(int(sys.argv[1]), sys.argv[2]))

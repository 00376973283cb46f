"""bench/proxy.py's load client: keep-alive HTTP/1.1 connections to a configuration (straight, through a reverse
listener, or CONNECT and TLS through a forward proxy), each as one tenant, sending chat-completion main turns."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

from payloads import request_body

from harness.core.registry import Registry


@dataclass
class Target:
    """Where connection i of a configuration goes, as which tenant."""

    name: str
    registry: Registry
    ports: list[int]  # one per tenant (reverse, direct) or the proxy's single port (forward)
    connect: Callable[[int], str] | None = None  # forward: the CONNECT authority for tenant i

    def tenant(self, i: int) -> str:
        return self.registry.names()[i % len(self.registry.names())]


class Conn:
    """One keep-alive HTTP/1.1 connection (through CONNECT + TLS in the forward topology)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def open(cls, target: Target, i: int, tls: ssl.SSLContext) -> Conn:
        port = target.ports[i % len(target.ports)]
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        host = f"127.0.0.1:{port}"
        if target.connect is not None:
            authority = target.connect(i)
            writer.write(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
            await writer.drain()
            reply = await reader.readuntil(b"\r\n\r\n")
            if not reply.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"{target.name}: CONNECT {authority} -> {reply[:60]!r}")
            host = f"{target.tenant(i)}.llm.test"
            await writer.start_tls(tls, server_hostname=host)
        return cls(reader, writer, host)

    async def request(self, raw: bytes) -> tuple[float, float]:
        """(seconds to the whole response, seconds to the first byte of its body)."""
        start = time.perf_counter()
        self.writer.write(raw)
        await self.writer.drain()
        head = await self.reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"status {head[:40]!r}")
        lower = head.lower()
        first = 0.0
        if b"transfer-encoding: chunked" in lower:
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                await self.reader.readexactly(size + 2)
                if size and not first:
                    first = time.perf_counter() - start
                if size == 0:
                    break
        else:
            length = int(lower.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
            await self.reader.readexactly(length)
            first = time.perf_counter() - start
        return time.perf_counter() - start, first

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


def request_bytes(target: Target, i: int, host: str, query: str, size: int) -> bytes:
    t = target.registry[target.tenant(i)]
    body = request_body(target.registry, t.name, size)
    return (f"POST /v1/chat/completions?{query} HTTP/1.1\r\nHost: {host}\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer {t.key}\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body


@dataclass
class Round:
    seconds: float
    latencies: list[float]

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds


async def warm(target: Target, tls: ssl.SSLContext, conc: int, query: str, size: int) -> list[tuple[Conn, bytes]]:
    """`conc` keep-alive connections to `target` (opened at once), each with its request, after one warm-up
    request each."""
    conns = await asyncio.gather(*(Conn.open(target, i, tls) for i in range(conc)))
    pairs = [(c, request_bytes(target, i, c.host, query, size)) for i, c in enumerate(conns)]
    await asyncio.gather(*(c.request(r) for c, r in pairs))
    return pairs


async def close(pairs: list[tuple[Conn, bytes]]) -> None:
    for c, _ in pairs:
        await c.close()


async def load(target: Target, tls: ssl.SSLContext, conc: int, total: int, query: str, size: int) -> Round:
    """`total` requests over `conc` warmed-up keep-alive connections; the clock runs only for those."""
    pairs = await warm(target, tls, conc, query, size)
    left = total
    lat: list[float] = []

    async def worker(conn: Conn, raw: bytes) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            whole, _ = await conn.request(raw)
            lat.append(whole)

    start = time.perf_counter()
    await asyncio.gather(*(worker(c, r) for c, r in pairs))
    seconds = time.perf_counter() - start
    await close(pairs)
    return Round(seconds, lat)

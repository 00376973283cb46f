"""What every messaging platform's stub keeps and offers the `messaging` phase (`ChatStub`), whatever its protocol:
the bot's sign-ins (with the token each came with), its posts and its uploads, and a way to hand the bot a message
from a user. A platform's module subclasses it with the subset of its server's API the gateway's adapter calls.

A post is `{"id", "channel_id", "message", "file_ids", "token", "time"}`, an upload `{"id", "name", "channel_id",
"data", "token", "time"}`, a reaction `{"user", "channel_id", "emoji", "token", "time"}` (the bot's mark on a user's
message, as Signal's 👀): `token` is the credential the request came with, `time` when the stub got it. A request
the stub does not know is answered in the platform's error shape and kept in `unknown` (the phase's failed step).

A platform whose events come over a long-lived HTTP response (Signal's SSE, ntfy's NDJSON) `push`es each event's
bytes; `stream` serves them, to every subscriber at once, as the server would.
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import hashlib
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from wsproto.connection import Connection, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage

from harness.capture.stubs.base import JsonApiStub, JsonHandler
from harness.core.registry import Tenant

#: What Hermes' `messaging` extra brings that no platform's adapter of these imports (its QR log-ins, aiohttp's brotli):
#: every platform of the extra declares them, so a run that drives none leaves them out of the baseline's venv check.
MESSAGING_EXTRA = ("brotlicffi", "qrcode", "pypng")
KEEPALIVE = 15.0  # seconds between a stream's keep-alives while it has no event to send
_WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def accept_websocket(handler: JsonHandler) -> tuple[socket.socket, Connection]:
    """Answer a websocket upgrade (101) on `handler`'s connection: its socket, and the server side of the protocol
    to read and write frames with."""
    accept = base64.b64encode(hashlib.sha1((handler.headers["sec-websocket-key"] + _WS_GUID).encode()).digest())
    handler.send_response(101)
    handler.send_header("upgrade", "websocket")
    handler.send_header("connection", "Upgrade")
    handler.send_header("sec-websocket-accept", accept.decode())
    handler.end_headers()
    handler.wfile.flush()
    handler.close_connection = True
    return handler.connection, Connection(ConnectionType.SERVER)


def websocket_rounds(sock: socket.socket, ws: Connection, closing: threading.Event,
                     ) -> Iterator[list[TextMessage | BytesMessage]]:
    """An accepted websocket's client messages, a round at a time: what came in the last 50 ms (often nothing), pings
    answered, until either side closes or `closing` is set. Between rounds the stub sends what it has queued."""
    while not closing.is_set():
        messages: list[TextMessage | BytesMessage] = []
        if select.select([sock], [], [], 0.05)[0]:
            data = sock.recv(65536)
            if not data:
                return
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, CloseConnection):
                    return
                if isinstance(event, Ping):
                    sock.sendall(ws.send(event.response()))
                elif isinstance(event, TextMessage | BytesMessage):
                    messages.append(event)
        yield messages


def bot_id(tenant: str) -> str:
    """The tenant's bot user id at its server (not a canary: every server names its own bot)."""
    return f"bot{tenant}"


def media_text(canary: str) -> bytes:
    """What a profile's media file of a platform holds (its `file` canary)."""
    return f"attachment {canary}\n".encode()


def lead(t: Tenant, user_kind: str, what: str = "lead") -> str:
    """The tenant's lead (`lead`: a second allowed user) or lead channel (`leadchannel`: a second allowed channel) on
    the platform whose user canary kind is `user_kind`: ids only its own allowlists name, not canaries (the harness
    sends them to every bot)."""
    return f"{what}-{t.name}-{t.canaries[user_kind][-6:]}"


@dataclass
class ChatStub(JsonApiStub):
    """A platform's server for one tenant's bot: what the bot did there, and `deliver` (each platform's own)."""

    posts: list[dict[str, Any]] = field(default_factory=list)
    files: list[dict[str, Any]] = field(default_factory=list)
    challenges: list[str] = field(default_factory=list)  # the token of every sign-in, in order
    reactions: list[dict[str, Any]] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # `METHOD path` (or an RPC method) the stub does not know
    _connected: threading.Event = field(default_factory=threading.Event)
    _closing: threading.Event = field(default_factory=threading.Event)
    _feed: list[bytes] = field(default_factory=list)  # every event pushed, for `stream`
    _taken: int = 0  # the events a stream has sent (a stream opened later starts here)

    def deliver(self, user_id: str, channel_id: str, text: str, channel_type: str = "D") -> str:
        """A message from `user_id` in `channel_id` (`D`: a direct one; `O`: in a channel, addressing the bot) handed
        to the bot as the platform does; its id."""
        raise NotImplementedError

    @property
    def direct(self) -> str:
        """Where a client reaches this server before the proxy can take it ("": nowhere, it is all proxied)."""
        return ""

    def mention(self) -> str:
        """What a message in a channel starts with to address the bot."""
        return f"@{bot_id(self.tenant.name)} "

    def signed_in(self, token: str) -> None:
        """The bot signed in with `token` (the platform's own moment: a websocket's first frame, an auth call)."""
        with self.lock:
            self.challenges.append(token)
        self._connected.set()

    def add_post(self, channel_id: str, message: str, token: str, file_ids: list[str] | None = None) -> dict[str, Any]:
        """A post of the bot's, kept with the token it came with."""
        with self.lock:
            post = {"id": f"{bot_id(self.tenant.name)}-post{len(self.posts) + 1}", "channel_id": channel_id,
                    "message": message, "file_ids": list(file_ids or []), "token": token, "time": time.time()}
            self.posts.append(post)
        return post

    def add_file(self, name: str, channel_id: str, data: bytes, token: str) -> dict[str, Any]:
        """An upload of the bot's, kept with the channel and the token it came with."""
        with self.lock:
            info = {"id": f"{bot_id(self.tenant.name)}-file{len(self.files) + 1}", "name": name,
                    "channel_id": channel_id, "data": data, "token": token, "time": time.time()}
            self.files.append(info)
        return info

    def add_reaction(self, user: str, channel_id: str, emoji: str, token: str) -> None:
        """A reaction of the bot's to a message of `user`, kept with the token it came with."""
        with self.lock:
            self.reactions.append({"user": user, "channel_id": channel_id, "emoji": emoji, "token": token,
                                   "time": time.time()})

    def reactions_to(self, user: str, channel_id: str, since: float) -> list[dict[str, Any]]:
        """The bot's reactions to `user`'s messages in `channel_id` from `since` on."""
        with self.lock:
            return [r for r in self.reactions
                    if r["user"] == user and r["channel_id"] == channel_id and r["time"] >= since]

    def add_unknown(self, what: str) -> None:
        """A request the stub does not know (answered in the platform's error shape by the caller)."""
        with self.lock:
            self.unknown.append(what)

    def push(self, event: bytes) -> None:
        """An event for every stream open now or next."""
        with self.lock:
            self._feed.append(event)

    def stream(self, handler: JsonHandler, content_type: str, keepalive: bytes, first: bytes = b"") -> None:
        """A long-lived chunked response: `first`, then every event pushed (from the first no stream has sent),
        and `keepalive` when idle, until the stub stops or the client hangs up."""
        handler.send_response(200)
        handler.send_header("content-type", content_type)
        handler.send_header("cache-control", "no-cache")
        handler.send_header("transfer-encoding", "chunked")
        handler.end_headers()
        handler.close_connection = True
        with self.lock:
            cursor = self._taken
        idle = time.monotonic()
        try:
            if first:
                _chunk(handler, first)
            while not self._closing.is_set():
                with self.lock:
                    events, cursor = self._feed[cursor:], len(self._feed)
                    self._taken = max(self._taken, cursor)
                for event in events:
                    _chunk(handler, event)
                if events:
                    idle = time.monotonic()
                elif time.monotonic() - idle > KEEPALIVE:
                    _chunk(handler, keepalive)
                    idle = time.monotonic()
                self._closing.wait(0.05)
        except OSError:  # the client hung up
            return

    def stop(self) -> None:
        self._closing.set()
        super().stop()

    def connected(self) -> bool:
        """Whether a bot has signed in here."""
        return self._connected.is_set()

    def sign_ins(self) -> int:
        """How many sign-ins reached this server."""
        with self.lock:
            return len(self.challenges)

    def posts_since(self, since: float) -> list[dict[str, Any]]:
        """The bots' posts this server received from `since` on."""
        with self.lock:
            return [p for p in self.posts if p["time"] >= since]

    def posts_in(self, channel_id: str, since: float = 0.0) -> list[dict[str, Any]]:
        return [p for p in self.posts_since(since) if p["channel_id"] == channel_id]

    def files_since(self, since: float) -> list[dict[str, Any]]:
        """The uploads this server received from `since` on."""
        with self.lock:
            return [f for f in self.files if f["time"] >= since]


def _chunk(handler: JsonHandler, data: bytes) -> None:
    handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    handler.wfile.flush()


def multipart(content_type: str, raw: bytes) -> tuple[dict[str, str], list[tuple[str, bytes]]]:
    """A `multipart/form-data` body: its plain fields, and its file parts (filename, bytes)."""
    doc = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"content-type: {content_type}\r\n\r\n".encode() + raw)
    fields: dict[str, str] = {}
    parts: list[tuple[str, bytes]] = []
    for part in doc.iter_parts() if doc.is_multipart() else ():
        data = part.get_payload(decode=True) or b""
        if part.get_filename():
            parts.append((part.get_filename() or "", data))
        elif name := part.get_param("name", header="content-disposition"):
            fields[str(name)] = data.decode(errors="replace")
    return fields, parts

"""What every messaging platform's stub keeps and offers the `messaging` phase (`ChatStub`), whatever its protocol:
the bot's sign-ins (with the token each came with), its posts and its uploads, and a way to hand the bot a message
from a user. A platform's module subclasses it with the subset of its server's API the gateway's adapter calls.

A post is `{"id", "channel_id", "message", "file_ids", "token", "time"}`, an upload `{"id", "name", "channel_id",
"data", "token", "time"}`: `token` is the credential the request came with, `time` when the stub got it. A request
the stub does not know is answered in the platform's error shape and kept in `unknown` (the phase's failed step).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from harness.capture.stubs.base import JsonApiStub
from harness.core.registry import Tenant


def bot_id(tenant: str) -> str:
    """The tenant's bot user id at its server (not a canary: every server names its own bot)."""
    return f"bot{tenant}"


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
    unknown: list[str] = field(default_factory=list)  # `METHOD path` (or a line's command) the stub does not know
    _connected: threading.Event = field(default_factory=threading.Event)

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

    def add_unknown(self, what: str) -> None:
        """A request the stub does not know (answered in the platform's error shape by the caller)."""
        with self.lock:
            self.unknown.append(what)

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

"""An ntfy server per tenant, for the gateway's ntfy adapter (`plugins/platforms/ntfy`, plain httpx): the profile's
`NTFY_SERVER_URL` (its listener of the proxy), `NTFY_TOPIC` (the topic its bot subscribes to; its home channel and
reply topic too: `NTFY_PUBLISH_TOPIC`, `NTFY_HOME_CHANNEL`), `NTFY_TOKEN` (its bot's access token, `Authorization:
Bearer`) and `NTFY_ALLOWED_USERS` in `.env`. ntfy has no users: the adapter takes a message's topic as its sender
and its chat, so the allowlist names topics (its own, its lead channel's, its user's and its lead's: the topics the
`messaging` phase's near misses come on). The gateway door's `messaging` phase drives the bots.

The stub is the subset of ntfy's API the adapter calls:

- `GET /TOPIC/json?poll=false`: the subscription, a long-lived `application/x-ndjson` response (an `open` line,
  then a `message` line per message, a `keepalive` line when idle); the bot's sign-in is its first request here,
  with the token it presents. A message's `topic` field is the phase's channel (a direct message: its sender), as a
  subscription to several topics carries them;
- `POST /TOPIC` (or `PUT`), a text body: a publish, the bot's replies (kept in `posts`, in that topic).

Anything else is ntfy's `{"code": 40401, "http": 404, "error": "page not found"}`, kept in `unknown`. ntfy has no
attachments in Hermes: a reply's `MEDIA:` file becomes Hermes' notice that it could not deliver it
(`Messaging.attachments = "none"`), and every reply goes to the one publish topic, whatever chat it answers.
"""

from __future__ import annotations

import base64
import json
import re
import time
from dataclasses import dataclass
from typing import Any

from harness.capture.stubs.base import JsonHandler
from harness.core.registry import Tenant
from harness.drive.platforms.base import ChatStub
from harness.drive.platforms.base import lead as _lead
from harness.drive.surface import Battery, Coverage, Messaging, ServiceSpec, Setup, Where, credential_plant

TOPIC = re.compile(r"/([-_A-Za-z0-9]{1,64})")  # ntfy's topic names
#: A file in every profile's home holding its `ntfy_file` canary: what its replies name (`MEDIA:`), which ntfy
#: cannot take.
MEDIA_FILE = "tenancy-ntfy.txt"
NOT_FOUND = {"code": 40401, "http": 404, "error": "page not found"}


@dataclass
class NtfyStub(ChatStub):
    """Its sign-ins are the subscriptions opened, each with the token it presents."""

    service: str = "ntfy"

    def answer(self, handler: JsonHandler, raw: bytes) -> None:
        path = handler.path.split("?", 1)[0]
        sub, pub = TOPIC.fullmatch(path.removesuffix("/json")), TOPIC.fullmatch(path)
        if handler.command == "GET" and path.endswith("/json") and sub:
            if self.check(handler, raw):
                return
            self.record(handler.command, handler.path, handler.header_dict(), raw, 200)
            self.signed_in(token(handler))
            self.stream(handler, "application/x-ndjson", _line("keepalive", sub[1]), _line("open", sub[1]))
        elif handler.command in ("POST", "PUT") and pub:
            if self.check(handler, raw):
                return
            post = self.add_post(pub[1], raw.decode("utf-8", "replace"), token(handler))
            self.record(handler.command, handler.path, handler.header_dict(), raw, 200)
            handler.send_json(200, {"id": post["id"], "time": int(post["time"]), "event": "message",
                                    "topic": pub[1], "message": post["message"]})
        else:
            self.add_unknown(f"{handler.command} {path}")
            self.record(handler.command, handler.path, handler.header_dict(), raw, 404)
            handler.send_json(404, NOT_FOUND)

    def deliver(self, user_id: str, channel_id: str, text: str, channel_type: str = "D") -> str:
        """A message on topic `channel_id` (a direct one: on the sender's topic, `user_id`) as a `message` line;
        its id."""
        with self.lock:
            msg_id = f"{self.tenant.name}in{len(self._feed)}"
        topic = user_id if channel_type == "D" else channel_id
        self.push(json.dumps({"id": msg_id, "time": int(time.time()), "event": "message", "topic": topic,
                              "message": text}).encode() + b"\n")
        return msg_id

    def mention(self) -> str:
        return ""  # a topic has no one to address

    def posts_in(self, channel_id: str, since: float = 0.0) -> list[dict[str, Any]]:
        """Every reply goes to the bot's one publish topic (the adapter's `send` takes no chat): a post there
        answers whichever chat the phase asks about."""
        return [p for p in self.posts_since(since) if p["channel_id"] == self.tenant.canaries["ntfy_topic"]]


def _line(event: str, topic: str) -> bytes:
    return json.dumps({"id": f"{event}{time.time_ns()}", "time": int(time.time()), "event": event,
                       "topic": topic}).encode() + b"\n"


def token(handler: JsonHandler) -> str:
    """The token a request presents: a Bearer token, or a Basic `user:pass` decoded."""
    value = (handler.headers.get("authorization") or "").strip()
    if value.lower().startswith("basic "):
        try:
            return base64.b64decode(value[6:]).decode()
        except ValueError:
            return value
    return value.removeprefix("Bearer ").strip()


def lead(t: Tenant, what: str = "lead") -> str:
    """The tenant's lead or lead channel (a topic either way) at its ntfy server (`platforms.base.lead`)."""
    return _lead(t, "ntfy_user", what)


def configure(t: Tenant, where: Where) -> Setup:
    topic = t.canaries["ntfy_topic"]
    return Setup(env={"NTFY_SERVER_URL": where.url, "NTFY_TOPIC": topic, "NTFY_PUBLISH_TOPIC": topic,
                      "NTFY_TOKEN": t.canaries["ntfy_key"], "NTFY_HOME_CHANNEL": topic,
                      "NTFY_ALLOWED_USERS": f"{topic},{lead(t, 'leadchannel')},{t.canaries['ntfy_user']},{lead(t)}"},
                 files={MEDIA_FILE: f"attachment {t.canaries['ntfy_file']}\n".encode()})


SERVICE = ServiceSpec(
    "ntfy", "an ntfy server: the gateway's ntfy adapter, one topic and token per profile", rank=72,
    make=lambda t, m: NtfyStub(t, m), credential="ntfy_key", credential_env="NTFY_TOKEN",
    identity=("ntfy_user", "ntfy_topic"), data=("ntfy_post", "ntfy_file"), passive=True,
    configure=configure, by_default=False, doors=("gateway",),  # only `hermes gateway run` starts the bots
    messaging=Messaging("ntfy_user", "ntfy_topic", "ntfy_post", "ntfy_file", MEDIA_FILE, "ntfy", attachments="none"),
    coverage=Coverage('source_has("plugins.platforms.ntfy.adapter", "/json")',
                      "no ntfy platform adapter (plugins/platforms/ntfy)"),
    battery=Battery("ntfy"),  # no tools: the gateway door's `messaging` phase drives it
    plants={"ntfy-key": credential_plant("ntfy_key", "NTFY_TOKEN")},
)

"""A Mattermost server per tenant, for the gateway's messaging platform adapter (`plugins/platforms/mattermost`,
plain aiohttp: REST v4 with `Authorization: Bearer` and a websocket for events): the profile's
`MATTERMOST_URL`, `MATTERMOST_TOKEN` (its bot's token), `MATTERMOST_ALLOWED_USERS` (its user and its lead),
`MATTERMOST_ALLOWED_CHANNELS` (its channel and its lead channel) and `MATTERMOST_HOME_CHANNEL` in `.env`. Only
`hermes gateway run` starts the adapters (one bot per profile when it multiplexes profiles);
the gateway door's `messaging` phase (`harness.drive.phases.messaging`) drives them.

The stub is the subset of the Mattermost API the adapter calls:

- `GET /api/v4/users/me`: the bot's identity on connect (`connect`);
- `GET /api/v4/websocket` (upgrade): the event stream; the adapter's first frame is an
  `authentication_challenge` carrying its token, and the stub sends `posted` events on it (`deliver`);
- `POST /api/v4/posts` `{"channel_id", "message", "file_ids"}`: the bot's replies (kept in `posts`);
- `POST /api/v4/files` (multipart: `channel_id` and the `files` part): an attachment uploaded before the post that
  names it, as the gateway delivers a reply's `MEDIA:` paths and a cron job's files (kept in `files`);
  `PUT /api/v4/posts/{id}/patch`, `GET /api/v4/posts/{id}`, `GET /api/v4/channels/{id}`,
  `POST /api/v4/users/{id}/typing`: edits, thread roots, channel info, typing.
"""

from __future__ import annotations

import json
import queue
import time
from dataclasses import dataclass, field
from typing import Any

from wsproto.events import TextMessage

from harness.capture.stubs.base import JsonHandler
from harness.core.registry import Tenant
from harness.drive.platforms.base import ChatStub, accept_websocket, bot_id, media_text, multipart, websocket_rounds
from harness.drive.platforms.base import lead as _lead
from harness.drive.surface import (
    Battery,
    Coverage,
    Messaging,
    Plant,
    PlantContext,
    ServiceSpec,
    Setup,
    Unset,
    Where,
    set_env,
)

WS_PATH = "/api/v4/websocket"
FILES_PATH = "/api/v4/files"
#: A file in every profile's home holding its `mattermost_file` canary: what its agent attaches to a reply (`MEDIA:`).
MEDIA_FILE = "tenancy-media.txt"


@dataclass
class MattermostStub(ChatStub):
    """Its sign-ins are the websocket's authentication frames."""

    service: str = "mattermost"
    _events: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)

    def answer(self, handler: JsonHandler, raw: bytes) -> None:
        if handler.path.split("?", 1)[0] == WS_PATH and "websocket" in handler.headers.get("upgrade", "").lower():
            self.record(handler.command, handler.path, handler.header_dict(), raw, 101)
            self._serve_ws(handler)
            return
        if handler.command == "POST" and handler.path.split("?", 1)[0].rstrip("/") == FILES_PATH:
            self._upload(handler, raw)
            return
        super().answer(handler, raw)

    def _upload(self, handler: JsonHandler, raw: bytes) -> None:
        """A multipart upload: each `files` part kept with the channel and the token it came with."""
        if self.check(handler, raw):
            return
        fields, parts = multipart(handler.headers.get("content-type", ""), raw)
        infos = []
        for name, data in parts:
            info = self.add_file(name, fields.get("channel_id", ""), data, _token(handler))
            infos.append({"id": info["id"], "name": name, "size": len(data)})
        self.record(handler.command, handler.path, handler.header_dict(), raw, 201 if infos else 400)
        handler.send_json(201 if infos else 400, {"file_infos": infos} if infos else {"message": "no files"})

    def respond(self, handler: JsonHandler, path: str, body: Any) -> tuple[int, Any]:
        """A bot's post is kept with the token it came with; every other request is routed."""
        if handler.command == "POST" and path == "/api/v4/posts" and isinstance(body, dict):
            return 201, self._post(body, _token(handler))
        return super().respond(handler, path, body)

    def _post(self, body: dict[str, Any], token: str) -> dict[str, Any]:
        post = self.add_post(str(body.get("channel_id", "")), str(body.get("message", "")), token,
                             [str(f) for f in body.get("file_ids") or []])
        return {**post, "user_id": bot_id(self.tenant.name), "root_id": ""}

    def route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        me = bot_id(self.tenant.name)
        if method == "GET" and path == "/api/v4/users/me":
            return 200, {"id": me, "username": me}
        if method == "PUT" and path.startswith("/api/v4/posts/") and isinstance(body, dict):
            return 200, {"id": path.split("/")[4], "message": body.get("message", "")}
        if method == "GET" and path.startswith("/api/v4/posts/"):
            return 200, {"id": path.rsplit("/", 1)[1], "root_id": ""}
        if method == "GET" and path.startswith("/api/v4/channels/"):
            return 200, {"id": path.rsplit("/", 1)[1], "type": "D", "display_name": "direct"}
        if method == "POST" and path.startswith("/api/v4/users/") and path.endswith("/typing"):
            return 200, {"status": "OK"}
        self.add_unknown(f"{method} {path}")
        return 404, {"id": "api.context.404.app_error", "message": "Sorry, we could not find the page.",
                     "status_code": 404}

    def deliver(self, user_id: str, channel_id: str, text: str, channel_type: str = "D") -> str:
        """A message from `user_id` in `channel_id` (`D`: a direct one; `O`: an open channel), as a `posted`
        event; its post id."""
        with self.lock:
            post_id = f"{self.tenant.name}-in{self._events.qsize() + len(self.posts)}-{time.time_ns()}"
        post = {"id": post_id, "user_id": user_id, "channel_id": channel_id, "message": text, "root_id": "",
                "file_ids": [], "type": ""}
        self._events.put({"event": "posted", "data": {"post": json.dumps(post), "channel_type": channel_type,
                                                      "sender_name": f"@{user_id}"}, "broadcast": {}})
        return post_id

    def _serve_ws(self, handler: JsonHandler) -> None:
        """The websocket: the handshake, then the client's frames read and queued events sent until either
        side closes."""
        sock, ws = accept_websocket(handler)
        seq = 0
        for messages in websocket_rounds(sock, ws, self._closing):
            for message in messages:
                if isinstance(message, TextMessage):
                    self._challenge(message.data)
            while self._connected.is_set():
                try:  # another bot signed in here too (a plant) may take an event first: never block on it
                    event = self._events.get_nowait()
                except queue.Empty:
                    break
                seq += 1
                sock.sendall(ws.send(TextMessage(data=json.dumps({**event, "seq": seq}))))

    def _challenge(self, text: str) -> None:
        try:
            frame = json.loads(text)
        except ValueError:
            return
        if isinstance(frame, dict) and frame.get("action") == "authentication_challenge":
            self.signed_in(str((frame.get("data") or {}).get("token", "")))


def _token(handler: JsonHandler) -> str:
    return (handler.headers.get("authorization") or "").removeprefix("Bearer ").strip()


def lead(t: Tenant, what: str = "lead") -> str:
    """The tenant's lead or lead channel at its Mattermost server (`platforms.base.lead`)."""
    return _lead(t, "mattermost_user", what)


def configure(t: Tenant, where: Where) -> Setup:
    return Setup(env={"MATTERMOST_URL": where.url, "MATTERMOST_TOKEN": t.canaries["mattermost_key"],
                      "MATTERMOST_ALLOWED_USERS": f"{t.canaries['mattermost_user']},{lead(t)}",
                      "MATTERMOST_ALLOWED_CHANNELS": f"{t.canaries['mattermost_channel']},{lead(t, 'leadchannel')}",
                      "MATTERMOST_HOME_CHANNEL": t.canaries["mattermost_channel"]},
                 files={MEDIA_FILE: media_text(t.canaries["mattermost_file"])})


def _server(c: PlantContext) -> None:
    """The donor's server in the target's `MATTERMOST_URL`: the target's bot signs in there with its own token (a
    plant of the donor's token would not reach a server: Hermes refuses a second bot with a token it already
    polls, before it connects)."""
    set_env(c.target_home, "MATTERMOST_URL", f"http://127.0.0.1:{c.donor.services['mattermost'].listen}")


def _media(c: PlantContext) -> None:
    """The donor's `mattermost_file` canary in the target's own media file: the target's own attachment (the
    near miss of the `messaging` phase) then carries it to the target's server, a `request_leak` there."""
    (c.target_home / MEDIA_FILE).write_bytes(media_text(c.donor.canaries["mattermost_file"]))


SERVICE = ServiceSpec(
    "mattermost", "a Mattermost server: the gateway's messaging platform, one bot per profile", rank=70,
    make=lambda t, m: MattermostStub(t, m), credential="mattermost_key", credential_env="MATTERMOST_TOKEN",
    identity=("mattermost_user", "mattermost_channel"), data=("mattermost_post", "mattermost_file"), passive=True,
    configure=configure, by_default=False, doors=("gateway",),  # only `hermes gateway run` starts the bots
    messaging=Messaging("mattermost_user", "mattermost_channel", "mattermost_post", "mattermost_file", MEDIA_FILE,
                        "mattermost"),
    unsettable=(Unset("allowed_users", env=("MATTERMOST_ALLOWED_USERS",), relaxes=frozenset({"answered", "strangers"})),
                Unset("allowed_channels", env=("MATTERMOST_ALLOWED_CHANNELS",),
                      relaxes=frozenset({"answered", "strangers"})),
                Unset("home_channel", env=("MATTERMOST_HOME_CHANNEL",), relaxes=frozenset({"home"})),
                Unset("token", env=("MATTERMOST_TOKEN",), relaxes=frozenset({"sign-in", "answered", "home"})),
                Unset("url", env=("MATTERMOST_URL",), relaxes=frozenset({"sign-in", "answered", "home"}))),
    coverage=Coverage('adapter_has("mattermost", "authentication_challenge")',
                      "no Mattermost platform adapter",
                      forward="Hermes' Mattermost adapter gives aiohttp no proxy (trust_env off), so it ignores "
                              "HTTPS_PROXY"),
    battery=Battery("mattermost"),  # no tools: the gateway door's `messaging` phase drives it
    plants={"mattermost-server": Plant(_server, frozenset({"wrong_key"})),
            # alone: beside `mattermost-server` the target's bot signs in at the donor's server and gets no message
            "mattermost-media": Plant(_media, frozenset({"request_leak"}), alone=True)},
)

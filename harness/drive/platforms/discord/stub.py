"""Discord's server for one tenant (`DiscordStub`): the REST subset and the gateway websocket discord.py uses, as
`harness.drive.platforms.discord` describes; a gateway session is served by the stub of the tenant whose token its
IDENTIFY or RESUME carries, whichever stub the proxy handed the connection to (`DiscordStub.online`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import queue
import re
import zlib
from dataclasses import dataclass, field
from typing import Any, ClassVar

from wsproto.connection import Connection
from wsproto.events import BytesMessage, CloseConnection, TextMessage

from harness.capture.stubs.base import JsonHandler
from harness.detect.decode import loads
from harness.drive.platforms.base import ChatStub, accept_websocket, bot_id, lead, multipart, websocket_rounds
from harness.drive.surface import issued_host

API = "/api/v10"
HEARTBEAT_MS = 41250
WHEN = "2026-01-01T00:00:00.000000+00:00"
_SPLIT = 512  # a server message longer than this goes in two frames
_ROUTE = re.compile(r"/channels/(?P<c>\d+)(?:/messages(?:/(?P<m>\d+)(?P<r>/reactions/[^/]+/@me)?)?|/(?P<t>typing))?")


def snowflake(name: str) -> str:
    """The Discord id of `name`: itself when it is a number (a numeric canary), else 19 digits made from it (the same
    in every stub and in the profile's settings)."""
    return name if name.isdigit() else str(10**18 + int(hashlib.sha256(name.encode()).hexdigest()[:15], 16))


def error(status: int, message: str = "", code: int = 0) -> dict[str, Any]:
    """Discord's error shape."""
    return {"message": message or {401: "401: Unauthorized", 404: "404: Not Found"}[status], "code": code}


def user(name: str, bot: bool = False) -> dict[str, Any]:
    return {"id": snowflake(name), "username": name[:32], "discriminator": "0", "global_name": None, "avatar": None,
            "bot": bot}


@dataclass
class _Socket:
    """One gateway connection: its websocket, its zlib stream (None: plain text frames) and its sequence."""

    sock: Any
    ws: Connection
    zlib: Any = None
    seq: int = 0

    def send(self, op: int, data: Any, event: str | None = None) -> None:
        if op == 0:
            self.seq += 1
        raw = json.dumps({"op": op, "d": data, "s": self.seq if op == 0 else None, "t": event}).encode()
        if self.zlib is not None:
            raw = self.zlib.compress(raw) + self.zlib.flush(zlib.Z_SYNC_FLUSH)
        parts = [raw[: len(raw) // 2], raw[len(raw) // 2:]] if len(raw) > _SPLIT else [raw]
        for n, part in enumerate(parts, 1):
            self.sock.sendall(self.ws.send(BytesMessage(data=part, message_finished=n == len(parts))
                                           if self.zlib is not None else
                                           TextMessage(data=part.decode(), message_finished=n == len(parts))))


@dataclass
class DiscordStub(ChatStub):
    """A tenant's Discord: its bot, its guild, what the bot posted; the gateway sessions of its token."""

    service: str = "discord"
    #: Every started stub by its tenant's bot token, and by every interaction token it issued: whose a session is.
    online: ClassVar[dict[str, DiscordStub]] = {}
    _events: queue.Queue[tuple[str, dict[str, Any]]] = field(default_factory=queue.Queue)
    _session: int = 0  # the sign-in whose connection gets the events (the latest)
    _messages: dict[str, dict[str, Any]] = field(default_factory=dict)  # by id: delivered ones and the bot's
    _channels: dict[str, dict[str, Any]] = field(default_factory=dict)  # by id: every channel the bot was told of
    _names: dict[str, str] = field(default_factory=dict)  # the phase's name of every channel id
    callbacks: list[dict[str, Any]] = field(default_factory=list)  # the bot's answers to pressed buttons
    _ids: Any = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in (self.tenant.canaries["discord_channel"], lead(self.tenant, "discord_user", "leadchannel")):
            self._channel(name, "O")

    @property
    def token(self) -> str:
        return self.tenant.canaries["discord_key"]

    @property
    def bot(self) -> dict[str, Any]:
        return user(bot_id(self.tenant.name), bot=True)

    @property
    def guild(self) -> str:
        return snowflake(f"guild-{self.tenant.name}")

    def start(self, sock: Any = None) -> DiscordStub:
        super().start(sock)
        self.online[self.token] = self
        return self

    def stop(self) -> None:
        for key in [k for k, s in self.online.items() if s is self]:
            del self.online[key]
        super().stop()

    def mention(self) -> str:
        return f"<@{self.bot['id']}> "

    # --- what the phase hands the bot ---------------------------------------------------------------------------

    def deliver(self, user_id: str, channel_id: str, text: str, channel_type: str = "D") -> str:
        """A `MESSAGE_CREATE` from `user_id` in `channel_id` (`D`: a DM; `O`: a channel of the tenant's guild,
        `CHANNEL_CREATE` first if the bot was not told of it); its id."""
        author = user(user_id)
        channel = self._channel(channel_id, channel_type, author)
        message = self._message(channel["id"], text, author)
        if channel_type == "O":
            roles = [self._role()] if user_id == self.tenant.canaries["discord_user"] else []
            message |= {"guild_id": self.guild, "member": {"roles": roles, "joined_at": WHEN, "deaf": False,
                                                           "mute": False, "flags": 0},
                        "mentions": [self.bot] if self.mention().strip() in text else []}
        self._events.put(("MESSAGE_CREATE", message))
        return message["id"]

    def press(self, message_id: str, custom_id: str, user_id: str) -> str:
        """A button of the bot's message pressed by `user_id` (`INTERACTION_CREATE`); the interaction's token: `bot` and
        the bot's token, which its callback's path then presents as Telegram's Bot API paths do (the request is the
        tenant's at the proxy, `checks.credential_of`: discord.py sends no `Authorization` with it)."""
        message, token = self._messages[message_id], f"bot{self.token}"
        self._events.put(("INTERACTION_CREATE", {
            "id": snowflake(f"{token}{next(self._ids)}"), "application_id": snowflake(f"app-{self.tenant.name}"),
            "type": 3, "token": token, "version": 1,
            "data": {"custom_id": custom_id, "component_type": 2}, "channel_id": message["channel_id"],
            "channel": self._channels[message["channel_id"]], "user": user(user_id), "message": message,
            "locale": "en-US", "app_permissions": "0", "entitlements": [], "attachment_size_limit": 10485760,
            "authorizing_integration_owners": {}, "context": 1}))
        return token

    def _channel(self, name: str, kind: str, recipient: dict[str, Any] | None = None) -> dict[str, Any]:
        cid = snowflake(name)
        if cid not in self._channels:
            self._names[cid] = name
            self._channels[cid] = {"id": cid, "type": 1, "recipients": [recipient or user(name)],
                                   "last_message_id": None} if kind == "D" else {
                "id": cid, "type": 0, "guild_id": self.guild, "name": f"channel-{cid[-6:]}", "position": 0,
                "permission_overwrites": [], "nsfw": False, "parent_id": None, "topic": None,
                "last_message_id": None, "rate_limit_per_user": 0}
            if kind == "O" and self._session:  # a channel of its guild the bot was not told of at READY
                self._events.put(("CHANNEL_CREATE", self._channels[cid]))
        return self._channels[cid]

    def _message(self, channel: str, content: str, author: dict[str, Any], **more: Any) -> dict[str, Any]:
        mid = snowflake(f"message-{self.tenant.name}-{next(self._ids)}")
        self._messages[mid] = {"id": mid, "channel_id": channel, "type": 0, "content": content, "author": author,
                               "attachments": [], "embeds": [], "mentions": [], "mention_roles": [], "pinned": False,
                               "mention_everyone": False, "tts": False, "timestamp": WHEN, "edited_timestamp": None,
                               "flags": 0, "components": [], **more}
        return self._messages[mid]

    def _role(self) -> str:
        return snowflake(lead(self.tenant, "discord_user", "role"))

    # --- REST ------------------------------------------------------------------------------------------------------

    def answer(self, handler: JsonHandler, raw: bytes) -> None:
        if "websocket" in handler.headers.get("upgrade", "").lower():
            self.record(handler.command, handler.path, handler.header_dict(), raw, 101, wrong_key=False)
            self._gateway(handler)
            return
        path = handler.path.split("?", 1)[0].rstrip("/").removeprefix(API)
        token = (handler.headers.get("authorization") or "").removeprefix("Bot ").strip()
        parts = [*path.split("/"), "", "", ""]
        if not token and parts[1] == "interactions" and (owner := self.online.get(parts[3][3:])) is not None:
            body = loads(raw) if raw else {}  # an interaction's callback: the token the stub issued is in the path
            body = body if isinstance(body, dict) else {}
            owner.callbacks.append({"interaction": parts[2], "body": body})
            self._reply(handler, raw, 200, {"interaction": {"id": parts[2], "type": 3},
                                            "resource": {"type": body.get("type", 4)}})
            return
        if not token or (self.mode == "strict" and token != self.token):  # strict: a foreign token is refused
            if not token:
                self.add_unknown(f"{handler.command} {path} without the bot's token")
            self._reply(handler, raw, 401, error(401))
            return
        if handler.command == "POST" and "multipart/" in handler.headers.get("content-type", ""):
            self._upload(handler, raw, path, token)
            return
        body = loads(raw) if raw else {}
        status, payload = self._route(handler.command, path, body, token)
        self._reply(handler, raw, status, payload)

    def _reply(self, handler: JsonHandler, raw: bytes, status: int, payload: Any) -> None:
        self.record(handler.command, handler.path, handler.header_dict(), raw, status)
        if status != 204:
            handler.send_json(status, payload)  # `application/json` exactly: discord.py parses nothing else
            return
        handler.send_response(204)
        handler.end_headers()

    def _upload(self, handler: JsonHandler, raw: bytes, path: str, token: str) -> None:
        """A message with files (`payload_json` and `files[n]`): each file kept, then the message that holds them."""
        fields, parts = multipart(handler.headers.get("content-type", ""), raw)
        channel = m.group("c") if (m := _ROUTE.fullmatch(path)) else ""
        infos = [self.add_file(name, self._names.get(channel, channel), data, token) for name, data in parts]
        payload = loads(fields.get("payload_json", "").encode()) or {}
        status, message = self._post(channel, payload if isinstance(payload, dict) else {}, token, infos)
        self._reply(handler, raw, status, message)

    def _post(self, channel: str, body: dict[str, Any], token: str,
              files: list[dict[str, Any]] | None = None) -> tuple[int, Any]:
        post = self.add_post(self._names.get(channel, channel), str(body.get("content") or ""), token,
                             [f["id"] for f in files or []])
        attachments = [{"id": snowflake(f["id"]), "filename": f["name"], "size": len(f["data"]),
                        "url": f"https://cdn.discordapp.com/attachments/{channel}/{f['name']}",
                        "proxy_url": f"https://media.discordapp.net/attachments/{channel}/{f['name']}"}
                       for f in files or []]
        message = self._message(channel, post["message"], self.bot, type=19 if body.get("message_reference") else 0,
                                attachments=attachments, embeds=body.get("embeds") or [],
                                components=body.get("components") or [])
        post["discord_id"] = message["id"]
        return 200, message

    def _route(self, method: str, path: str, body: Any, token: str) -> tuple[int, Any]:
        me = self.bot
        if m := _ROUTE.fullmatch(path):
            return self._channel_route(method, m, body, token)
        if method == "GET" and path == "/users/@me":
            return 200, {**me, "verified": True, "mfa_enabled": False, "flags": 0}
        if method == "GET" and path == "/oauth2/applications/@me":
            return 200, {"id": snowflake(f"app-{self.tenant.name}"), "name": me["username"], "description": "",
                         "icon": None, "bot_public": False, "bot_require_code_grant": False, "owner": me,
                         "verify_key": "00", "flags": 0, "team": None}
        if method == "POST" and path == "/users/@me/channels" and isinstance(body, dict):
            return 200, self._channel(str(body.get("recipient_id", "")), "D")
        if method == "GET" and path.startswith("/users/"):
            return 200, {**user(path.rsplit("/", 1)[1]), "id": path.rsplit("/", 1)[1]}
        if path.startswith("/applications/") and path.endswith("/commands") and method in ("GET", "PUT"):
            return 200, body if method == "PUT" and isinstance(body, list) else []
        self.add_unknown(f"{method} {path}")
        return 404, error(404)

    def _channel_route(self, method: str, m: re.Match[str], body: Any, token: str) -> tuple[int, Any]:
        channel, message = m.group("c"), m.group("m")
        if m.group("t") or m.group("r"):  # typing; a reaction of the bot's, added or removed
            return (204, None) if method in ("POST", "PUT", "DELETE") else (404, error(404))
        if message is None and method == "GET" and m.group(0).endswith("/messages"):
            return 200, []  # the channel's history
        if message is None and method == "GET":
            return (200, self._channels[channel]) if channel in self._channels else (
                404, error(404, "Unknown Channel", 10003))
        if message is None and method == "POST" and isinstance(body, dict):
            return self._post(channel, body, token)
        if message not in self._messages:
            return 404, error(404, "Unknown Message", 10008)
        if method == "GET":
            return 200, self._messages[message]
        if method == "PATCH" and isinstance(body, dict):
            self._messages[message] |= {k: v for k, v in body.items() if k in ("content", "embeds", "components")}
            return 200, self._messages[message]
        return (204, None) if method == "DELETE" else (404, error(404))

    # --- the gateway -----------------------------------------------------------------------------------------------

    def _gateway(self, handler: JsonHandler) -> None:
        """One gateway connection: HELLO, then the client's messages answered and the session's events sent, until
        either side closes. IDENTIFY or RESUME names the tenant whose session it is (the owner of its token)."""
        sock, ws = accept_websocket(handler)
        conn = _Socket(sock, ws, zlib.compressobj() if "compress=zlib-stream" in handler.path else None)
        conn.send(10, {"heartbeat_interval": HEARTBEAT_MS})
        owner: DiscordStub | None = None
        session, text = 0, b""
        for messages in websocket_rounds(sock, ws, self._closing):
            for message in messages:
                text += message.data.encode() if isinstance(message.data, str) else message.data
                if message.message_finished:
                    found = self._frame(conn, text)
                    owner, session = found if found is not None else (owner, session)
                    text = b""
            while owner is not None and owner._session == session and not owner._closing.is_set():
                try:
                    name, payload = owner._events.get_nowait()
                except queue.Empty:
                    break
                conn.send(0, payload, name)

    def _frame(self, conn: _Socket, raw: bytes) -> tuple[DiscordStub, int] | None:
        """Answer one client message; the session's owner and sign-in when it is an IDENTIFY or a RESUME."""
        frame = loads(raw)
        op, data = (frame.get("op"), frame.get("d")) if isinstance(frame, dict) else (None, None)
        if op == 1:
            conn.send(11, None)
            return None
        if op not in (2, 6) or not isinstance(data, dict):
            return None
        token = str(data.get("token", ""))
        owner = self.online.get(token)
        if owner is None:
            self.add_unknown("a gateway IDENTIFY or RESUME with no tenant's token")
            conn.sock.sendall(conn.ws.send(CloseConnection(code=4004, reason="Authentication failed.")))
            return None
        owner.signed_in(token)
        with owner.lock:
            owner._session += 1
        if op == 6:
            conn.seq = int(data.get("seq") or 0)
            conn.send(0, {}, "RESUMED")
        else:
            conn.send(0, owner._ready(), "READY")
        return owner, owner._session

    def _ready(self) -> dict[str, Any]:
        """READY: the bot, its guild (its channels, its role, the bot as a member), where to resume."""
        role = {"id": self._role(), "name": "tenancy", "permissions": "0", "position": 1, "color": 0,
                "hoist": False, "managed": False, "mentionable": False, "flags": 0}
        everyone = {**role, "id": self.guild, "name": "@everyone", "position": 0, "permissions": "68672"}
        channels = [c for c in self._channels.values() if c["type"] == 0]
        member = {"user": self.bot, "roles": [], "joined_at": WHEN, "deaf": False, "mute": False, "flags": 0}
        guild = {"id": self.guild, "name": f"guild of {self.tenant.name}", "unavailable": False, "member_count": 1,
                 "owner_id": self.bot["id"], "roles": [everyone, role], "channels": channels, "members": [member]}
        return {"v": 10, "user": self.bot, "guilds": [guild], "session_id": f"session-{self.tenant.name}",
                "resume_gateway_url": f"wss://{issued_host(self.service, self.tenant.name)}", "private_channels": [],
                "application": {"id": snowflake(f"app-{self.tenant.name}"), "flags": 0}, "shard": [0, 1]}

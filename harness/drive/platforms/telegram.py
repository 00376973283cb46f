"""A Telegram Bot API server per tenant, for the gateway's Telegram adapter (`plugins/platforms/telegram`, on
python-telegram-bot from Hermes' `messaging` extra): the profile's `TELEGRAM_BOT_TOKEN` (its bot's token),
`TELEGRAM_ALLOWED_USERS` (its user and its lead), `TELEGRAM_HOME_CHANNEL` and `TELEGRAM_FALLBACK_IPS` in `.env`;
`platforms.telegram.extra.base_url` / `base_file_url` (the tenant's listener of the proxy: Hermes has no variable
for it) and `telegram.allowed_chats` (its channel and its lead channel) in `config.yaml`. A public IPv4 in
`TELEGRAM_FALLBACK_IPS` keeps the adapter from its DNS-over-HTTPS discovery of api.telegram.org on every connect
(only a configured fallback address skips it); its fallback transport rewrites requests to api.telegram.org only,
so the base URL's loopback listener is reached directly.

The Bot API puts the token in the URL path (`/bot<TOKEN>/<method>`, files at `/file/bot<TOKEN>/<path>`): the stub
reads it there (`presented_by`), and the proxy's key check finds a tenant's credential in a path. Requests are
form-encoded (a non-string value JSON-encoded) or multipart with the file parts; every answer is Telegram's
`{"ok": true, "result": ...}`, an error `{"ok": false, "error_code", "description"}`. The stub answers the subset of
methods the adapter and python-telegram-bot call (`TelegramStub._call`): `getMe` (its sign-in), `deleteWebhook`,
`getUpdates` (a long poll handing the bot `message` updates from `deliver`: direct chats, and group chats whose
text mentions the bot), `sendMessage`, `sendRichMessage`, `editMessageText`, `sendChatAction`, `sendDocument` and
the other uploads (kept as files, the post naming them), `getFile` and its download, `setMyCommands` ... Any other
method is answered 404 in Telegram's shape and kept (`ChatStub.add_unknown`).

Telegram's ids are integers: a tenant's user and channel canaries are numbers (`shapes`), and the harness's other
names (a lead, a stranger, a lead channel) are numbers of their own (`number`), the same in the profile's allowlists
and at the stub, which gives the phase back its names in the posts' `channel_id`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from harness.capture.stubs.base import JsonHandler
from harness.core.registry import TAG_MARKER, Tenant
from harness.drive.platforms.base import MESSAGING_EXTRA, ChatStub, multipart
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
    edit_config,
)

#: A file in every profile's home holding its `telegram_file` canary: what its agent attaches to a reply (`MEDIA:`).
MEDIA_FILE = "tenancy-telegram.txt"
#: A public address of the Bot API (Telegram's own): with it configured, no DNS-over-HTTPS discovery runs.
FALLBACK_IP = "149.154.167.220"
POLL = 8.0  # the longest a `getUpdates` with nothing to hand is held (Hermes asks for 10 s, reads for 20 s)
_PATH = re.compile(r"^/(file/)?bot([^/]+)/(.*)$")
_UPLOADS = ("sendDocument", "sendPhoto", "sendVideo", "sendAudio", "sendVoice", "sendAnimation", "sendMediaGroup")
_TRUE = ("deleteWebhook", "setWebhook", "setMyCommands", "deleteMyCommands", "setMyShortDescription",
         "setMessageReaction", "sendChatAction", "deleteMessage", "answerCallbackQuery", "setChatMenuButton")


def _bits(tag: str) -> int:
    """The 48 random bits of a tenant's tag (`registry.new_tag`)."""
    return int(tag.removeprefix(TAG_MARKER), 16)


def user_canary(tag: str) -> str:
    """A user id: 16 digits, `7` then the tag's bits (below 2**53, as Telegram's ids are)."""
    return f"7{_bits(tag):015d}"


def channel_canary(tag: str) -> str:
    """A group chat's id: negative, `-1` then the tag's bits (never inside a user canary, nor one inside it)."""
    return f"-1{_bits(tag):015d}"


def token_canary(tag: str) -> str:
    """A bot token as Telegram issues them, `<bot id>:AA` and 33 more token characters, the tag among them (Hermes'
    redactor knows the shape)."""
    fill = hashlib.sha256(tag.encode()).hexdigest()[:15]
    return f"{6_000_000_000 + _bits(tag) % 10**9}:AA{tag}{fill}"


def number(name: str, group: bool = False) -> int:
    """The Telegram id of one of the phase's users or chats: a numeric canary is its own id; any other name (a lead,
    a stranger, a lead channel) a number of its own, a user's positive and a group's negative."""
    if re.fullmatch(r"-?\d+", name):
        return int(name)
    h = int(hashlib.sha256(name.encode()).hexdigest()[:12], 16) % 10**9
    return -(10**12 + h) if group else 5 * 10**9 + h


class _Refused(Exception):
    """A Bot API error: its code and description."""

    def __init__(self, code: int, description: str) -> None:
        super().__init__(description)
        self.code, self.description = code, description


@dataclass
class TelegramStub(ChatStub):
    """Its sign-in is the bot's `getMe` (python-telegram-bot's `initialize`); its updates are its own token's."""

    service: str = "telegram"
    _updates: list[dict[str, Any]] = field(default_factory=list)
    _ready: threading.Condition = field(default_factory=threading.Condition)
    _polled: bool = False  # the first `getUpdates` is answered at once: the adapter sends nothing before it
    _names: dict[int, str] = field(default_factory=dict)  # a chat's id -> the phase's name of it
    _messages: dict[int, dict[str, Any]] = field(default_factory=dict)  # the bot's messages by id -> their post
    _seq: int = 1000

    @property
    def username(self) -> str:
        """The bot's username (`getMe`), which a message in a group chat mentions to address it."""
        return f"tenancy_{self.tenant.name.replace('-', '_')}_bot"

    def mention(self) -> str:
        return f"@{self.username} "

    def presented_by(self, path: str, headers: dict[str, str], body: bytes) -> str | None:
        """The token in the URL path."""
        found = _PATH.match(path.split("?", 1)[0])
        return found[2] if found else None

    def deliver(self, user_id: str, channel_id: str, text: str, channel_type: str = "D") -> str:
        """A `message` update from `user_id`: a direct chat (`D`, whose id is the user's) or a group chat `channel_id`
        (its text mentioning the bot); its message id."""
        user, group = number(user_id), channel_type != "D"
        chat_id = number(channel_id, group=True) if group else user
        chat = {"id": chat_id, "type": "group", "title": channel_id} if group else {
            "id": chat_id, "type": "private", "first_name": user_id}
        message: dict[str, Any] = {
            "date": int(time.time()), "chat": chat, "text": text,
            "from": {"id": user, "is_bot": False, "first_name": user_id, "username": f"u{user}"}}
        if text.startswith(self.mention().strip()):
            message["entities"] = [{"type": "mention", "offset": 0, "length": len(self.mention().strip())}]
        with self._ready:
            self._seq += 1
            seq = self._seq
            self._names[chat_id] = channel_id
            self._updates.append({"update_id": seq, "message": {**message, "message_id": seq}})
            self._ready.notify_all()
        return str(seq)

    def stop(self) -> None:
        with self._ready:
            self._closing.set()
            self._ready.notify_all()
        super().stop()

    def answer(self, handler: JsonHandler, raw: bytes) -> None:
        headers, path = handler.header_dict(), handler.path
        found = _PATH.match(path.split("?", 1)[0])
        token, method = (found[2], found[3]) if found else ("", path)
        if self.refuses(headers, raw, path):
            status, payload = 401, _error(401, "Unauthorized")
        elif found and found[1]:  # a file's download
            status, data = self._download(method)
            self.record(handler.command, path, headers, raw, status)
            _send_bytes(handler, status, data)
            return
        else:
            try:
                result = self._call(method, token, _fields(headers.get("content-type", ""), raw, path), raw, headers)
                status, payload = 200, {"ok": True, "result": result}
            except _Refused as exc:
                status, payload = exc.code, _error(exc.code, exc.description)
            except (TypeError, ValueError) as exc:  # a parameter of the wrong type
                status, payload = 400, _error(400, f"Bad Request: {exc}"[:200])
        # a long poll that handed nothing is a keep-alive: the phase's wait for Hermes to fall idle ignores it
        self.record(handler.command, path, headers, raw, status, background=method == "getUpdates" and payload.get(
            "result") == [])
        handler.send_json(status, payload)

    def _call(self, method: str, token: str, fields: dict[str, Any], raw: bytes,
              headers: dict[str, str]) -> Any:
        """One Bot API method's result (`_Refused`: its error)."""
        if method == "getMe":
            if token not in self.challenges:
                self.signed_in(token)
            return self._bot_user(token)
        if method == "getUpdates":
            return self._poll(token, fields)
        if method in ("sendMessage", "sendRichMessage"):
            rich = fields.get("rich_message")
            return self._post(fields, token, str(fields.get("text") or (rich or {}).get("markdown", "")))
        if method == "editMessageText":
            return self._edit(fields, token)
        if method in _UPLOADS:
            return self._upload(fields, token, raw, headers)
        if method == "getFile":
            return self._file_info(str(fields.get("file_id", "")))
        if method == "getWebhookInfo":
            return {"url": "", "has_custom_certificate": False, "pending_update_count": 0}
        if method == "getChat":
            return {**_chat(self._chat(fields)[0]), "accent_color_id": 0, "max_reaction_count": 11,
                    "accepted_gift_types": dict.fromkeys(("unlimited_gifts", "limited_gifts", "unique_gifts",
                                                          "premium_subscription", "gifts_from_channels"), False)}
        if method in _TRUE:
            return True
        self.add_unknown(method)
        raise _Refused(404, f"Not Found: method {method[:60]} not found")

    def _bot_user(self, token: str) -> dict[str, Any]:
        bot = token.split(":", 1)[0]
        return {"id": int(bot) if bot.isdigit() else 0, "is_bot": True, "first_name": f"Bot {self.tenant.name}",
                "username": self.username, "can_join_groups": True, "can_read_all_group_messages": False,
                "supports_inline_queries": False}

    def _poll(self, token: str, fields: dict[str, Any]) -> list[dict[str, Any]]:
        """The updates from `offset` on (those before it are confirmed, and dropped), held while there are none but
        for the first poll. A bot whose token is not the tenant's (a plant) polls here in vain: Telegram hands a bot
        its own updates only."""
        offset = int(fields.get("offset") or 0)
        deadline = time.monotonic() + min(float(fields.get("timeout") or 0), POLL)
        with self._ready:
            own = token == self.expected
            if own and offset:
                self._updates = [u for u in self._updates if u["update_id"] >= offset]
            first = own and not self._polled
            while not first and not self._closing.is_set() and not (own and self._updates):
                if (left := deadline - time.monotonic()) <= 0:
                    break
                self._ready.wait(left)
            self._polled = self._polled or own
            return list(self._updates) if own else []

    def _chat(self, fields: dict[str, Any]) -> tuple[int, str]:
        """The chat a method names: its id, and the phase's name of it (the id itself for a chat the phase never
        named: a home channel is a canary)."""
        raw = str(fields.get("chat_id", ""))
        chat_id = int(raw) if re.fullmatch(r"-?\d+", raw) else 0
        return chat_id, self._names.get(chat_id, raw)

    def _post(self, fields: dict[str, Any], token: str, text: str, file_ids: list[str] | None = None,
              **more: Any) -> dict[str, Any]:
        """A post of the bot's in the chat `fields` name, answered as the `Message` the Bot API gives back."""
        chat_id, name = self._chat(fields)
        post = self.add_post(name, text, token, file_ids)
        with self._ready:
            self._seq += 1
            post.update(message_id=self._seq, chat=chat_id)
            self._messages[self._seq] = post
        return self._message(post, token, **more)

    def _message(self, post: dict[str, Any], token: str, **more: Any) -> dict[str, Any]:
        return {"message_id": post["message_id"], "date": int(post["time"]), "chat": _chat(post["chat"]),
                "from": self._bot_user(token), "text": post["message"], **more}

    def _edit(self, fields: dict[str, Any], token: str) -> dict[str, Any]:
        post = self._messages.get(int(fields.get("message_id") or 0))
        if post is None:
            raise _Refused(400, "Bad Request: message to edit not found")
        with self.lock:
            post["message"] = str(fields.get("text", ""))
        return self._message(post, token)

    def _upload(self, fields: dict[str, Any], token: str, raw: bytes, headers: dict[str, str]) -> dict[str, Any]:
        """An upload: each file part kept with the chat and the token, and the post that names them."""
        _, parts = multipart(headers.get("content-type", ""), raw)
        infos = [self.add_file(name, self._chat(fields)[1], data, token) for name, data in parts]
        docs = [{"file_id": i["id"], "file_unique_id": i["id"], "file_name": i["name"], "file_size": len(i["data"])}
                for i in infos]
        return self._post(fields, token, str(fields.get("caption", "")), [i["id"] for i in infos],
                          **({"document": docs[0]} if docs else {}))

    def _file_info(self, file_id: str) -> dict[str, Any]:
        found = next((f for f in self.files_since(0.0) if f["id"] == file_id), None)
        if found is None:
            raise _Refused(400, "Bad Request: invalid file_id")
        return {"file_id": file_id, "file_unique_id": file_id, "file_size": len(found["data"]),
                "file_path": f"documents/{file_id}"}

    def _download(self, path: str) -> tuple[int, bytes]:
        found = next((f for f in self.files_since(0.0) if path == f"documents/{f['id']}"), None)
        return (200, found["data"]) if found else (404, json.dumps(_error(404, "Not Found")).encode())


def _chat(chat_id: int) -> dict[str, Any]:
    return {"id": chat_id, "type": "private" if chat_id > 0 else "group"}


def _error(code: int, description: str) -> dict[str, Any]:
    return {"ok": False, "error_code": code, "description": description}


def _fields(content_type: str, raw: bytes, path: str) -> dict[str, Any]:
    """A request's parameters: form-encoded (or multipart, its plain fields) with every non-string value JSON-encoded,
    a JSON body, or the query; a value that reads as a JSON object or list is decoded."""
    if "multipart/" in content_type:
        pairs: dict[str, Any] = dict(multipart(content_type, raw)[0])
    elif "json" in content_type:
        try:
            doc = json.loads(raw or b"{}")
        except ValueError:
            doc = None
        pairs = doc if isinstance(doc, dict) else {}
    else:
        pairs = dict(parse_qsl((raw or path.partition("?")[2].encode()).decode(errors="replace")))
    for key, value in pairs.items():
        if isinstance(value, str) and value.startswith(("[", "{")):
            with contextlib.suppress(ValueError):
                pairs[key] = json.loads(value)
    return pairs


def _send_bytes(handler: JsonHandler, status: int, data: bytes) -> None:
    handler.send_response(status)
    handler.send_header("content-type", "application/octet-stream" if status == 200 else "application/json")
    handler.send_header("content-length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def lead(t: Tenant, what: str = "lead") -> str:
    """The tenant's lead or lead channel at its Telegram server (`platforms.base.lead`)."""
    return _lead(t, "telegram_user", what)


def urls(base: str) -> dict[str, str]:
    """The adapter's Bot API and file URLs at `base` (the token follows each)."""
    return {"base_url": f"{base}/bot", "base_file_url": f"{base}/file/bot"}


def configure(t: Tenant, where: Where) -> Setup:
    chats = [t.canaries["telegram_channel"], str(number(lead(t, "leadchannel"), group=True))]
    return Setup(config={"platforms": {"telegram": {"extra": urls(where.url)}}, "telegram": {"allowed_chats": chats}},
                 env={"TELEGRAM_BOT_TOKEN": t.canaries["telegram_key"],
                      "TELEGRAM_ALLOWED_USERS": f"{t.canaries['telegram_user']},{number(lead(t))}",
                      "TELEGRAM_HOME_CHANNEL": t.canaries["telegram_channel"], "TELEGRAM_FALLBACK_IPS": FALLBACK_IP},
                 files={MEDIA_FILE: media_text(t.canaries["telegram_file"])})


def media_text(canary: str) -> bytes:
    """What a profile's media file holds."""
    return f"attachment {canary}\n".encode()


def _server(c: PlantContext) -> None:
    """The donor's server in the target's base URL: the target's bot signs in there with its own token (the donor's
    token would not reach a server: Hermes refuses a second bot with a token another profile's bot holds)."""
    route = c.donor.services["telegram"]
    base = f"http://127.0.0.1:{route.listen}" if route.listen else f"https://{route.host}"
    edit_config(c.target_home, lambda cfg: cfg["platforms"]["telegram"]["extra"].update(urls(base)))


def _media(c: PlantContext) -> None:
    """The donor's `telegram_file` canary in the target's own media file: its own attachment (the phase's near miss)
    then carries it to the target's server, a `request_leak` there."""
    (c.target_home / MEDIA_FILE).write_bytes(media_text(c.donor.canaries["telegram_file"]))


SHAPES: dict[str, Callable[[str, str], str]] = {"telegram_key": lambda tag, _: token_canary(tag),
                                                "telegram_user": lambda tag, _: user_canary(tag),
                                                "telegram_channel": lambda tag, _: channel_canary(tag)}

SERVICE = ServiceSpec(
    "telegram", "a Telegram Bot API server: the gateway's messaging platform, one bot per profile", rank=71,
    make=lambda t, m: TelegramStub(t, m), credential="telegram_key", credential_env="TELEGRAM_BOT_TOKEN",
    identity=("telegram_user", "telegram_channel"), data=("telegram_post", "telegram_file"), passive=True,
    configure=configure, by_default=False, doors=("gateway",), shapes=SHAPES,
    packages=("python-telegram-bot", "tornado", *MESSAGING_EXTRA),  # Hermes' `messaging` extra (and its webhooks)
    messaging=Messaging("telegram_user", "telegram_channel", "telegram_post", "telegram_file", MEDIA_FILE,
                        "telegram"),
    # not unsettable: its base URL and fallback address (without them the bot calls api.telegram.org and DNS over
    # HTTPS, off the machine)
    unsettable=(Unset("allowed_users", env=("TELEGRAM_ALLOWED_USERS",), relaxes=frozenset({"answered", "strangers"})),
                Unset("allowed_chats", config=("telegram.allowed_chats",),
                      relaxes=frozenset({"answered", "strangers"})),
                Unset("home_channel", env=("TELEGRAM_HOME_CHANNEL",), relaxes=frozenset({"home"})),
                Unset("token", env=("TELEGRAM_BOT_TOKEN",), relaxes=frozenset({"sign-in", "answered", "home"}))),
    coverage=Coverage('imports("telegram") and source_has("plugins.platforms.telegram.adapter", "base_file_url")',
                      "no python-telegram-bot for its adapter (plugins/platforms/telegram): Hermes' extra "
                      "hermes-agent[messaging]"),
    battery=Battery("telegram"),  # no tools: the gateway door's `messaging` phase drives it
    plants={"telegram-server": Plant(_server, frozenset({"wrong_key"})),
            "telegram-media": Plant(_media, frozenset({"request_leak"}), alone=True)},
)

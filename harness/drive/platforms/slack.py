"""A Slack workspace per tenant, for the gateway's Slack adapter (`plugins/platforms/slack`: slack-bolt over
slack-sdk's aiohttp clients, Socket Mode): the profile's `SLACK_BOT_TOKEN` (`xoxb-`), `SLACK_APP_TOKEN` (`xapp-`),
`SLACK_ALLOWED_USERS` (its user and its lead), `SLACK_ALLOWED_CHANNELS` (its channel and its lead channel) and
`SLACK_HOME_CHANNEL` in `.env`; the gateway door's `messaging` phase drives the bots.

Slack's SDK has no base-URL setting: every tenant's bot reaches `https://slack.com/api/<method>` through the proxy's
regular listener, which tells the tenants apart by the token a request carries (`FixedHost`: the bot token or the
app token); the URLs the stub hands out, which carry no token, point at the tenant's own host (`issued_host`). The
stub is the subset of the Web API the adapter calls, in Slack's own shapes (docs/platforms.md): `auth.test`;
`apps.connections.open` (app token), whose websocket is the bot's sign-in (a `hello`, `events_api` envelopes of the
users' messages to every open connection of the app, the acks kept, every ping answered with its pong); the bot's
replies (`chat.*`, kept in `posts`); a reply's `MEDIA:` file (`files.getUploadURLExternal`, the upload to the URL
it issued, `files.completeUploadExternal`: kept in `files`, attached to the post that shares it); reactions, users,
conversations, `assistant.threads.*`. No token is `not_authed`, a token not the tenant's `invalid_auth` (HTTP 200,
a `wrong_key` on the stub's side), a method it does not know `unknown_method` (`ChatStub.add_unknown`).
"""

from __future__ import annotations

import itertools
import json
import queue
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from wsproto.events import TextMessage

from harness.capture.stubs.base import JsonHandler, presented
from harness.core.registry import Tenant
from harness.drive.platforms.base import (
    MESSAGING_EXTRA,
    ChatStub,
    accept_websocket,
    bot_id,
    media_text,
    websocket_rounds,
)
from harness.drive.platforms.base import lead as _lead
from harness.drive.surface import (
    Battery,
    Coverage,
    FixedHost,
    Messaging,
    Plant,
    PlantContext,
    ServiceSpec,
    Setup,
    Unset,
    Where,
    issued_host,
    set_env,
)

HOST = "slack.com"
LINK, UPLOAD, API = "/link/", "/upload/v1/", "/api/"
#: A file in every profile's home holding its `slack_file` canary: what its agent attaches to a reply (`MEDIA:`).
MEDIA_FILE = "tenancy-slack-media.txt"
APP_METHODS = frozenset({"apps.connections.open"})  # called with the app token; every other with the bot token
OK: dict[str, Any] = {"ok": True}


def team(tenant: str) -> str:
    """The tenant's workspace id (not a canary: every workspace names its own)."""
    return f"T{tenant.upper()}"


@dataclass
class SlackStub(ChatStub):
    """Its sign-ins are the Socket Mode websockets opened on the URLs it issued to the app token."""

    service: str = "slack"
    acks: list[str] = field(default_factory=list)  # the envelope ids the bots acknowledged
    _tickets: dict[str, str] = field(default_factory=dict)  # Socket Mode ticket -> the app token it was issued to
    _uploads: dict[str, dict[str, Any]] = field(default_factory=dict)  # upload ticket -> file id, name, token, data
    _inboxes: list[queue.Queue[dict[str, Any]]] = field(default_factory=list)  # one per open websocket
    _backlog: list[dict[str, Any]] = field(default_factory=list)  # envelopes no websocket was open for
    _kinds: dict[str, str] = field(default_factory=dict)  # channel -> `im` or `channel`, as messages came in
    _count: itertools.count = field(default_factory=itertools.count)
    _closing: threading.Event = field(default_factory=threading.Event)

    @property
    def bot_token(self) -> str:
        return self.tenant.canaries["slack_bot_key"]

    @property
    def app_token(self) -> str:
        return self.tenant.canaries["slack_app_key"]

    def wrong_key(self, headers: dict[str, str], body: bytes, path: str = "") -> bool:
        got = presented(headers, body)
        return bool(got) and got not in (self.bot_token, self.app_token)

    def answer(self, handler: JsonHandler, raw: bytes) -> None:
        path = handler.path.split("?", 1)[0]
        if path.startswith(LINK) and "websocket" in handler.headers.get("upgrade", "").lower():
            self._socket(handler)
        elif handler.command == "POST" and path.startswith(UPLOAD):
            self._upload(handler, path.removeprefix(UPLOAD), raw)
        elif path.startswith(API):
            self._api(handler, path.removeprefix(API), raw)
        else:
            self._refuse(handler, raw, 404, "unknown_method", f"{handler.command} {path}")

    def _refuse(self, handler: JsonHandler, raw: bytes, status: int, error: str, unknown: str = "") -> None:
        if unknown:
            self.add_unknown(unknown)
        self.record(handler.command, handler.path, handler.header_dict(), raw, status)
        handler.send_json(status, {"ok": False, "error": error})

    def _api(self, handler: JsonHandler, method: str, raw: bytes) -> None:
        """A Web API call: its token checked (the app token for `apps.connections.open`, else the bot token),
        answered by its method."""
        args = _args(handler, raw)
        token = (handler.headers.get("authorization") or "").removeprefix("Bearer ").strip() or args.get("token", "")
        answer = self._methods().get(method)
        if answer is None:
            self._refuse(handler, raw, 200, "unknown_method", method)
            return
        if token != (self.app_token if method in APP_METHODS else self.bot_token):
            self.record(handler.command, handler.path, handler.header_dict(), raw, 200,
                        wrong_key=token not in ("", self.bot_token, self.app_token))
            handler.send_json(200, {"ok": False, "error": "invalid_auth" if token else "not_authed"})
            return
        payload = answer(args, token)
        self.record(handler.command, handler.path, handler.header_dict(), raw, 200)
        handler.send_json(200, payload)

    def _methods(self) -> dict[str, Callable[[dict[str, Any], str], dict[str, Any]]]:
        ok: Callable[[dict[str, Any], str], dict[str, Any]] = lambda a, t: OK  # noqa: E731
        return {"auth.test": self._auth, "apps.connections.open": self._open, "chat.postMessage": self._post,
                "chat.update": self._update, "chat.postEphemeral": lambda a, t: {**OK, "message_ts": self._ts()},
                "reactions.add": ok, "reactions.remove": ok, "users.info": _user,
                "conversations.info": self._channel, "conversations.open": _open_dm,
                "conversations.replies": lambda a, t: {**OK, "messages": [], "has_more": False},
                "conversations.history": lambda a, t: {**OK, "messages": [], "has_more": False},
                "users.conversations": self._joined,
                "files.getUploadURLExternal": self._upload_url, "files.completeUploadExternal": self._complete,
                "files.info": lambda a, t: {**OK, "file": {"id": a.get("file", ""), "name": MEDIA_FILE}},
                "assistant.threads.setStatus": ok, "assistant.threads.setTitle": ok,
                "assistant.threads.setSuggestedPrompts": ok}

    def _auth(self, args: dict[str, Any], token: str) -> dict[str, Any]:
        name = self.tenant.name
        return {**OK, "url": f"https://{name}.slack.com/", "team": name, "user": bot_id(name), "team_id": team(name),
                "user_id": bot_id(name), "bot_id": f"B{name.upper()}", "is_enterprise_install": False}

    def _open(self, args: dict[str, Any], token: str) -> dict[str, Any]:
        ticket = secrets.token_hex(8)
        with self.lock:
            self._tickets[ticket] = token
        host = issued_host(self.service, self.tenant.name)
        return {**OK, "url": f"wss://{host}{LINK}?ticket={ticket}&app_id=A{self.tenant.name.upper()}"}

    def _post(self, args: dict[str, Any], token: str) -> dict[str, Any]:
        channel, text = str(args.get("channel", "")), str(args.get("text") or json.dumps(args.get("blocks", "")))
        ts = self._ts()
        post = self.add_post(channel, text, token)
        post["ts"] = ts
        return {**OK, "channel": channel, "ts": ts, "message": {
            "type": "message", "text": text, "user": bot_id(self.tenant.name), "bot_id": f"B{self.tenant.name.upper()}",
            "ts": ts}}

    def _update(self, args: dict[str, Any], token: str) -> dict[str, Any]:
        ts, text = str(args.get("ts", "")), str(args.get("text", ""))
        with self.lock:
            for post in self.posts:
                if post.get("ts") == ts:
                    post["message"] = text
        return {**OK, "channel": args.get("channel", ""), "ts": ts, "text": text}

    def _channel(self, args: dict[str, Any], token: str) -> dict[str, Any]:
        channel = str(args.get("channel", ""))
        with self.lock:
            im = self._kinds.get(channel) == "im"
        return {**OK, "channel": {"id": channel, "name": channel, "is_im": im, "is_channel": not im,
                                  "is_private": im, "is_member": True}}

    def _joined(self, args: dict[str, Any], token: str) -> dict[str, Any]:
        """The channels the bot is in (Hermes' channel directory): its home channel and those messages came from."""
        with self.lock:
            joined = [self.tenant.canaries["slack_channel"], *(c for c, k in self._kinds.items() if k == "channel")]
        return {**OK, "channels": [{"id": c, "name": c, "is_private": False} for c in dict.fromkeys(joined)],
                "response_metadata": {"next_cursor": ""}}

    def _upload_url(self, args: dict[str, Any], token: str) -> dict[str, Any]:
        ticket, name = secrets.token_hex(8), str(args.get("filename", "file"))
        with self.lock:
            file_id = f"F{self.tenant.name.upper()}{len(self._uploads) + 1}"
            self._uploads[ticket] = {"file_id": file_id, "name": name, "token": token, "data": None}
        host = issued_host(self.service, self.tenant.name)
        return {**OK, "upload_url": f"https://{host}{UPLOAD}{ticket}", "file_id": file_id}

    def _upload(self, handler: JsonHandler, ticket: str, raw: bytes) -> None:
        """The upload POST to a URL `files.getUploadURLExternal` issued (no token: the URL is the credential)."""
        with self.lock:
            upload = self._uploads.get(ticket)
            if upload is not None:
                upload["data"] = raw
        if upload is None:
            self._refuse(handler, raw, 404, "invalid_upload_url")
            return
        self.record(handler.command, handler.path, handler.header_dict(), raw, 200)
        body = f"OK - {len(raw)}".encode()
        handler.send_response(200)
        handler.send_header("content-type", "text/plain")
        handler.send_header("content-length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def _complete(self, args: dict[str, Any], token: str) -> dict[str, Any]:
        """The files uploaded, shared in `channel_id`: each kept with the token that asked for its upload URL, and
        one post naming them all."""
        wanted = {str(f.get("id")): f for f in _json_list(args.get("files"))}
        channel = str(args.get("channel_id") or args.get("channels") or "")
        with self.lock:
            done = [u for u in self._uploads.values() if u["file_id"] in wanted and u["data"] is not None]
        kept = [self.add_file(u["name"], channel, u["data"], u["token"]) for u in done]
        if kept:
            self.add_post(channel, str(args.get("initial_comment", "")), token, [k["id"] for k in kept])
        return {**OK, "files": [{"id": u["file_id"], "name": u["name"], "title": wanted[u["file_id"]].get("title")}
                                for u in done]}

    def _ts(self) -> str:
        """A message timestamp, unique on this stub (Slack's message id)."""
        return f"{time.time():.0f}.{next(self._count):06d}"

    def deliver(self, user_id: str, channel_id: str, text: str, channel_type: str = "D") -> str:
        """A message from `user_id` in `channel_id` (`D`: a direct message, else a channel) as an `events_api`
        envelope to every websocket open now (kept for the next one when none is); its `ts`."""
        ts, kind = self._ts(), "im" if channel_type == "D" else "channel"
        name = self.tenant.name
        event = {"type": "message", "channel": channel_id, "channel_type": kind, "user": user_id, "text": text,
                 "ts": ts, "event_ts": ts, "team": team(name)}
        envelope = {"envelope_id": f"env-{name}-{ts}", "type": "events_api", "accepts_response_payload": False,
                    "retry_attempt": 0, "retry_reason": "",
                    "payload": {"token": "unverified", "team_id": team(name), "api_app_id": f"A{name.upper()}",
                                "type": "event_callback", "event_id": f"Ev{ts.replace('.', '')}",
                                "event_time": int(time.time()), "event": event,
                                "authorizations": [{"team_id": team(name), "user_id": bot_id(name), "is_bot": True,
                                                    "is_enterprise_install": False}]}}
        with self.lock:
            self._kinds[channel_id] = kind
            if not self._inboxes:
                self._backlog.append(envelope)
            for inbox in self._inboxes:
                inbox.put(envelope)
        return ts

    def mention(self) -> str:
        return f"<@{bot_id(self.tenant.name)}> "

    def stop(self) -> None:
        self._closing.set()
        super().stop()

    def _socket(self, handler: JsonHandler) -> None:
        """A Socket Mode websocket on a ticket this stub issued: the bot's sign-in with the app token the ticket was
        issued to; then its frames read (acks kept, pings answered) and the envelopes sent until either side
        closes."""
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(handler.path).query)
        with self.lock:
            app = self._tickets.get(next(iter(query.get("ticket", [])), ""))
        if app is None:
            self._refuse(handler, b"", 401, "invalid_ticket")
            return
        self.record(handler.command, handler.path, handler.header_dict(), b"", 101)
        sock, ws = accept_websocket(handler)
        inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        with self.lock:
            for envelope in self._backlog:
                inbox.put(envelope)
            self._backlog.clear()
            self._inboxes.append(inbox)
        self.signed_in(app)
        sock.sendall(ws.send(TextMessage(data=json.dumps({
            "type": "hello", "num_connections": len(self._inboxes), "debug_info": {"host": "tenancy-stub"},
            "connection_info": {"app_id": f"A{self.tenant.name.upper()}"}}))))
        try:
            self._serve(sock, ws, inbox)
        finally:
            with self.lock:
                self._inboxes.remove(inbox)

    def _serve(self, sock: Any, ws: Any, inbox: queue.Queue[dict[str, Any]]) -> None:
        for messages in websocket_rounds(sock, ws, self._closing):
            for message in messages:
                if isinstance(message, TextMessage):
                    self._ack(message.data)
            while True:
                try:
                    envelope = inbox.get_nowait()
                except queue.Empty:
                    break
                sock.sendall(ws.send(TextMessage(data=json.dumps(envelope))))

    def _ack(self, text: str) -> None:
        try:
            frame = json.loads(text)
        except ValueError:
            return
        if isinstance(frame, dict) and frame.get("envelope_id"):
            with self.lock:
                self.acks.append(str(frame["envelope_id"]))


def _args(handler: JsonHandler, raw: bytes) -> dict[str, Any]:
    """A Web API call's arguments: its query string, a form body and a JSON body, merged (slack-sdk sends most
    methods' arguments in the query, `chat.*` and `assistant.*` as JSON)."""
    args: dict[str, Any] = {k: v[-1] for k, v in urllib.parse.parse_qs(urllib.parse.urlsplit(handler.path).query)
                            .items()}
    kind = handler.headers.get("content-type", "")
    if "json" in kind:
        try:
            doc = json.loads(raw or b"{}")
        except ValueError:
            doc = {}
        args.update(doc if isinstance(doc, dict) else {})
    elif raw:
        args.update({k: v[-1] for k, v in urllib.parse.parse_qs(raw.decode("utf-8", "replace")).items()})
    return args


def _json_list(value: Any) -> list[dict[str, Any]]:
    """A list argument sent as a JSON string (`files` of `files.completeUploadExternal`)."""
    try:
        doc = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return []
    return [d for d in doc if isinstance(d, dict)] if isinstance(doc, list) else []


def _user(args: dict[str, Any], token: str) -> dict[str, Any]:
    user = str(args.get("user", ""))
    return {**OK, "user": {"id": user, "name": user, "real_name": user, "is_bot": False,
                           "profile": {"display_name": user, "real_name": user}}}


def _open_dm(args: dict[str, Any], token: str) -> dict[str, Any]:
    return {**OK, "channel": {"id": f"dm-{args.get('users', '')}"}}


def lead(t: Tenant, what: str = "lead") -> str:
    """The tenant's lead or lead channel in its Slack workspace (`platforms.base.lead`)."""
    return _lead(t, "slack_user", what)


def configure(t: Tenant, where: Where) -> Setup:
    return Setup(env={"SLACK_BOT_TOKEN": t.canaries["slack_bot_key"], "SLACK_APP_TOKEN": t.canaries["slack_app_key"],
                      "SLACK_ALLOWED_USERS": f"{t.canaries['slack_user']},{lead(t)}",
                      "SLACK_ALLOWED_CHANNELS": f"{t.canaries['slack_channel']},{lead(t, 'leadchannel')}",
                      "SLACK_HOME_CHANNEL": t.canaries["slack_channel"]},
                 files={MEDIA_FILE: media_text(t.canaries["slack_file"])})


def _app(c: PlantContext) -> None:
    """The donor's app token in the target's `SLACK_APP_TOKEN` (its bot token its own): the target's bot opens its
    Socket Mode websocket in the donor's workspace (the proxy routes a token to its owner) and never in its own,
    takes the messages sent to the donor's bot and answers those its own allowlist admits (the target's lead's
    direct message to the donor's bot: a turn on the target's provider, a `profile_bleed`) with its own bot token in
    its own workspace."""
    set_env(c.target_home, "SLACK_APP_TOKEN", c.donor.canaries["slack_app_key"])


#: What a tenant need not show when it leaves a setting unset: an allowlist (it may refuse its own, admit
#: strangers), a token (it has no bot).
ADMITS, NO_BOT = frozenset({"answered", "strangers"}), frozenset({"sign-in", "answered", "home"})

def _prefixed(prefix: str) -> Callable[[str, str], str]:
    """A canary of the default shape after the prefix Slack's ids of its kind have."""
    return lambda tag, value: prefix + value


SERVICE = ServiceSpec(
    "slack", "a Slack workspace: the gateway's messaging platform over Socket Mode, one bot per profile", rank=72,
    make=lambda t, m: SlackStub(t, m), credential="slack_bot_key", credential_env="SLACK_BOT_TOKEN",
    identity=("slack_user", "slack_channel"), data=("slack_app_key", "slack_post", "slack_file"), passive=True,
    configure=configure, by_default=False, doors=("gateway",), packages=("slack-bolt", "slack-sdk", *MESSAGING_EXTRA),
    messaging=Messaging("slack_user", "slack_channel", "slack_post", "slack_file", MEDIA_FILE, "slack"),
    unsettable=(Unset("allowed_users", env=("SLACK_ALLOWED_USERS",), relaxes=ADMITS),
                Unset("allowed_channels", env=("SLACK_ALLOWED_CHANNELS",), relaxes=ADMITS),
                Unset("home_channel", env=("SLACK_HOME_CHANNEL",), relaxes=frozenset({"home"})),
                Unset("token", env=("SLACK_BOT_TOKEN",), relaxes=NO_BOT),
                Unset("app_token", env=("SLACK_APP_TOKEN",), relaxes=NO_BOT)),
    fixed=FixedHost(HOST, ("slack_bot_key", "slack_app_key")),
    shapes={kind: _prefixed(prefix) for kind, prefix in (("slack_bot_key", "xoxb-"), ("slack_app_key", "xapp-1-"),
                                                         ("slack_user", "U"), ("slack_channel", "C"))},
    coverage=Coverage('has("slack_bolt") and adapter_has("slack", "AsyncSocketModeHandler")',
                      "no Slack platform adapter, or not its SDK (Hermes' `messaging` extra: slack-bolt, slack-sdk)"),
    battery=Battery("slack"),  # no tools: the gateway door's `messaging` phase drives it
    plants={"slack-app": Plant(_app, frozenset({"profile_bleed"}))},
)

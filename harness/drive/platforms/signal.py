"""A signal-cli daemon per tenant (`signal-cli daemon --http`), for the gateway's Signal adapter
(`gateway/platforms/signal.py`, built into Hermes, plain httpx, no authentication: the daemon serves one account
and every call names it): the profile's `SIGNAL_HTTP_URL` (its listener of the proxy), `SIGNAL_ACCOUNT` (its
bot's account), `SIGNAL_ALLOWED_USERS` (its user and its lead), `SIGNAL_GROUP_ALLOWED_USERS` (its group and its
lead group) and `SIGNAL_HOME_CHANNEL` (`group:` its group) in `.env`. The gateway door's `messaging` phase drives
the bots; a group is the phase's channel, a direct conversation is the sender's number.

The stub is the subset of the daemon's HTTP API the adapter calls:

- `GET /api/v1/check`: the health check on connect (and when the stream has been idle);
- `GET /api/v1/events?account=ACCOUNT`: the server-sent events of received messages, each a `receive` event whose
  data is an envelope (`source`, `dataMessage` with `groupInfo` for a group); the bot's sign-in is its first
  request here, with the account it names;
- `POST /api/v1/rpc`: JSON-RPC 2.0, every call naming the account: `send` (`recipient` or `groupId`, `message`,
  `attachments`: absolute paths the daemon reads from disk, as the stub does), `sendTyping`, `sendReaction` (the
  👀 the adapter puts on a message it starts on, before the gateway's authorization), `listContacts`,
  `getContact`, `getAttachment`. A method it does not know is JSON-RPC's `-32601` and kept in `unknown`, as is any
  other path (`404`).

The proxy sees every envelope and every call, but not an attachment's bytes (the request names a path): the
phase scans what the stub read (`Messaging.attachments = "path"`).
"""

from __future__ import annotations

import json
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.capture.stubs.base import JsonHandler
from harness.core.registry import Tenant
from harness.drive.platforms.base import ChatStub
from harness.drive.platforms.base import lead as _lead
from harness.drive.surface import (
    Battery,
    Coverage,
    Messaging,
    Plant,
    PlantContext,
    ServiceSpec,
    Setup,
    Where,
    credential_plant,
)

EVENTS, RPC, CHECK = "/api/v1/events", "/api/v1/rpc", "/api/v1/check"
#: A file in every profile's home holding its `signal_file` canary: what its agent attaches to a reply (`MEDIA:`).
MEDIA_FILE = "tenancy-signal.txt"
NOT_FOUND = -32601  # JSON-RPC's "method not found"


@dataclass
class SignalStub(ChatStub):
    """Its sign-ins are the event streams opened, each with the account it names."""

    service: str = "signal"
    _dms: dict[str, str] = field(default_factory=dict)  # a sender's number -> the phase's direct channel
    _stamp: int = 0

    def _now(self) -> int:
        """A Signal timestamp (milliseconds), never the same twice: the adapter tells its own messages by theirs."""
        with self.lock:
            self._stamp = max(self._stamp + 1, time.time_ns() // 1_000_000)
            return self._stamp

    def answer(self, handler: JsonHandler, raw: bytes) -> None:
        path, _, query = handler.path.partition("?")
        if handler.command == "GET" and path == CHECK:
            self.record(handler.command, handler.path, handler.header_dict(), raw, 200)
            handler.send_response(200)
            handler.send_header("content-length", "0")
            handler.end_headers()
        elif handler.command == "GET" and path == EVENTS:
            self.record(handler.command, handler.path, handler.header_dict(), raw, 200)
            self.signed_in(next(iter(urllib.parse.parse_qs(query).get("account", [])), ""))
            self.stream(handler, "text/event-stream", b":\n\n")
        elif handler.command == "POST" and path == RPC:
            self._rpc(handler, raw)
        else:
            self.add_unknown(f"{handler.command} {path}")
            self.record(handler.command, handler.path, handler.header_dict(), raw, 404)
            handler.send_json(404, {"error": {"code": NOT_FOUND, "message": f"no such path: {path}"}})

    def _rpc(self, handler: JsonHandler, raw: bytes) -> None:
        try:
            call = json.loads(raw)
        except ValueError:
            call = None
        if not isinstance(call, dict):
            self.add_unknown("rpc: not a JSON object")
            self.record(handler.command, handler.path, handler.header_dict(), raw, 400)
            handler.send_json(400, {"jsonrpc": "2.0", "error": {"code": -32700, "message": "parse error"}})
            return
        method, params = str(call.get("method", "")), call.get("params") or {}
        result = self.call(method, params if isinstance(params, dict) else {})
        self.record(handler.command, handler.path, handler.header_dict(), raw, 200)
        if result is None:
            self.add_unknown(f"rpc {method}")
            handler.send_json(200, {"jsonrpc": "2.0", "id": call.get("id"),
                                    "error": {"code": NOT_FOUND, "message": f"Method not implemented: {method}"}})
        else:
            handler.send_json(200, {"jsonrpc": "2.0", "id": call.get("id"), "result": result})

    def call(self, method: str, params: dict[str, Any]) -> Any:
        """One JSON-RPC call's result (None: a method the stub does not know)."""
        account = str(params.get("account", ""))
        channel = self._channel(params)
        sent = {"timestamp": self._now(), "results": [{"recipientAddress": {"number": r}, "type": "SUCCESS"}
                                                 for r in params.get("recipient") or []]}
        if method == "send":
            files = [self._read(str(p), channel, account) for p in params.get("attachments") or []]
            self.add_post(channel, str(params.get("message", "")), account, [f["id"] for f in files])
            return sent
        if method == "sendReaction":
            if not params.get("remove"):
                self.add_reaction(str(params.get("targetAuthor", "")), channel, str(params.get("emoji", "")),
                                  account)
            return sent
        if method == "sendTyping":
            return {}
        if method == "listContacts":
            return []
        if method == "getContact":
            return {"number": params.get("contactAddress"), "name": ""}
        if method == "getAttachment":
            return {"data": ""}
        return None

    def _channel(self, params: dict[str, Any]) -> str:
        """The phase's channel of a call: its group, or the direct conversation with its recipient."""
        if params.get("groupId"):
            return str(params["groupId"])
        recipient = str((params.get("recipient") or [""])[0])
        with self.lock:
            return self._dms.get(recipient, recipient)

    def _read(self, path: str, channel: str, account: str) -> dict[str, Any]:
        """An attachment as the daemon takes it: the file at `path`, read from disk (empty when there is none)."""
        try:
            data = Path(path).read_bytes()
        except OSError:
            data = b""
        return self.add_file(Path(path).name, channel, data, account)

    def deliver(self, user_id: str, channel_id: str, text: str, channel_type: str = "D") -> str:
        """A message from `user_id`: a direct one (its conversation is `user_id` at the daemon, `channel_id` to
        the phase) or in group `channel_id`, as a `receive` event; its timestamp."""
        stamp = self._now()
        data: dict[str, Any] = {"timestamp": stamp, "message": text}
        if channel_type == "D":
            with self.lock:
                self._dms[user_id] = channel_id
        else:
            data["groupInfo"] = {"groupId": channel_id, "groupName": channel_id, "type": "DELIVER"}
        envelope = {"source": user_id, "sourceNumber": user_id, "sourceName": user_id, "sourceDevice": 1,
                    "timestamp": stamp, "dataMessage": data}
        event = {"envelope": envelope, "account": self.tenant.canaries["signal_account"]}
        self.push(f"event:receive\ndata:{json.dumps(event)}\n\n".encode())
        return str(stamp)


def lead(t: Tenant, what: str = "lead") -> str:
    """The tenant's lead or lead group at its daemon (`platforms.base.lead`)."""
    return _lead(t, "signal_user", what)


def configure(t: Tenant, where: Where) -> Setup:
    return Setup(env={"SIGNAL_HTTP_URL": where.url, "SIGNAL_ACCOUNT": t.canaries["signal_account"],
                      "SIGNAL_ALLOWED_USERS": f"{t.canaries['signal_user']},{lead(t)}",
                      "SIGNAL_GROUP_ALLOWED_USERS": f"{t.canaries['signal_group']},{lead(t, 'leadchannel')}",
                      "SIGNAL_HOME_CHANNEL": f"group:{t.canaries['signal_group']}"},
                 files={MEDIA_FILE: media_text(t.canaries["signal_file"])})


def media_text(canary: str) -> bytes:
    """What a profile's media file holds."""
    return f"attachment {canary}\n".encode()


def _media(c: PlantContext) -> None:
    """The donor's `signal_file` canary in the target's own media file: the target's own attachment (the near
    miss of the `messaging` phase) then carries it to the target's daemon, a `request_leak` there."""
    (c.target_home / MEDIA_FILE).write_bytes(media_text(c.donor.canaries["signal_file"]))


SERVICE = ServiceSpec(
    "signal", "a signal-cli daemon: the gateway's Signal adapter, one account per profile", rank=71,
    make=lambda t, m: SignalStub(t, m), credential="signal_account", credential_env="SIGNAL_ACCOUNT", keyless=True,
    identity=("signal_user", "signal_group"), data=("signal_post", "signal_file"), passive=True,
    configure=configure, by_default=False, doors=("gateway",),  # only `hermes gateway run` starts the bots
    messaging=Messaging("signal_user", "signal_group", "signal_post", "signal_file", MEDIA_FILE, "signal",
                        attachments="path"),
    coverage=Coverage('source_has("gateway.platforms.signal", "/api/v1/events")',
                      "no Signal adapter (gateway/platforms/signal.py)"),
    battery=Battery("signal"),  # no tools: the gateway door's `messaging` phase drives it
    # The donor's account in the target's SIGNAL_ACCOUNT: the target's bot streams and sends as the donor's
    # account at its own daemon (Hermes refuses no second bot on an account: the adapter holds no token).
    plants={"signal-account": credential_plant("signal_account", "SIGNAL_ACCOUNT"),
            "signal-media": Plant(_media, frozenset({"request_leak"}), alone=True)},
)

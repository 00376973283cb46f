"""An IRC server per tenant, for the gateway's IRC adapter (`plugins/platforms/irc`, stdlib asyncio, one TLS
connection verified with the project's CA): the profile's `IRC_SERVER`/`IRC_PORT` (its listener of the proxy, a raw
TCP one: mitmproxy terminates the TLS and relays the lines to the stub, so each connection is a TCP flow the addon
inspects), `IRC_SERVER_PASSWORD` (its bot's `PASS`, the credential), `IRC_NICKNAME`, `IRC_CHANNEL` (its channel and
its lead channel), `IRC_HOME_CHANNEL` and `IRC_ALLOWED_USERS` (its user's and its lead's nicks) in `.env`, as
Hermes' own setup writes them. The gateway door's `messaging` phase drives the bots.

The stub is the subset of an IRC server the adapter speaks: `PASS`, `NICK` (`433` for a nick another connection
holds, as a network does; the adapter then tries `<nick>_`), `USER`, then `001` (the bot's sign-in, with the
password it gave), `JOIN` (echoed, with `353`/`366`), `PRIVMSG` (the bot's replies, one post a line; to
`NickServ`: its identification), `NOTICE`, `PING`/`PONG`, `QUIT`. Anything else is answered `421 ... :Unknown
command`, IRC's own error, and kept in `unknown`. A message from a user reaches the connections that joined its
channel (in a channel) or the one holding the bot's nick (a direct message), as a network routes it. IRC has no
attachments: a reply's `MEDIA:` file becomes Hermes' notice that it could not deliver it
(`Messaging.attachments = "none"`).
"""

from __future__ import annotations

import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from harness.capture.stubs.lines import LineConn, LineStub
from harness.core.registry import Tenant
from harness.drive.platforms.base import ChatStub, bot_id
from harness.drive.platforms.base import lead as _lead
from harness.drive.surface import Battery, Coverage, Messaging, ServiceSpec, Setup, Unset, Where, credential_plant

SERVER = "tenancy.irc"
#: A file in every profile's home holding its `irc_file` canary: what its replies name (`MEDIA:`), which IRC
#: cannot take.
MEDIA_FILE = "tenancy-irc.txt"
KNOWN = frozenset({"PASS", "NICK", "USER", "QUIT", "PING", "PONG", "JOIN", "PRIVMSG", "NOTICE"})


@dataclass
class _Client:
    """One connection: who it says it is, what it joined."""

    conn: LineConn
    nick: str = ""
    user: str = ""
    password: str = ""
    registered: bool = False
    channels: set[str] = field(default_factory=set)

    def send(self, *lines: str) -> None:
        self.conn.send(*lines)


@dataclass
class IrcStub(LineStub, ChatStub):
    """Its sign-ins are the registrations (`001`), each with the password its `PASS` gave."""

    service: str = "irc"
    _clients: list[_Client] = field(default_factory=list)
    _dm: dict[str, str] = field(default_factory=dict)  # a user's nick -> the phase's channel of its direct messages

    def session(self, conn: LineConn) -> None:
        client = _Client(conn)
        with self.lock:
            self._clients.append(client)
        try:
            while (raw := conn.readline()) is not None:
                if not self._line(client, raw.decode("utf-8", "replace")):
                    return
        finally:
            with self.lock:
                self._clients.remove(client)

    def _line(self, client: _Client, line: str) -> bool:
        """Answer one line; False when the client quits."""
        command, params = parse(line)
        status = 200
        if command == "QUIT":
            self._keep(client, line, command)
            return False
        if command == "PASS" and params:
            client.password = params[0]
        elif command == "NICK" and params:
            status = self._nick(client, params[0])
        elif command == "USER" and params:
            client.user = params[0]
            self._register(client)
        elif command == "PING":
            client.send(f":{SERVER} PONG {SERVER} :{params[0] if params else ''}")
        elif command == "PONG":
            return True
        elif command == "JOIN" and params and client.registered:
            for channel in params[0].split(","):
                self._join(client, channel)
        elif command in ("PRIVMSG", "NOTICE") and len(params) >= 2 and client.registered:
            self._say(client, command, params[0], params[1])
        else:
            status = self._refuse(client, command)
        self._keep(client, line, command, status)
        return True

    def _refuse(self, client: _Client, command: str) -> int:
        """IRC's error for a line the stub does not take (an unknown command, one before registration, one without
        its parameters), kept in `unknown`."""
        status, why = ((421, "Unknown command") if command not in KNOWN else
                       (451, "You have not registered") if not client.registered else (461, "Not enough parameters"))
        self.add_unknown(f"{command or '(empty)'} ({status})")
        client.send(f":{SERVER} {status} {client.nick or '*'} {command or '*'} :{why}")
        return status

    def _keep(self, client: _Client, line: str, command: str, status: int = 200) -> None:
        """The line in the stub's record; a `PASS` with another password than the tenant's is a wrong key."""
        wrong = command == "PASS" and client.password != self.expected
        self.record_line(command, line.encode(), status, wrong, client.conn.peer)

    def _nick(self, client: _Client, nick: str) -> int:
        with self.lock:
            taken = any(c is not client and c.nick.lower() == nick.lower() for c in self._clients)
        if taken:
            client.send(f":{SERVER} 433 {client.nick or '*'} {nick} :Nickname is already in use")
            return 433
        old, client.nick = client.nick, nick
        if client.registered:
            client.send(f":{old}!{client.user}@{SERVER} NICK :{nick}")
        self._register(client)
        return 200

    def _register(self, client: _Client) -> None:
        if client.registered or not (client.nick and client.user):
            return
        client.registered = True
        client.send(f":{SERVER} 001 {client.nick} :Welcome to the tenancy IRC network {client.nick}",
                    f":{SERVER} 376 {client.nick} :End of /MOTD command.")
        self.signed_in(client.password)

    def _join(self, client: _Client, channel: str) -> None:
        client.channels.add(channel.lower())
        client.send(f":{client.nick}!{client.user}@{SERVER} JOIN :{channel}",
                    f":{SERVER} 353 {client.nick} = {channel} :{client.nick}",
                    f":{SERVER} 366 {client.nick} {channel} :End of /NAMES list.")

    def _say(self, client: _Client, command: str, target: str, text: str) -> None:
        """A bot's line to a channel or a nick: a post (to NickServ: its identification, answered)."""
        if target.lower() == "nickserv":
            client.send(f":NickServ!services@{SERVER} NOTICE {client.nick} :You are now identified for {client.nick}")
            return
        if command == "PRIVMSG":
            channel = target[1:] if target[:1] in "#&" else self._dm.get(target.lower(), target)
            self.add_post(channel, text, client.password)

    def deliver(self, user_id: str, channel_id: str, text: str, channel_type: str = "D") -> str:
        """A `PRIVMSG` from `user_id`: in channel `#channel_id` to every connection that joined it (`O`), else to the
        one holding the bot's nick, the phase's `channel_id` kept for the bot's replies to that user."""
        nick = bot_id(self.tenant.name)
        target = f"#{channel_id}" if channel_type == "O" else nick
        with self.lock:
            if channel_type != "O":
                self._dm[user_id.lower()] = channel_id
            to = [c for c in self._clients if c.registered and (
                target.lower() in c.channels if channel_type == "O" else c.nick.lower() == nick.lower())]
        for client in to:
            client.send(f":{user_id}!{user_id}@users.{SERVER} PRIVMSG {target} :{text}")
        return f"{self.tenant.name}-in-{time.time_ns()}"

    def mention(self) -> str:
        return f"{bot_id(self.tenant.name)}: "

    def registrations(self) -> list[dict[str, Any]]:
        """Every registered connection now: its nick and the password it gave (which credentials logged in here)."""
        with self.lock:
            return [{"nick": c.nick, "password": c.password, "peer": c.conn.peer} for c in self._clients
                    if c.registered]


def parse(line: str) -> tuple[str, list[str]]:
    """An IRC line's command (upper case) and parameters, the trailing one (after ` :`) whole."""
    if line.startswith(":"):
        line = line.split(" ", 1)[1] if " " in line else ""
    head, _, trailing = line.partition(" :")
    parts = head.split()
    params = parts[1:] + ([trailing] if _ else [])
    return (parts[0].upper() if parts else ""), params


def lead(t: Tenant, what: str = "lead") -> str:
    """The tenant's lead (a nick) or lead channel at its IRC server (`platforms.base.lead`)."""
    return _lead(t, "irc_user", what)


def configure(t: Tenant, where: Where) -> Setup:
    url = urllib.parse.urlsplit(where.url)
    channel = t.canaries["irc_channel"]
    return Setup(env={"IRC_SERVER": url.hostname or "127.0.0.1", "IRC_PORT": str(url.port or 6697),
                      "IRC_USE_TLS": "true", "IRC_NICKNAME": bot_id(t.name),
                      "IRC_SERVER_PASSWORD": t.canaries["irc_key"],
                      "IRC_CHANNEL": f"#{channel},#{lead(t, 'leadchannel')}", "IRC_HOME_CHANNEL": f"#{channel}",
                      "IRC_ALLOWED_USERS": f"{t.canaries['irc_user']},{lead(t)}"},
                 files={MEDIA_FILE: f"attachment {t.canaries['irc_file']}\n".encode()})


_EVERYTHING = frozenset({"sign-in", "answered", "home"})

SERVICE = ServiceSpec(
    "irc", "an IRC server: the gateway's IRC adapter, one bot per profile", rank=74,
    make=lambda t, m: IrcStub(t, m), credential="irc_key", credential_env="IRC_SERVER_PASSWORD",
    identity=("irc_user", "irc_channel"), data=("irc_post", "irc_file"), passive=True,
    configure=configure, by_default=False, doors=("gateway",),  # only `hermes gateway run` starts the bots
    messaging=Messaging("irc_user", "irc_channel", "irc_post", "irc_file", MEDIA_FILE, "irc", attachments="none"),
    unsettable=(Unset("allowed_users", env=("IRC_ALLOWED_USERS",), relaxes=frozenset({"answered", "strangers"})),
                Unset("home_channel", env=("IRC_HOME_CHANNEL",), relaxes=frozenset({"home"})),
                Unset("password", env=("IRC_SERVER_PASSWORD",), relaxes=_EVERYTHING),
                Unset("server", env=("IRC_SERVER", "IRC_PORT"), relaxes=_EVERYTHING)),
    coverage=Coverage('source_has("plugins.platforms.irc.adapter", "RPL_WELCOME")',
                      "no IRC platform adapter (plugins/platforms/irc)",
                      forward="Hermes' IRC adapter opens a raw socket, which no proxy variable applies to: its "
                              "server is a reverse listener of the proxy"),
    battery=Battery("irc"),  # no tools: the gateway door's `messaging` phase drives it
    plants={"irc-key": credential_plant("irc_key", "IRC_SERVER_PASSWORD")},
)

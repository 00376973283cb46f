"""A mail server per tenant, for the gateway's email adapter (`plugins/platforms/email`, stdlib `imaplib` and
`smtplib`): the profile's `EMAIL_ADDRESS`, `EMAIL_PASSWORD` (the credential, for IMAP and SMTP alike),
`EMAIL_IMAP_HOST`/`EMAIL_IMAP_PORT`, `EMAIL_SMTP_HOST`/`EMAIL_SMTP_PORT`, `EMAIL_ALLOWED_USERS` (its user's and its
lead's addresses), `EMAIL_HOME_ADDRESS` and `EMAIL_POLL_INTERVAL` in `.env`, as Hermes' own setup writes them. The
gateway door's `messaging` phase drives the bots.

IMAP: the adapter connects with implicit TLS (`IMAP4_SSL`, which verifies nothing) to the tenant's listener of the
proxy, a raw TCP one: mitmproxy terminates the TLS and relays the lines to the stub. SMTP: the adapter connects in
clear and turns TLS on with STARTTLS, verified against the project's CA: it reaches the stub's STARTTLS front
(`capture.stubs.lines.StartTlsFront`, `ChatStub.direct`), which greets, relays every command through the same
listener and takes the handshake with a leaf of that CA. Either way the proxy's TCP flow holds the whole dialogue in
clear (`LOGIN` and `AUTH` with the password, every mail) and the stub tells the two apart by who speaks first.

The stub is the subset of both the adapter uses. IMAP4rev1: `CAPABILITY`, `LOGIN`, `ID`, `SELECT`/`EXAMINE`,
`SEARCH`/`UID SEARCH` (`ALL`, `UNSEEN`), `FETCH`/`UID FETCH` (`RFC822`, `BODY[]`; it sets `\\Seen`), `STORE`,
`NOOP`, `LOGOUT`; a bot's sign-in is its connection test (`LOGIN`, then `UID SEARCH ALL`), each poll a login kept in
`logins`. SMTP: `EHLO`/`HELO` (`STARTTLS`, then `AUTH PLAIN LOGIN`), `STARTTLS`, `AUTH`, `MAIL`, `RCPT`, `DATA`
(a mail: a post in the conversation it answers, `In-Reply-To`, else its recipient's; its MIME attachments the
post's files, with the password the session authenticated with), `RSET`, `NOOP`, `QUIT`. Anything else is IMAP's
`BAD` or SMTP's `502`, kept in `unknown`. A message from a user is an RFC 5322 mail in the INBOX, stamped
`Authentication-Results: ...; dmarc=pass` as the receiving server would. Email has no channels: a chat is its sender
(`Messaging.channels = False`). An IMAP session that only polled an empty INBOX is recorded as `background`: it
comes every few seconds and would keep a run from ever being idle.
"""

from __future__ import annotations

import base64
import binascii
import email.parser
import email.policy
import re
import time
import urllib.parse
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import formatdate, parseaddr
from typing import Any, Self

from harness.capture.stubs.lines import LineConn, LineStub, StartTlsFront
from harness.core.registry import Tenant
from harness.drive.platforms.base import ChatStub
from harness.drive.platforms.base import lead as _lead
from harness.drive.surface import Battery, Coverage, Messaging, ServiceSpec, Setup, Unset, Where, credential_plant

SERVER = "tenancy.mail"
USERS = "users.test"  # the domain of the users' addresses
#: Seconds an IMAP client waits for the greeting in silence; an SMTP session (from the front) speaks at once.
SNIFF = 0.5
#: A file in every profile's home holding its `email_file` canary: what its agent attaches to a reply (`MEDIA:`).
MEDIA_FILE = "tenancy-email.txt"
_ARG = re.compile(rb'"((?:\\.|[^"\\])*)"|(\S+)')
_STATE_ONLY = {"CAPABILITY", "LOGIN", "ID", "SELECT", "EXAMINE", "LOGOUT", "NOOP", "UID SEARCH", "SEARCH"}


def address(local: str) -> str:
    """A user's address (its id, a canary or a lead, as the local part)."""
    return f"{local}@{USERS}".lower()


@dataclass
class _Mail:
    uid: int
    data: bytes
    seen: bool = False


@dataclass
class _Session:
    """One connection's state and its records, kept when it ends (as background if it only polled)."""

    conn: LineConn
    user: str = ""
    password: str = ""
    tls: bool = False
    lines: list[tuple[str, bytes, int, bool]] = field(default_factory=list)  # (command, line, status, wrong key)
    busy: bool = False  # it did more than poll an empty INBOX (else its records are background)


@dataclass
class EmailStub(LineStub, ChatStub):
    """Its sign-ins are the IMAP connection tests (`LOGIN` then `UID SEARCH ALL`), each with its password."""

    service: str = "email"
    logins: list[dict[str, Any]] = field(default_factory=list)  # every IMAP and SMTP login: who, with what, whence
    _box: list[_Mail] = field(default_factory=list)
    _threads: dict[str, str] = field(default_factory=dict)  # a mail's Message-ID -> the phase's channel
    _front: StartTlsFront | None = None

    def start(self, sock: Any = None) -> Self:
        super().start(sock)
        self._front = StartTlsFront(self._relay_to, f"220 {SERVER} ESMTP ready", f"email-{self.tenant.name}").start()
        return self

    def stop(self) -> None:
        if self._front is not None:
            self._front.stop()
            self._front = None
        super().stop()

    @property
    def direct(self) -> str:
        assert self._front is not None, "stub not started"
        return f"tcp://127.0.0.1:{self._front.port}"

    def _relay_to(self) -> tuple[str, int]:
        """Where the front relays: the tenant's listener of the proxy, else (a stub alone) the stub."""
        service = self.tenant.services.get(self.service)
        return "127.0.0.1", (service.listen if service is not None and service.listen else self.port)

    def session(self, conn: LineConn) -> None:
        s = _Session(conn)
        try:
            (self._smtp if conn.ready(SNIFF) else self._imap)(s)
        finally:
            for command, line, status, wrong in s.lines:  # an empty poll's: background, as a long poll's
                self.record_line(command, line, status, wrong, conn.peer, background=not s.busy)

    def _keep(self, s: _Session, command: str, line: bytes, status: int = 200) -> None:
        wrong = command in ("LOGIN", "AUTH") and s.password != self.expected
        s.lines.append((command, line, status, wrong))
        s.busy = s.busy or wrong or status >= 400 or command not in _STATE_ONLY

    def _login(self, s: _Session, protocol: str, user: str, password: str) -> bool:
        """A login, kept; whether it is accepted (strict mode: only the tenant's own password)."""
        s.user, s.password = user, password
        with self.lock:
            self.logins.append({"protocol": protocol, "user": user, "password": password, "peer": s.conn.peer,
                                "time": time.time()})
        return self.mode != "strict" or password == self.expected

    # --- IMAP ------------------------------------------------------------------------------------------------------

    def _imap(self, s: _Session) -> None:
        s.conn.send(f"* OK [CAPABILITY IMAP4rev1 AUTH=PLAIN] {SERVER} IMAP4rev1 ready")
        while (raw := s.conn.readline()) is not None:
            tag, _, rest = raw.decode("utf-8", "replace").partition(" ")
            verb, _, args = rest.partition(" ")
            command = verb.upper()
            if command == "UID":
                verb, _, args = args.partition(" ")
                command = f"UID {verb.upper()}"
            if command in ("EHLO", "HELO"):  # an SMTP session that took longer than SNIFF to speak
                return self._smtp(s, raw)
            done, status = self._imap_command(s, tag, command, args)
            self._keep(s, command, raw, status)
            if done:
                return

    def _imap_command(self, s: _Session, tag: str, command: str, args: str) -> tuple[bool, int]:
        """Answer one command: (whether the session ends, its status)."""
        send = s.conn.send
        if command == "CAPABILITY":
            send("* CAPABILITY IMAP4rev1 AUTH=PLAIN ID", f"{tag} OK CAPABILITY completed")
        elif command == "LOGIN" and len(words := imap_args(args)) == 2:
            if not self._login(s, "imap", *words):
                send(f"{tag} NO [AUTHENTICATIONFAILED] Invalid credentials")
                return False, 401
            send(f"{tag} OK [CAPABILITY IMAP4rev1] LOGIN completed")
        elif command in ("NOOP", "CHECK", "CLOSE", "EXPUNGE"):
            send(f"{tag} OK {command} completed")
        elif command == "ID":
            send(f'* ID ("name" "{SERVER}")', f"{tag} OK ID completed")
        elif command == "LOGOUT":
            send(f"* BYE {SERVER} logging out", f"{tag} OK LOGOUT completed")
            return True, 200
        elif not s.user:
            send(f"{tag} NO not authenticated")
            return False, 403
        elif command in ("SELECT", "EXAMINE"):
            with self.lock:
                exists, uidnext = len(self._box), len(self._box) + 1
            send(f"* {exists} EXISTS", "* 0 RECENT", "* FLAGS (\\Seen)", "* OK [UIDVALIDITY 1] UIDs valid",
                 f"* OK [UIDNEXT {uidnext}] next", f"{tag} OK [READ-WRITE] {command} completed")
        elif command in ("SEARCH", "UID SEARCH"):
            self._search(s, tag, command, args)
        elif command in ("FETCH", "UID FETCH", "STORE", "UID STORE"):
            self._fetch(s, tag, command, args)
        else:
            self.add_unknown(f"IMAP {command or '(empty)'}")
            send(f"{tag} BAD {command or 'empty'} unknown command")
            return False, 400
        return False, 200

    def _search(self, s: _Session, tag: str, command: str, args: str) -> None:
        unseen = "UNSEEN" in args.upper()
        with self.lock:
            found = [(n, m) for n, m in enumerate(self._box, 1) if not (unseen and m.seen)]
        ids = [str(m.uid if command.startswith("UID") else n) for n, m in found]
        s.conn.send(f"* SEARCH {' '.join(ids)}".rstrip(), f"{tag} OK SEARCH completed")
        tested = command == "UID SEARCH" and args.strip().upper() == "ALL"  # the adapter's connection test
        if tested:
            self.signed_in(s.password)
        s.busy = s.busy or tested or bool(found and unseen)

    def _fetch(self, s: _Session, tag: str, command: str, args: str) -> None:
        """FETCH (the message, which sets `\\Seen` unless peeked) or STORE (flags) of a set of messages."""
        wanted, _, items = args.partition(" ")
        by_uid, store = command.startswith("UID"), command.endswith("STORE")
        with self.lock:
            chosen = [(n, m) for n, m in enumerate(self._box, 1) if in_set(m.uid if by_uid else n, wanted)]
            for _, m in chosen:
                m.seen = m.seen or store or "PEEK" not in items.upper()
        for n, m in chosen:
            if store:
                s.conn.send(f"* {n} FETCH (UID {m.uid} FLAGS (\\Seen))")
            else:
                s.conn.sock.sendall(f"* {n} FETCH (UID {m.uid} RFC822 {{{len(m.data)}}}\r\n".encode() + m.data
                                    + b" FLAGS (\\Seen))\r\n")
        s.conn.send(f"{tag} OK {command} completed")

    # --- SMTP ------------------------------------------------------------------------------------------------------

    def _smtp(self, s: _Session, first: bytes | None = None) -> None:
        raw = first if first is not None else s.conn.readline()
        while raw is not None:
            line = raw.decode("utf-8", "replace")
            command = line.split(" ", 1)[0].upper()
            status = self._smtp_command(s, command, line)
            self._keep(s, command, raw, status)
            if command == "QUIT":
                return
            raw = s.conn.readline()

    def _smtp_command(self, s: _Session, command: str, line: str) -> int:
        send = s.conn.send
        if command in ("EHLO", "HELO"):
            send(f"250-{SERVER}", *(["250-AUTH PLAIN LOGIN"] if s.tls else ["250-STARTTLS"]), "250 ENHANCEDSTATUSCODES")
        elif command == "STARTTLS":
            s.tls = True  # the front takes the handshake on this reply
            send("220 2.0.0 Ready to start TLS")
        elif command == "AUTH":
            return self._auth(s, line.split()[1:])
        elif command in ("MAIL", "RCPT", "RSET", "NOOP"):
            send("250 2.1.0 Ok")
        elif command == "DATA":
            send("354 End data with <CR><LF>.<CR><LF>")
            data = b"".join(iter(lambda: _data_line(s.conn), b""))
            self._mail(data, s.password)
            send("250 2.0.0 Ok: queued")
        elif command == "QUIT":
            send("221 2.0.0 Bye")
        else:
            self.add_unknown(f"SMTP {command or '(empty)'}")
            send("502 5.5.2 Error: command not recognized")
            return 502
        return 250

    def _auth(self, s: _Session, words: list[str]) -> int:
        """AUTH PLAIN (with its initial response or after `334`) or AUTH LOGIN."""
        mechanism = words[0].upper() if words else ""
        if mechanism == "PLAIN":
            text = words[1] if len(words) > 1 else self._ask(s, "")
            parts = _b64(text).split("\0")
            user, password = (parts[1], parts[2]) if len(parts) == 3 else ("", "")
        elif mechanism == "LOGIN":
            user, password = _b64(self._ask(s, "VXNlcm5hbWU6")), _b64(self._ask(s, "UGFzc3dvcmQ6"))
        else:
            self.add_unknown(f"SMTP AUTH {mechanism or '(none)'}")
            s.conn.send("504 5.5.4 Unrecognized authentication type")
            return 504
        if not self._login(s, "smtp", user, password):
            s.conn.send("535 5.7.8 Authentication credentials invalid")
            return 535
        s.conn.send("235 2.7.0 Authentication successful")
        return 235

    @staticmethod
    def _ask(s: _Session, challenge: str) -> str:
        s.conn.send(f"334 {challenge}")
        return (s.conn.readline() or b"").decode("ascii", "replace")

    def _mail(self, data: bytes, password: str) -> None:
        """A bot's mail: a post in the conversation it answers (else its recipient's), its attachments its files."""
        msg = email.parser.BytesParser(EmailMessage, policy=email.policy.default).parsebytes(data)
        with self.lock:
            thread = self._threads.get(str(msg.get("In-Reply-To", "")).strip())
        channel = thread or parseaddr(str(msg.get("To", "")))[1].split("@")[0]
        body = msg.get_body(preferencelist=("plain",))
        files = [self.add_file(part.get_filename() or "attachment", channel, part.get_payload(decode=True) or b"",
                               password) for part in msg.iter_attachments()]
        self.add_post(channel, str(body.get_content() if body is not None else "").strip(), password,
                      [f["id"] for f in files])

    # --- the phase's side -----------------------------------------------------------------------------------------

    def deliver(self, user_id: str, channel_id: str, text: str, channel_type: str = "D") -> str:
        """A mail from `user_id`'s address in the INBOX, its Message-ID kept for the bot's reply to it."""
        msg = EmailMessage()
        with self.lock:
            uid = len(self._box) + 1
            msg_id = f"<{self.tenant.name}-in{uid}-{time.time_ns()}@{USERS}>"
            self._threads[msg_id] = channel_id
        msg["Authentication-Results"] = f"{SERVER}; dmarc=pass header.from={USERS}"
        msg["From"] = address(user_id)
        msg["To"] = bot_address(self.tenant)
        msg["Subject"] = "Hello"
        msg["Date"] = formatdate()
        msg["Message-ID"] = msg_id
        msg.set_content(text)
        with self.lock:
            self._box.append(_Mail(uid, msg.as_bytes(policy=email.policy.SMTP)))
        return msg_id

    def mention(self) -> str:
        return ""  # a mail has no one to address but its recipient


def _data_line(conn: LineConn) -> bytes:
    """The next line of a mail after DATA, dot-unstuffed; b"" at its end (`.`) or when the client is gone."""
    line = conn.readline(keep_end=True)
    if line is None or line.rstrip(b"\r\n") == b".":
        return b""
    return line[1:] if line.startswith(b"..") else line


def _b64(text: str) -> str:
    try:
        return base64.b64decode(text.strip(), validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return ""


def imap_args(args: str) -> list[str]:
    """IMAP's atoms and quoted strings (`"a \\"b\\""` is `a "b"`)."""
    return [atom.decode("utf-8", "replace") if atom else re.sub(rb"\\(.)", rb"\1", quoted).decode("utf-8", "replace")
            for quoted, atom in _ARG.findall(args.encode("utf-8", "surrogateescape"))]


def in_set(n: int, wanted: str) -> bool:
    """Whether `n` is in an IMAP sequence set (`3`, `1:4`, `2,5:*`)."""
    for part in wanted.split(","):
        low, _, high = part.partition(":")
        try:
            lo = int(low) if low != "*" else n
            hi = (n if high == "*" else int(high)) if high else lo
        except ValueError:
            continue
        if min(lo, hi) <= n <= max(lo, hi):
            return True
    return False


def bot_address(t: Tenant) -> str:
    """The address of the tenant's bot (its `email_address` canary as the local part)."""
    return f"{t.canaries['email_address']}@{SERVER}"


def lead(t: Tenant, what: str = "lead") -> str:
    """The tenant's lead at its mail server (`platforms.base.lead`): an address's local part."""
    return _lead(t, "email_user", what)


def configure(t: Tenant, where: Where) -> Setup:
    imap = urllib.parse.urlsplit(where.url)
    smtp = urllib.parse.urlsplit(where.direct or where.url)
    return Setup(env={"EMAIL_ADDRESS": bot_address(t), "EMAIL_PASSWORD": t.canaries["email_key"],
                      "EMAIL_IMAP_HOST": imap.hostname or "127.0.0.1", "EMAIL_IMAP_PORT": str(imap.port or 993),
                      "EMAIL_SMTP_HOST": smtp.hostname or "127.0.0.1", "EMAIL_SMTP_PORT": str(smtp.port or 587),
                      "EMAIL_POLL_INTERVAL": "2", "EMAIL_HOME_ADDRESS": address(t.canaries["email_channel"]),
                      "EMAIL_ALLOWED_USERS": f"{address(t.canaries['email_user'])},{address(lead(t))}"},
                 files={MEDIA_FILE: f"attachment {t.canaries['email_file']}\n".encode()})


_EVERYTHING = frozenset({"sign-in", "answered", "home"})

SERVICE = ServiceSpec(
    "email", "a mail server (IMAP and SMTP): the gateway's email adapter, one mailbox per profile", rank=73,
    make=lambda t, m: EmailStub(t, m), credential="email_key", credential_env="EMAIL_PASSWORD",
    identity=("email_user", "email_channel", "email_address"), data=("email_post", "email_file"), passive=True,
    configure=configure, by_default=False, doors=("gateway",),  # only `hermes gateway run` starts the bots
    messaging=Messaging("email_user", "email_channel", "email_post", "email_file", MEDIA_FILE, "email",
                        channels=False),
    unsettable=(Unset("allowed_users", env=("EMAIL_ALLOWED_USERS",), relaxes=frozenset({"answered", "strangers"})),
                Unset("home_address", env=("EMAIL_HOME_ADDRESS",), relaxes=frozenset({"home"})),
                Unset("password", env=("EMAIL_PASSWORD",), relaxes=_EVERYTHING),
                Unset("address", env=("EMAIL_ADDRESS",), relaxes=_EVERYTHING),
                Unset("servers", env=("EMAIL_IMAP_HOST", "EMAIL_IMAP_PORT", "EMAIL_SMTP_HOST", "EMAIL_SMTP_PORT"),
                      relaxes=_EVERYTHING)),
    coverage=Coverage('source_has("plugins.platforms.email.adapter", "IMAP4_SSL")',
                      "no email platform adapter (plugins/platforms/email)",
                      forward="Hermes' email adapter opens raw IMAP and SMTP sockets, which no proxy variable applies "
                              "to: its servers are a reverse listener of the proxy"),
    battery=Battery("email"),  # no tools: the gateway door's `messaging` phase drives it
    plants={"email-key": credential_plant("email_key", "EMAIL_PASSWORD")},
)

"""A websocket connection's messages, checked as HTTP bodies are: client->server as a request is (`request_leak`,
and `wrong_key` / `wrong_identity` for another tenant's credential or identity at the connection's service),
server->client as a response is (`response_leak`), for the tenant whose connection it is (the endpoint of the
upgrade request). A raw TCP connection on a tenant's reverse listener (a line protocol: IMAP, SMTP, IRC) is read the
same way, its messages being what each side sent (`protocol="tcp"`), for the tenant whose listener it is.

Each direction is one stream, the concatenation of its messages, so a value an application cuts across messages
is whole in it. `WebsocketScan.feed` looks at each message as it passes, together with the stream's last bytes
before it (a canary's form cut at a message boundary is found there); `finish` then scans the whole stream through
every layer (a compressed stream or a base64 block cut across messages) and the strings at one JSON path across
the JSON messages (a value sent in two JSON messages), for the canaries not already found. The live addon feeds
each message as it passes and finishes when the connection ends; `reconcile` feeds the saved messages and
finishes: the same findings. mitmproxy hands over each message as the application sent it: fragmented frames
reassembled, permessage-deflate undone.

A stream is read up to `MAX_STREAM` bytes; the rest is a `NotInspected` entry (the run cannot be clean).

A connection to a host the tenants share whose upgrade carried no credential (a platform's gateway: its client
authenticates in its first message) is no tenant's until a client message carries the credential of one (`claims`,
as `routes.claimed` tells a request's tenant by its credential): from that message on it is that tenant's, its
messages checked for it, and the report says so (`claimed`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from harness.core.findings import Finding
from harness.core.registry import PROVIDER, Tenant
from harness.detect.decode import MAX_BODY, json_streams, loads, utf8_bytes
from harness.detect.engine.hits import NotInspected
from harness.detect.engine.matcher import Matcher
from harness.detect.flowscan import FlowScan

#: Bytes of one direction's stream that are read; what comes after is not inspected (and said so).
MAX_STREAM = MAX_BODY
CLIENT, SERVER = "client->server", "server->client"
_WHAT = {"websocket": "the websocket", "tcp": "the TCP connection"}


@dataclass(frozen=True)
class Message:
    """One websocket message (or what one side of a TCP connection sent at once) as plain data: its direction and
    its content (text as UTF-8)."""

    from_client: bool
    content: bytes


@dataclass
class WebsocketReport:
    """What a connection's messages were (how many and how many bytes, by direction) and what they leaked."""

    messages: dict[str, int]
    sizes: dict[str, int]
    findings: list[Finding] = field(default_factory=list)
    not_inspected: list[NotInspected] = field(default_factory=list)
    claimed: str | None = None  # the tenant a client message's credential claimed the connection for
    protocol: str = "websocket"  # or "tcp": the key of its ledger entry

    def ledger_entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"messages": dict(self.messages), "bytes": dict(self.sizes)}
        return entry | ({"claimed": self.claimed} if self.claimed else {})


@dataclass
class _Stream:
    """One direction of a connection: the bytes read so far (up to the cap) and their scan."""

    name: str
    scan: FlowScan
    protocol: str
    parts: list[bytes] = field(default_factory=list)
    size: int = 0  # bytes read (at most the cap)
    total: int = 0  # bytes of every message of this direction
    count: int = 0
    tail: bytes = b""  # the stream's last bytes, scanned again with the next message

    @property
    def part(self) -> str:
        return f"{self.protocol}.{self.name}"


class WebsocketScan:
    """The scan of one connection, message by message (`feed`), then as whole streams (`finish`). `tenant` and
    `service`: whose the connection is; `audited` False (a reverse listener of no tenant): counted, not checked;
    `protocol`: "websocket", or "tcp" for a raw TCP connection (its parts are `tcp.client->server`...)."""

    def __init__(self, matcher: Matcher, flow_id: str, tenant: Tenant | None, service: str = PROVIDER, *,
                 audited: bool = True, limit: int = MAX_STREAM, protocol: str = "websocket") -> None:
        self.matcher, self.flow_id, self.tenant, self.service = matcher, flow_id, tenant, service
        self.audited, self.limit, self.protocol = audited, limit, protocol
        #: (tenant, canary kind) -> tenant: whose credential claims the connection (a shared host, no tenant yet;
        #: `flows.websocket_scan` sets it).
        self.claims: dict[tuple[str, str], Tenant] = {}
        self.claimed: str | None = None
        name = tenant.name if tenant else None
        self._streams = {
            True: _Stream(CLIENT, FlowScan(matcher, flow_id, name, "request", "request_leak"), protocol),
            False: _Stream(SERVER, FlowScan(matcher, flow_id, name, "response", "response_leak"), protocol)}
        self._reach = max(matcher.longest - 1, 0)  # a form cut at a boundary has at most this much before it

    def feed(self, message: Message) -> list[Finding]:
        """Read the next message; the findings it adds (a canary it completes counts)."""
        s = self._streams[message.from_client]
        s.count += 1
        s.total += len(message.content)
        data = message.content[: max(self.limit - s.size, 0)]
        if not data or not self.audited:
            return []
        if message.from_client and self.tenant is None and self.claims:
            self._claim(data)
        known = len(s.scan.findings)
        window = s.tail + data
        s.scan.scan(window, s.part, only_new=True, shift=s.size - len(s.tail))
        s.parts.append(data)
        s.size += len(data)
        s.tail = window[-self._reach:] if self._reach else b""
        return [self._named(f) for f in s.scan.findings[known:]]

    def _claim(self, data: bytes) -> None:
        """The connection is the tenant's whose credential `data` carries first, if any: its streams are then checked
        for that tenant (what they held before, no credential, stays as found)."""
        hit = next((h for h in self.matcher.find(data) if (h.tenant, h.kind) in self.claims), None)
        if hit is not None:
            self.tenant, self.claimed = self.claims[hit.tenant, hit.kind], hit.tenant
            for s in self._streams.values():
                s.scan.tenant = hit.tenant

    def finish(self) -> WebsocketReport:
        """Scan each direction's stream through its layers and its JSON messages' strings reassembled, for the
        canaries not yet found; the connection's report."""
        report = WebsocketReport({s.name: s.count for s in self._streams.values()},
                                 {s.name: s.total for s in self._streams.values()}, claimed=self.claimed,
                                 protocol=self.protocol)
        for s in self._streams.values():
            if self.audited:
                self._whole(s)
            report.findings += [self._named(f) for f in s.scan.findings]
            report.not_inspected += s.scan.not_inspected
        return report

    def _whole(self, s: _Stream) -> None:
        s.scan.layered(b"".join(s.parts), s.part, only_new=True)
        docs = [loads(p) for p in s.parts if p.lstrip()[:1] in (b"{", b"[")]
        for path, text in json_streams(docs).items():
            s.scan.layered(utf8_bytes(text), f"{s.part}.json.{path}", only_new=True)
        if s.total > s.size:
            s.scan.not_inspected.append(NotInspected(f"flow:{self.flow_id}:{s.part}",
                                                     f"{self.protocol} stream cap ({self.limit} bytes per direction)",
                                                     s.size))

    def _named(self, f: Finding) -> Finding:
        """A client->server leak of another tenant's credential for this service is a `wrong_key` (the connection
        presents it: a gateway's identify message, an IMAP `LOGIN` line), of its identity there a `wrong_identity`;
        every finding names the service."""
        tenant, service, what = self.tenant, self.service, _WHAT.get(self.protocol, self.protocol)
        if f.kind == "request_leak" and tenant is not None:
            spec = tenant.services.get(service)
            credential = "key" if service == PROVIDER else spec.credential if spec else None
            if f.canary == credential:
                f = replace(f, kind="wrong_key", detail=f"{what} presents {f.victim}'s {service} credential")
            elif spec is not None and f.canary in spec.identity:
                f = replace(f, kind="wrong_identity",
                            detail=f"{what} names {f.victim}'s {f.canary} to {tenant.name}'s {service} service")
        return f if service == PROVIDER else replace(f, service=service)


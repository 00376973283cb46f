"""Flow inspection, shared by the live addon and the offline reconciler, so the two never disagree.

A request is checked by every check of `checks.REQUEST_CHECKS` in turn, a response by every check of
`checks.RESPONSE_CHECKS`; everything works on plain data (route, method, path, header pairs, raw body bytes).
`inspect_flow` is the one adapter from a mitmproxy `HTTPFlow` (live or read back from a `.mitm` file),
`inspect_tcp_flow` from a `TCPFlow` (a raw connection on a reverse listener: its messages as a websocket's). Bodies
are decoded by `harness.detect.decode`; whatever cannot be decoded or parsed is scanned as the raw bytes it is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Self

from mitmproxy import http, tcp

from harness.core.findings import Finding
from harness.core.registry import PROVIDER, Registry
from harness.detect.checks import (
    IN_PATH_CHECKS,
    RESPONSE_CHECKS,
    SCAN_CHECKS,
    RawRequest,
    RawResponse,
    RequestFacts,
    request_facts,
    response_facts,
)
from harness.detect.engine.matcher import Matcher
from harness.detect.prefixes import Prefixes
from harness.detect.reports import FlowReport, RequestReport, ResponseReport
from harness.detect.routes import Endpoint, Route, claimed, endpoint_of, flow_endpoint, pretty_host, route_of
from harness.detect.websocket import CLIENT, SERVER, Message, WebsocketReport, WebsocketScan


def inspect_request(registry: Registry, matcher: Matcher, route: Route, raw: RawRequest) -> RequestReport:
    """Attribute and check one request given as plain data, its route resolved against `registry`."""
    endpoint = claimed(registry, matcher, endpoint_of(registry, route), raw.path, raw.headers, raw.body)
    return check_request(registry, matcher, raw, endpoint)


def check_request(registry: Registry, matcher: Matcher, raw: RawRequest, endpoint: Endpoint,
                  prefixes: Prefixes | None = None) -> RequestReport:
    """Run every request check on `raw`, which belongs to `endpoint`: `egress`, `wrong_key`, `wrong_model`,
    `request_leak`, `wrong_identity`. A reverse listener of no tenant's is recorded, not checked. `prefixes`: the
    bodies scanned before, which a conversation's next request extends (the same findings, sooner)."""
    facts, report = request_in_path(registry, matcher, raw, endpoint, prefixes)
    scan_request(facts, report)
    return report


def request_in_path(registry: Registry, matcher: Matcher, raw: RawRequest, endpoint: Endpoint,
                    prefixes: Prefixes | None = None) -> tuple[RequestFacts, RequestReport]:
    """`raw`'s facts and its report after the in-path checks (`checks.IN_PATH_CHECKS`: host, key, model)."""
    facts = request_facts(registry, matcher, raw, endpoint, prefixes)
    report = facts.report()
    if facts.audited:
        for check in IN_PATH_CHECKS:
            check(facts, report)
    return facts, report


def scan_request(facts: RequestFacts, report: RequestReport) -> None:
    """The scan checks (`checks.SCAN_CHECKS`) on a request whose in-path checks have filled `report`; then
    its findings are named with the service."""
    if facts.audited:
        for check in SCAN_CHECKS:
            check(facts, report)
    report.findings = _at_service(report.findings, facts.service)


@dataclass(frozen=True)
class RequestScan:
    """A request's scan as plain data a worker process can be sent: the request, whose it is (the tenant by
    name) and its report after the in-path checks. `run` gives the report `check_request` gives."""

    raw: RawRequest
    route: Route
    tenant: str | None
    service: str
    report: RequestReport
    fallback: str | None = None  # on a shared host, the tenant whose stub answers an unclaimed request

    @classmethod
    def of(cls, raw: RawRequest, endpoint: Endpoint, report: RequestReport) -> RequestScan:
        """The scan of `raw`, whose `endpoint` is decided and whose in-path checks filled `report`."""
        name = endpoint.tenant.name if endpoint.tenant else None
        fallback = endpoint.fallback.name if endpoint.fallback else None
        return cls(raw, endpoint.route, name, endpoint.service, report, fallback)

    def run(self, registry: Registry, matcher: Matcher) -> RequestReport:
        endpoint = Endpoint(self.route, registry[self.tenant] if self.tenant else None, self.service,
                            registry[self.fallback] if self.fallback else None)
        report = replace(self.report, findings=list(self.report.findings),
                         not_inspected=list(self.report.not_inspected))
        scan_request(request_facts(registry, matcher, self.raw, endpoint), report)
        return report

    @property
    def body(self) -> bytes | None:
        return self.raw.body

    def with_body(self, body: bytes | None) -> Self:
        """The same scan of another body (the pool sends a body apart from the rest, through shared memory)."""
        return replace(self, raw=replace(self.raw, body=body))


@dataclass(frozen=True)
class ResponseScan:
    """A response's (or an error's) check as plain data a worker process can be sent; `run` is
    `inspect_response`."""

    raw: RawResponse
    tenant: str | None
    service: str

    def run(self, registry: Registry, matcher: Matcher) -> ResponseReport:
        return inspect_response(matcher, self.raw, tenant=self.tenant, service=self.service)

    @property
    def body(self) -> bytes | None:
        return self.raw.body

    def with_body(self, body: bytes | None) -> Self:
        """The same scan of another body (the pool sends a body apart from the rest, through shared memory)."""
        return replace(self, raw=replace(self.raw, body=body))


def inspect_response(matcher: Matcher, raw: RawResponse, *, tenant: str | None, service: str = PROVIDER
                     ) -> ResponseReport:
    """Check one response (JSON, SSE or anything else) for another tenant's canary: `response_leak`."""
    facts = response_facts(matcher, raw.flow_id, tenant, raw.headers, raw.body)
    report = ResponseReport(raw.status, len(raw.body) if raw.body is not None else None, facts.streamed, raw.error,
                            facts.decoded.note)
    for check in RESPONSE_CHECKS:
        check(facts, report)
    report.findings = _at_service(report.findings, service)
    return report


def _at_service(findings: list[Finding], service: str) -> list[Finding]:
    """Findings of a request to, or a response from, `service`: named with it unless it is the provider."""
    return findings if service == PROVIDER else [replace(f, service=service) for f in findings]


def raw_request(flow: http.HTTPFlow) -> RawRequest:
    """A flow's request as plain data."""
    req = flow.request
    return RawRequest(flow.id, req.method, req.path, list(req.headers.items(multi=True)), req.raw_content,
                      refused(flow))


def refused(flow: http.HTTPFlow) -> bool:
    """Whether the proxy refused the flow: the addon's routing answered it (`metadata["tenancy"]["refused"]`)
    and mitmproxy never opened a server connection for it."""
    meta = flow.metadata.get("tenancy")
    return (isinstance(meta, dict) and meta.get("refused") is True and flow.response is not None
            and flow.server_conn.timestamp_start is None)


def inspect_flow_request(registry: Registry, matcher: Matcher, flow: http.HTTPFlow,
                         endpoint: Endpoint | None = None, prefixes: Prefixes | None = None) -> RequestReport:
    """Inspect a flow's request; `endpoint` is whose it is when the caller has decided that already (the
    addon's routing has), else it is resolved from the flow."""
    return check_request(registry, matcher, raw_request(flow), endpoint or flow_endpoint(registry, matcher, flow),
                         prefixes)


def inspect_flow(
    registry: Registry, matcher: Matcher, flow: http.HTTPFlow, *, request: RequestReport | None = None,
    endpoint: Endpoint | None = None, prefixes: Prefixes | None = None,
) -> FlowReport:
    """Inspect a whole mitmproxy flow, live or read back with `mitmproxy.io.FlowReader`.

    `request` is the report of this very request from the same registry and matcher, if the caller has one
    (the live addon inspects each request in its `request` hook); it is then not inspected again. Otherwise
    `endpoint` is whose the flow is, if the caller has decided it (`inspect_flow_request`), and `prefixes` the
    request bodies inspected before (`check_request`).
    """
    if request is None:
        request = inspect_flow_request(registry, matcher, flow, endpoint, prefixes)
    scan = response_scan(flow, request)
    report = flow_report(flow, request, scan.run(registry, matcher) if scan else None)
    if flow.websocket is not None:
        report.websocket = websocket_report(registry, matcher, flow, request)
    return report


def inspect_tcp_flow(registry: Registry, matcher: Matcher, flow: tcp.TCPFlow, endpoint: Endpoint | None = None
                     ) -> FlowReport:
    """Inspect a raw TCP flow (a line protocol on a tenant's reverse listener, live or read back): its messages
    checked as a websocket's are, for the tenant and service whose listener it is (`endpoint`, else resolved from
    the flow)."""
    report = tcp_flow_report(registry, flow, endpoint)
    report.websocket = websocket_report(registry, matcher, flow, report.request)
    return report


def tcp_flow_report(registry: Registry, flow: tcp.TCPFlow, endpoint: Endpoint | None = None) -> FlowReport:
    """The report of a TCP flow before its messages: whose it is (a connection has no request: its "request" is the
    connection, `TCP` to the address it goes to) and its error, if it ended with one."""
    endpoint = endpoint or endpoint_of(registry, route_of(flow))
    address = flow.server_conn.address
    host = str(address[0]) if address else ""
    request = RequestReport(endpoint.tenant.name if endpoint.tenant else None, str(endpoint.route), "TCP",
                            f"{host}:{address[1]}" if address else "", "service", "none", None, None, 0,
                            service=endpoint.service)
    response = ResponseReport(None, None, error=flow.error.msg) if flow.error else None
    return FlowReport(flow.id, flow.timestamp_created, host, request, response)


def websocket_report(registry: Registry, matcher: Matcher, flow: http.HTTPFlow | tcp.TCPFlow,
                     request: RequestReport) -> WebsocketReport:
    """Every message of a websocket (or TCP) flow, fed in order and finished: what the live addon found as they
    passed."""
    scan = websocket_scan(registry, matcher, flow, request)
    for message in messages_of(flow):
        scan.feed(message)
    return scan.finish()


def websocket_scan(registry: Registry, matcher: Matcher, flow: http.HTTPFlow | tcp.TCPFlow, request: RequestReport
                   ) -> WebsocketScan:
    """The scan of a websocket flow's messages, for the tenant and service of its upgrade request (`request`), or
    of a TCP flow's, for its listener's; a reverse listener of no tenant's is counted, not checked. An upgrade to a
    host the tenants share that carried no credential (a platform's gateway, whose client authenticates in its first
    message) is claimed by the first client message that carries one (`WebsocketScan.claims`)."""
    tenant = registry.tenants.get(request.tenant) if request.tenant else None
    audited = tenant is not None or not request.route.startswith("listen:")
    protocol = "tcp" if isinstance(flow, tcp.TCPFlow) else "websocket"
    host = request.route.removeprefix("host:") if tenant is None and request.route.startswith("host:") else ""
    claims = {(t.name, kind): t for t, _, kinds in registry.sharing(host) for kind in kinds} if host else {}
    scan = WebsocketScan(matcher, flow.id, tenant, request.service, audited=audited, protocol=protocol)
    scan.claims = claims
    return scan


def messages_of(flow: http.HTTPFlow | tcp.TCPFlow) -> list[Message]:
    """A websocket flow's messages (a TCP flow's: what each side sent) as plain data, in order."""
    if isinstance(flow, tcp.TCPFlow):
        return [Message(m.from_client, m.content) for m in flow.messages]
    return [Message(m.from_client, m.content) for m in flow.websocket.messages] if flow.websocket else []


def sent_at(flow: http.HTTPFlow | tcp.TCPFlow, location: str) -> float | None:
    """When the message that `location` (`flow:ID:PROTOCOL.DIRECTION@OFFSET`, in a websocket's or a TCP connection's
    stream of one direction) points into was sent; None for a location in no such stream. A connection lasts as long
    as its client keeps it (an IRC bot's, the whole run), so its start is not when what crossed it was sent."""
    part, _, offset = location.rpartition("@")
    direction = part.rpartition(".")[2]
    if direction not in (CLIENT, SERVER) or not offset.isdigit():
        return None
    raw = flow.messages if isinstance(flow, tcp.TCPFlow) else flow.websocket.messages if flow.websocket else []
    sent = [m for m in raw if m.from_client == (direction == CLIENT)]
    end = 0
    for message in sent:
        end += len(message.content)
        if int(offset) < end:
            return message.timestamp
    return sent[-1].timestamp if sent else None


def response_scan(flow: http.HTTPFlow, request: RequestReport) -> ResponseScan | None:
    """The check of a flow's response (or the error in its place), whose request is `request`; None before
    either."""
    if flow.response is None and flow.error is None:
        return None
    resp = flow.response
    raw = RawResponse(flow.id, resp.status_code if resp else None,
                      list(resp.headers.items(multi=True)) if resp else [], resp.raw_content if resp else None,
                      flow.error.msg if flow.error else None)
    return ResponseScan(raw, request.tenant, request.service)


def flow_report(flow: http.HTTPFlow, request: RequestReport, response: ResponseReport | None) -> FlowReport:
    """The report of a flow from its request's and its response's."""
    report = FlowReport(flow.id, flow.request.timestamp_start, pretty_host(flow.request), request, response,
                        refused=refused(flow))
    if response is not None and request.tenant is None and request.route.startswith("listen:"):
        response.findings = []  # a listener of no tenant: recorded, not inspected
    return report

"""Flow inspection, shared by the live addon and the offline reconciler, so the two never disagree.

A request is checked by every check of `checks.REQUEST_CHECKS` in turn, a response by every check of
`checks.RESPONSE_CHECKS`; everything works on plain data (route, method, path, header pairs, raw body bytes).
`inspect_flow` is the one adapter from a mitmproxy `HTTPFlow` (live or read back from a `.mitm` file). Bodies
are decoded by `harness.detect.decode`; whatever cannot be decoded or parsed is scanned as the raw bytes it is.
"""

from __future__ import annotations

from dataclasses import replace

from mitmproxy import http

from harness.core.findings import Finding
from harness.core.registry import PROVIDER, Registry
from harness.detect.checks import (
    REQUEST_CHECKS,
    RESPONSE_CHECKS,
    RawRequest,
    RawResponse,
    request_facts,
    response_facts,
)
from harness.detect.engine.matcher import Matcher
from harness.detect.reports import FlowReport, RequestReport, ResponseReport
from harness.detect.routes import Endpoint, Route, endpoint_of, pretty_host, route_of


def inspect_request(registry: Registry, matcher: Matcher, route: Route, raw: RawRequest) -> RequestReport:
    """Attribute and check one request given as plain data, its route resolved against `registry`."""
    return check_request(registry, matcher, raw, endpoint_of(registry, route))


def check_request(registry: Registry, matcher: Matcher, raw: RawRequest, endpoint: Endpoint) -> RequestReport:
    """Run every request check on `raw`, which belongs to `endpoint`: `egress`, `wrong_key`, `wrong_model`,
    `request_leak`, `wrong_identity`. A reverse listener of no tenant's is recorded, not checked."""
    facts = request_facts(registry, matcher, raw, endpoint)
    report = facts.report()
    if facts.audited:
        for check in REQUEST_CHECKS:
            check(facts, report)
    report.findings = _at_service(report.findings, endpoint.service)
    return report


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


def inspect_flow_request(registry: Registry, matcher: Matcher, flow: http.HTTPFlow,
                         endpoint: Endpoint | None = None) -> RequestReport:
    """Inspect a flow's request; `endpoint` is whose it is when the caller has decided that already (the
    addon's routing has), else it is resolved from the flow."""
    req = flow.request
    raw = RawRequest(flow.id, req.method, req.path, list(req.headers.items(multi=True)), req.raw_content)
    return check_request(registry, matcher, raw, endpoint or endpoint_of(registry, route_of(flow)))


def inspect_flow(
    registry: Registry, matcher: Matcher, flow: http.HTTPFlow, *, request: RequestReport | None = None,
    endpoint: Endpoint | None = None,
) -> FlowReport:
    """Inspect a whole mitmproxy flow, live or read back with `mitmproxy.io.FlowReader`.

    `request` is the report of this very request from the same registry and matcher, if the caller has one
    (the live addon inspects each request in its `request` hook); it is then not inspected again. Otherwise
    `endpoint` is whose the flow is, if the caller has decided it (`inspect_flow_request`).
    """
    if request is None:
        request = inspect_flow_request(registry, matcher, flow, endpoint)
    report = FlowReport(flow.id, flow.request.timestamp_start, pretty_host(flow.request), request)
    if flow.response is not None or flow.error is not None:
        resp = flow.response
        raw = RawResponse(flow.id, resp.status_code if resp else None,
                          list(resp.headers.items(multi=True)) if resp else [], resp.raw_content if resp else None,
                          flow.error.msg if flow.error else None)
        report.response = inspect_response(matcher, raw, tenant=request.tenant, service=request.service)
        if request.tenant is None and request.route.startswith("listen:"):
            report.response.findings = []  # a listener of no tenant: recorded, not inspected
    return report

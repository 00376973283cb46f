"""Flow inspection, shared by the live addon and the offline reconciler, so the two never disagree.

Everything here works on plain data (route, method, path, header pairs, raw body bytes); `inspect_flow`
is the one adapter from a mitmproxy `HTTPFlow` (live or read back from a `.mitm` file). Bodies are decoded
by `harness.detect.decode`; whatever cannot be decoded or parsed is scanned as the raw bytes it is.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field, replace
from typing import Any

from mitmproxy import http
from mitmproxy.net.http import url
from mitmproxy.proxy.mode_specs import ReverseMode

from harness.core.findings import Finding
from harness.core.protocol import FLOW_HEADER, LOCAL_PROBES
from harness.core.registry import PROVIDER, Registry, Tenant
from harness.detect.decode import (
    KEY_HEADERS,
    Body,
    Headers,
    bearer_of,
    decode_body,
    first_values,
    parse_json,
    sse_streams,
    utf8_bytes,
)
from harness.detect.engine.matcher import SEPARATOR, Hit, Matcher
from harness.detect.engine.stream import NotInspected, ScanHit, scan_bytes
from harness.detect.reports import FlowReport, RequestReport, ResponseReport
from harness.detect.tools import attribute_body

_SEPARATOR = SEPARATOR.decode()


@dataclass(frozen=True)
class Route:
    """How a flow reached the proxy: a reverse listener's port, or a forward request's host."""

    topology: str  # "reverse" or "forward"
    listen_port: int | None = None
    host: str | None = None

    def __str__(self) -> str:
        return f"listen:{self.listen_port}" if self.topology == "reverse" else f"host:{self.host}"


def endpoint_for(registry: Registry, *, listen_port: int | None = None,
                 host: str | None = None) -> tuple[Tenant | None, str]:
    """The tenant and service a listener port (reverse) or a request host (forward) belongs to; (None,
    `provider`) when it is no tenant's."""
    if listen_port is not None:
        found = registry.endpoint(listen_port=listen_port)
    else:
        found = registry.endpoint(host=host) if host else None
    return found if found else (None, PROVIDER)


def tenant_for(registry: Registry, *, listen_port: int | None = None, host: str | None = None) -> Tenant | None:
    """The tenant a listener port (reverse) or a request host (forward) belongs to, if any."""
    return endpoint_for(registry, listen_port=listen_port, host=host)[0]


def _label(body_encoding: str | None, hit: Hit | ScanHit) -> str:
    if not body_encoding:
        return hit.encoding
    return body_encoding if hit.encoding == "plain" else f"{body_encoding}+{hit.encoding}"


@dataclass
class _FlowScan:
    """Collects leak findings of one message: every canary not owned by the channel's tenant."""

    matcher: Matcher
    flow_id: str
    tenant: str | None
    channel: str
    kind: str
    findings: list[Finding] = field(default_factory=list)
    seen: set[tuple[str, str]] = field(default_factory=set)
    not_inspected: list[NotInspected] = field(default_factory=list)

    def scan(
        self,
        data: bytes,
        part: str,
        *,
        encoding: str | None = None,
        skip: frozenset[tuple[str, str]] = frozenset(),
        offsets: bool = True,
        only_new: bool = False,
    ) -> None:
        for hit in self.matcher.find(data, exclude=self.tenant):
            self._add(hit, data, part, encoding, skip, offsets, only_new)

    def _add(self, hit: Hit, data: bytes, part: str, encoding: str | None, skip: frozenset[tuple[str, str]],
             offsets: bool, only_new: bool) -> None:
        """Record `hit` (found in `data`) as a finding, unless `skip` holds it or `only_new` and it was seen."""
        ident = (hit.tenant, hit.kind)
        if ident in skip or (only_new and ident in self.seen):
            return
        self.seen.add(ident)
        self.findings.append(
            Finding(
                kind=self.kind,
                victim=hit.tenant,
                seen_in=self.tenant,
                canary=hit.kind,
                channel=self.channel,
                location=f"flow:{self.flow_id}:{part}" + (f"@{hit.start}" if offsets else ""),
                encoding=_label(encoding, hit),
                evidence=self.matcher.snippet(data, hit),
            )
        )

    def headers(self, headers: Headers, prefix: str, skip: frozenset[tuple[str, str]] = frozenset()) -> None:
        """Scan every header line as if alone (`skip` applies to the credential headers), in one call: the
        lines are joined by SEPARATOR, which no pattern holds, so no match can cross from one line into the
        next (with a canary that holds it, every line is scanned alone)."""
        lines = [(name.lower(), f"{name}: {value}") for name, value in headers if name.lower() != FLOW_HEADER]
        if not self.matcher.separable:
            for name, text in lines:
                self.scan(text.encode("utf-8", "surrogateescape"), f"{prefix}.headers.{name}",
                          skip=skip if name in KEY_HEADERS else frozenset(), offsets=False)
            return
        block = _SEPARATOR.join(text for _, text in lines).encode("utf-8", "surrogateescape")
        hits = self.matcher.find(block, exclude=self.tenant)
        base = 0
        for name, text in lines:  # hits and lines are both in offset order
            if not hits:  # the usual case: there were none
                return
            line = text.encode("utf-8", "surrogateescape")
            end = base + len(line)
            while hits and hits[0].start < end:
                hit = hits.pop(0)
                self._add(replace(hit, start=hit.start - base, end=hit.end - base), line,
                          f"{prefix}.headers.{name}", None, skip if name in KEY_HEADERS else frozenset(), False, False)
            base = end + len(SEPARATOR)

    def layered(self, data: bytes, part: str, *, encoding: str | None = None,
                skip: frozenset[tuple[str, str]] = frozenset(), only_new: bool = False, offsets: bool = True) -> None:
        """Scan `data` and every layer in it (base64 blocks, compressed streams, ...: `stream.scan_bytes`).
        `offsets`: locate a hit in the raw bytes at its offset (a hit in a layer always is)."""
        where = f"flow:{self.flow_id}:{part}"
        skipped: list[NotInspected] = []
        for h in scan_bytes(data, self.matcher, headerless=False, not_inspected=skipped, exclude=self.tenant):
            ident = (h.tenant, h.kind)
            if ident in skip or (only_new and ident in self.seen):
                continue
            self.seen.add(ident)
            self.findings.append(Finding(
                kind=self.kind, victim=h.tenant, seen_in=self.tenant, canary=h.kind, channel=self.channel,
                location=h.location(where) if offsets or h.layers else where, encoding=_label(encoding, h),
                evidence=h.evidence,
            ))
        self.not_inspected += [replace(n, path=where + n.path.removeprefix("bytes")) for n in skipped]

    def body(self, body: Body, part: str, skip: frozenset[tuple[str, str]] = frozenset()) -> None:
        self.layered(body.data, part, encoding=body.encoding, skip=skip)
        if body.partial:
            read = len(body.data) if body.note == "truncated" else 0
            self.not_inspected.append(NotInspected(f"flow:{self.flow_id}:{part}", f"body {body.note}", read))


def _bearer_state(tenant: Tenant | None, bearer: str | None, owner: Tenant | None, expected: str | None) -> str:
    """`none`, `own` (the credential the tenant must present here: `expected`), `foreign` (another tenant's
    secret), `misused` (another secret of the tenant itself) or `unknown` (no tenant's)."""
    if not bearer:
        return "none"
    if owner is None:
        return "unknown"
    if owner is not tenant:
        return "foreign"
    return "own" if bearer == expected else "misused"


def request_kind(path: str, doc: Any, service: str = PROVIDER) -> str:
    """`probe` (a local-server probe), `main` (a turn offering tools) or `aux` on a provider; `service` on
    any other service."""
    if service != PROVIDER:
        return "service"
    if path.split("?", 1)[0] in LOCAL_PROBES:
        return "probe"
    return "main" if isinstance(doc, dict) and doc.get("tools") else "aux"


def credential_of(first: dict[str, str], doc: Any) -> tuple[str | None, str]:
    """The credential a request presents and where: a key header (`bearer_of`), else a top-level
    `api_key` field of a JSON body (as Tavily's API takes it)."""
    bearer = bearer_of(first)
    if bearer:
        return bearer, next(f"headers.{n}" for n in KEY_HEADERS if first.get(n, "").strip())
    value = doc.get("api_key") if isinstance(doc, dict) else None
    return (value, "body.api_key") if isinstance(value, str) and value else (None, "headers.authorization")


def inspect_request(
    registry: Registry,
    matcher: Matcher,
    *,
    flow_id: str,
    route: Route,
    method: str,
    path: str,
    headers: Headers,
    body: bytes | None,
) -> RequestReport:
    """Attribute and check one request: `wrong_key`, `wrong_model`, `wrong_identity`, `request_leak`, `egress`."""
    tenant, service = endpoint_for(registry, listen_port=route.listen_port, host=route.host)
    name = tenant.name if tenant else None
    first = first_values(headers)
    decoded = decode_body(body, first.get("content-encoding", ""), first.get("transfer-encoding", ""))
    doc = parse_json(decoded)
    kind = request_kind(path, doc, service)
    model = doc.get("model") if isinstance(doc, dict) and isinstance(doc.get("model"), str) else None
    bearer, held_in = credential_of(first, doc)
    expected = tenant.credential(service) if tenant is not None else None
    if tenant is not None and bearer is not None and bearer == expected:  # the usual case (a value has one owner)
        owner: Tenant | None = tenant
    else:
        owner = registry.owner_of_key(bearer) if bearer else None
    bearer_state = _bearer_state(tenant, bearer, owner, expected)
    report = RequestReport(name, str(route), method, path, kind, bearer_state, owner.name if owner else None,
                           model, len(body or b""), decoded.note, service=service)
    if tenant is None and route.topology == "reverse":
        return report  # a listener of no tenant (not part of the audit): recorded, not inspected
    where = f"flow:{flow_id}:request"
    skip_headers: set[tuple[str, str]] = set()
    skip_body: set[tuple[str, str]] = set()

    if tenant is None and route.topology == "forward":
        report.findings.append(Finding(
            kind="egress", victim=None, seen_in=None, canary=None, channel="request", location=where,
            evidence=matcher.redact_text(f"{method} {route.host}{path}")[:200],
            detail=f"host {route.host!r} is owned by no tenant",
        ))
    # a main turn needs its key; a service request that does work (not a GET or HEAD probe) needs its credential
    needs_credential = kind == "main" or (service != PROVIDER and expected is not None
                                          and method.upper() not in ("GET", "HEAD"))
    if tenant is not None and (bearer_state != "own" and (bearer or needs_credential)):
        report.findings.append(_wrong_key(matcher, tenant, service, bearer, owner, f"{where}.{held_in}",
                                          skip_body if held_in.startswith("body.") else skip_headers))
    if tenant is not None and kind == "main" and model != tenant.model:
        model_owner = next((t for t in registry if model and t.model == model), None)
        if model_owner is not None:
            skip_body.add((model_owner.name, "model"))
        report.findings.append(Finding(
            kind="wrong_model", victim=model_owner.name if model_owner else tenant.name, seen_in=tenant.name,
            canary="model", channel="request", location=f"{where}.body.model",
            evidence=matcher.redact_text(f'"model": {json.dumps(model)}'),
            detail=f"main turn model is not {tenant.name}'s model",
        ))
    scan = _FlowScan(matcher, flow_id, name, "request", "request_leak")
    scan.layered(path.encode("utf-8", "surrogateescape"), "request.path", offsets=False)
    scan.headers(headers, "request", frozenset(skip_headers))
    scan.body(decoded, "request.body", frozenset(skip_body))
    leaks = attribute_body(scan.findings, decoded.data, doc, f"flow:{flow_id}:request.body")
    if tenant is not None and service != PROVIDER:
        leaks = [_as_identity(f, tenant.services[service].identity, service) for f in leaks]
    report.findings += leaks
    report.not_inspected = scan.not_inspected
    if service != PROVIDER:
        report.findings = [replace(f, service=service) for f in report.findings]
    return report


def _wrong_key(matcher: Matcher, tenant: Tenant, service: str, bearer: str | None, owner: Tenant | None,
               location: str, skip: set[tuple[str, str]]) -> Finding:
    """The `wrong_key` finding of a request that does not present the credential `service` needs from
    `tenant`; the credential's own canary is added to `skip` (it is this finding, not a leak besides)."""
    provider = service == PROVIDER
    own_kind = "key" if provider else tenant.services[service].credential or "key"
    if bearer is None:
        detail = "a main turn carries no key" if provider else f"a {service} request carries no credential"
        return Finding("wrong_key", tenant.name, tenant.name, own_kind, "request", location,
                       evidence="no credential header", detail=detail)
    if owner is None:
        return Finding("wrong_key", tenant.name, tenant.name, own_kind, "request", location,
                       evidence=f"Bearer <unknown, {len(bearer)} chars>", detail="unknown bearer")
    canary = next(k for k, v in owner.secrets().items() if v == bearer)
    skip.add((owner.name, canary))
    held_in = location.rsplit(":", 1)[-1].removeprefix("request.")  # `headers.x-api-key`, `body.api_key`
    shown = f"Bearer {bearer}" if held_in == "headers.authorization" else f"{held_in.split('.', 1)[1]}: {bearer}"
    if owner is not tenant:
        detail = "bearer is another tenant's secret"
    else:
        detail = "bearer is not the tenant's key" if provider else f"bearer is not the tenant's {service} credential"
    return Finding("wrong_key", owner.name, tenant.name, canary, "request", location,
                   evidence=matcher.redact_text(shown), detail=detail)


def _as_identity(f: Finding, identity: tuple[str, ...], service: str) -> Finding:
    """A request leak of another tenant's identity at this service (its user id, workspace, ...) is the
    request acting as that tenant: `wrong_identity`."""
    if f.canary not in identity:
        return f
    return replace(f, kind="wrong_identity", detail=f"the request names {f.victim}'s {f.canary} to "
                                                    f"{f.seen_in}'s {service} service")


def inspect_response(
    matcher: Matcher,
    *,
    flow_id: str,
    tenant: str | None,
    status: int | None,
    headers: Headers,
    body: bytes | None,
    error: str | None = None,
    service: str = PROVIDER,
) -> ResponseReport:
    """Check one response (JSON, SSE or anything else) for another tenant's canary: `response_leak`."""
    first = first_values(headers)
    decoded = decode_body(body, first.get("content-encoding", ""), first.get("transfer-encoding", ""))
    streamed = "text/event-stream" in first.get("content-type", "").lower()
    size = len(body) if body is not None else None
    report = ResponseReport(status, size, streamed, error, decoded.note)
    scan = _FlowScan(matcher, flow_id, tenant, "response", "response_leak")
    scan.headers(headers, "response")
    scan.body(decoded, "response.body")
    if streamed and not decoded.note:
        for path, text in sse_streams(decoded.data).items():
            scan.layered(utf8_bytes(text), f"response.sse.{path}", only_new=True)
    report.findings = scan.findings if service == PROVIDER else [replace(f, service=service) for f in scan.findings]
    report.not_inspected = scan.not_inspected
    return report


def route_of(flow: http.HTTPFlow) -> Route:
    """Reverse listeners name the tenant by port (kept in saved flows); anything else goes by host."""
    mode = flow.client_conn.proxy_mode
    if isinstance(mode, ReverseMode):
        port = mode.custom_listen_port
        if port is None and flow.client_conn.sockname:
            port = flow.client_conn.sockname[1]
        return Route("reverse", listen_port=port)
    return Route("forward", host=pretty_host(flow.request).lower().rstrip("."))


def pretty_host(request: http.Request) -> str:
    """`request.pretty_host`, remembered for each Host header: parsing one costs as much as parsing a
    256 KiB body's JSON does in a busy proxy, and a proxy sees the same few hosts over and over."""
    return _pretty_host(request.host_header, request.host)


@functools.lru_cache(maxsize=1024)
def _pretty_host(host_header: str | None, host: str) -> str:
    return url.parse_authority(host_header, check=False)[0] if host_header else host


def inspect_flow_request(registry: Registry, matcher: Matcher, flow: http.HTTPFlow) -> RequestReport:
    """Inspect a flow's request."""
    req = flow.request
    return inspect_request(registry, matcher, flow_id=flow.id, route=route_of(flow), method=req.method,
                           path=req.path, headers=list(req.headers.items(multi=True)), body=req.raw_content)


def inspect_flow(
    registry: Registry, matcher: Matcher, flow: http.HTTPFlow, *, request: RequestReport | None = None
) -> FlowReport:
    """Inspect a whole mitmproxy flow, live or read back with `mitmproxy.io.FlowReader`.

    `request` is the report of this very request from the same registry and matcher, if the caller has one
    (the live addon inspects each request in its `request` hook); it is then not inspected again.
    """
    if request is None:
        request = inspect_flow_request(registry, matcher, flow)
    report = FlowReport(flow.id, flow.request.timestamp_start, pretty_host(flow.request), request)
    if flow.response is not None or flow.error is not None:
        resp = flow.response
        report.response = inspect_response(
            matcher, flow_id=flow.id, tenant=request.tenant,
            status=resp.status_code if resp else None,
            headers=list(resp.headers.items(multi=True)) if resp else [],
            body=resp.raw_content if resp else None,
            error=flow.error.msg if flow.error else None,
            service=request.service,
        )
        if request.tenant is None and request.route.startswith("listen:"):
            report.response.findings = []  # a listener of no tenant: recorded, not inspected
    return report

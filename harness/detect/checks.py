"""The checks of one flow, each a small function with one job, run in the order of `REQUEST_CHECKS` and
`RESPONSE_CHECKS` (`harness.detect.flows` iterates them). A check reads what is known of the message (its
`RequestFacts` or `ResponseFacts`, worked out once) and adds what it finds to the message's report.

The order matters: the leak scan leaves out a canary that the key or the model check has already reported at
that part of the request (it is that finding, not a leak besides); the egress check reads whether a refused
request carried a canary (its leaks); the identity check renames the leaks the scan found; the stream check
reports only canaries the headers and body did not already show, but for those the body showed only in its records.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from harness.core.findings import Finding
from harness.core.protocol import LOCAL_PROBES
from harness.core.registry import PROVIDER, Registry, Tenant
from harness.detect.decode import (
    KEY_HEADERS,
    Body,
    Headers,
    bearer_of,
    decode_body,
    first_values,
    parse_json,
    reassembled,
    stream_kind,
    utf8_bytes,
)
from harness.detect.engine.matcher import Matcher
from harness.detect.flowscan import FlowScan
from harness.detect.prefixes import Prefixes
from harness.detect.reports import RequestReport, ResponseReport
from harness.detect.routes import Endpoint
from harness.detect.tools import attribute_body


@dataclass(frozen=True)
class RawRequest:
    """A request as plain data: what a live flow and a saved one both give."""

    flow_id: str
    method: str
    path: str
    headers: Headers
    body: bytes | None
    refused: bool = False  # answered by the proxy without dialling anything (`tenancy_egress=block`)


@dataclass(frozen=True)
class RawResponse:
    """A response as plain data, or the error that took its place."""

    flow_id: str
    status: int | None
    headers: Headers
    body: bytes | None
    error: str | None = None


@dataclass(frozen=True)
class RequestFacts:
    """What every request check reads, worked out once: whose the request is, its decoded body, kind, model
    and credential (`bearer`, where it was `held_in`, its `owner`, the one `expected`, their `bearer_state`)."""

    registry: Registry
    matcher: Matcher
    endpoint: Endpoint
    raw: RawRequest
    decoded: Body
    doc: Any  # the parsed JSON body, or None
    kind: str
    model: str | None
    bearer: str | None
    held_in: str
    owner: Tenant | None
    expected: str | None
    bearer_state: str
    prefixes: Prefixes | None = None  # the request bodies scanned before (a conversation's), if kept

    @property
    def tenant(self) -> Tenant | None:
        return self.endpoint.tenant

    @property
    def service(self) -> str:
        return self.endpoint.service

    @property
    def where(self) -> str:
        return f"flow:{self.raw.flow_id}:request"

    @property
    def audited(self) -> bool:
        """False for a reverse listener of no tenant: not part of the audit, recorded but not checked."""
        return self.tenant is not None or self.endpoint.route.topology != "reverse"

    def report(self) -> RequestReport:
        """The request's report before any check has run."""
        raw, owner = self.raw, self.owner
        return RequestReport(self.tenant.name if self.tenant else None, str(self.endpoint.route), raw.method, raw.path,
                             self.kind, self.bearer_state, owner.name if owner else None, self.model,
                             len(raw.body or b""), self.decoded.note, service=self.service)


def request_facts(registry: Registry, matcher: Matcher, raw: RawRequest, endpoint: Endpoint,
                  prefixes: Prefixes | None = None) -> RequestFacts:
    """Decode and read `raw` once for every check (`prefixes`: the bodies scanned before, kept for the leak scan)."""
    tenant, service = endpoint.tenant, endpoint.service
    first = first_values(raw.headers)
    decoded = decode_body(raw.body, first.get("content-encoding", ""), first.get("transfer-encoding", ""))
    doc = parse_json(decoded)
    model = doc.get("model") if isinstance(doc, dict) and isinstance(doc.get("model"), str) else None
    bearer, held_in = credential_of(first, doc, raw.path, decoded.data, registry)
    if bearer is None and (in_path := credential_in_path(registry, raw.path)):
        bearer, held_in = in_path, "path"
    accepted = tenant.credentials(service) if tenant is not None else ()  # several on a shared host's route
    expected = bearer if bearer in accepted else next(iter(accepted), None)
    if tenant is not None and bearer is not None and bearer == expected:  # the usual case (a value has one owner)
        owner: Tenant | None = tenant
    else:
        owner = registry.owner_of_key(bearer) if bearer else None
    return RequestFacts(registry, matcher, endpoint, raw, decoded, doc, request_kind(raw.path, doc, service), model,
                        bearer, held_in, owner, expected, _bearer_state(tenant, bearer, owner, expected), prefixes)


def request_kind(path: str, doc: Any, service: str = PROVIDER) -> str:
    """`probe` (a local-server probe), `main` (a turn offering tools) or `aux` on a provider; `service` on
    any other service."""
    if service != PROVIDER:
        return "service"
    if path.split("?", 1)[0] in LOCAL_PROBES:
        return "probe"
    return "main" if isinstance(doc, dict) and doc.get("tools") else "aux"


def credential_of(first: dict[str, str], doc: Any, path: str = "", body: bytes = b"",
                  registry: Registry | None = None) -> tuple[str | None, str]:
    """The credential a request presents and where: a key header (`bearer_of`), else a top-level `api_key` or
    `token` field of a JSON body (as Tavily's API takes it), a `token` field of the query or a form body (Slack's
    Web API), or a path segment `bot<TOKEN>` whose token is a secret of `registry` (Telegram's Bot API)."""
    bearer = bearer_of(first)
    if bearer:
        return bearer, next(f"headers.{n}" for n in KEY_HEADERS if first.get(n, "").strip())
    for name in ("api_key", "token"):
        value = doc.get(name) if isinstance(doc, dict) else None
        if isinstance(value, str) and value:
            return value, f"body.{name}"
    target = urllib.parse.urlsplit(path)
    form = body.decode("utf-8", "replace") if "form-urlencoded" in first.get("content-type", "") else ""
    for where, fields in (("path.token", target.query), ("body.token", form)):
        value = next(iter(urllib.parse.parse_qs(fields).get("token", [])), "")
        if value:
            return value, where
    for segment in target.path.split("/"):
        if segment.startswith("bot") and registry is not None and registry.owner_of_key(segment[3:]):
            return segment[3:], "path.bot"
    return None, "headers.authorization"


def credential_in_path(registry: Registry, path: str) -> str | None:
    """A tenant's credential for one of its services that the request's path carries (a Bot API takes its token
    there: `/bot<TOKEN>/getMe`), the first in the path; None when the path holds none. Only credentials count:
    another canary in a path is a leak, which the path's scan reports."""
    found = [(at, value) for t in registry for value in _credentials(t) if (at := path.find(value)) >= 0]
    return min(found)[1] if found else None


def _credentials(t: Tenant) -> set[str]:
    """Every credential a tenant presents to a service: its provider key and each service's."""
    return {t.key, *(value for s in t.services if (value := t.credential(s)))}


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


# --- the request checks ---------------------------------------------------------------------------------------


def check_egress(req: RequestFacts, report: RequestReport) -> None:
    """`egress`: a forward request for a host no tenant owns that went out (`tenancy_egress=flag`), or that the
    proxy refused but that carried a tenant's canary (its `request_leak`s, found before). A refused request
    carrying none left nothing and held nothing of a tenant's: a safety record (`refused`), not a finding."""
    route = req.endpoint.route
    if req.endpoint.owned or route.topology != "forward":
        return
    if req.raw.refused and not any(f.kind == "request_leak" for f in report.findings):
        return
    report.findings.insert(0, Finding(
        kind="egress", victim=None, seen_in=None, canary=None, channel="request", location=req.where,
        evidence=req.matcher.redact_text(f"{req.raw.method} {route.host}{req.raw.path}")[:200],
        detail=f"host {route.host!r} is owned by no tenant" + (" (refused)" if req.raw.refused else ""),
    ))


def check_key(req: RequestFacts, report: RequestReport) -> None:
    """`wrong_key`: a credential that is not the one the tenant must present to this service, or none where
    one is needed (a main turn; a service request that does work, not a GET or HEAD probe)."""
    tenant = req.tenant
    if tenant is None or req.bearer_state == "own":
        return
    needs_credential = req.kind == "main" or (req.service != PROVIDER and req.expected is not None
                                              and req.raw.method.upper() not in ("GET", "HEAD"))
    if req.bearer or needs_credential:
        report.findings.append(_key_finding(req, tenant))


def _key_finding(req: RequestFacts, tenant: Tenant) -> Finding:
    """The `wrong_key` finding of a request that does not present the credential its service needs."""
    provider, bearer, owner, location = req.service == PROVIDER, req.bearer, req.owner, f"{req.where}.{req.held_in}"
    own_kind = "key" if provider else tenant.services[req.service].credential or "key"
    if bearer is None:
        detail = "a main turn carries no key" if provider else f"a {req.service} request carries no credential"
        return Finding("wrong_key", tenant.name, tenant.name, own_kind, "request", location,
                       evidence="no credential header", detail=detail)
    if owner is None:
        return Finding("wrong_key", tenant.name, tenant.name, own_kind, "request", location,
                       evidence=f"Bearer <unknown, {len(bearer)} chars>", detail="unknown bearer")
    canary = next(k for k, v in owner.secrets().items() if v == bearer)
    if req.held_in == "path":
        shown = f"{req.raw.method} {req.raw.path}"
    else:
        field_name = req.held_in.split(".", 1)[1]  # `authorization`, `x-api-key`, `api_key`
        shown = f"Bearer {bearer}" if req.held_in == "headers.authorization" else f"{field_name}: {bearer}"
    if owner is not tenant:
        detail = "bearer is another tenant's secret"
    elif provider:
        detail = "bearer is not the tenant's key"
    else:
        detail = f"bearer is not the tenant's {req.service} credential"
    return Finding("wrong_key", owner.name, tenant.name, canary, "request", location,
                   evidence=req.matcher.redact_text(shown), detail=detail)


def check_model(req: RequestFacts, report: RequestReport) -> None:
    """`wrong_model`: a main turn whose model is not its tenant's (the victim: the model's owner, if any)."""
    tenant, model = req.tenant, req.model
    if tenant is None or req.kind != "main" or model == tenant.model:
        return
    owner = next((t for t in req.registry if model and t.model == model), None)
    report.findings.append(Finding(
        kind="wrong_model", victim=owner.name if owner else tenant.name, seen_in=tenant.name,
        canary="model", channel="request", location=f"{req.where}.body.model",
        evidence=req.matcher.redact_text(f'"model": {json.dumps(model)}'),
        detail=f"main turn model is not {tenant.name}'s model",
    ))


def check_request_leaks(req: RequestFacts, report: RequestReport) -> None:
    """`request_leak`: another tenant's canary in the path, a header or the decoded body (any layer), each
    finding in a chat body given the tool of its message. A canary an earlier check reported at a part of the
    request (a foreign key, a foreign model) is left out there, and so is the credential a refused request to a
    host no tenant routes presents (`refused_credential`)."""
    claimed = {part: frozenset((f.victim, f.canary) for f in report.findings
                               if f.victim and f.canary and f"{f.location}.".startswith(f"{req.where}.{part}."))
               for part in ("path", "headers", "body")}
    if (own := refused_credential(req)) is not None:
        part = req.held_in.split(".", 1)[0]
        claimed[part] |= {own}
    scan = FlowScan(req.matcher, req.raw.flow_id, req.tenant.name if req.tenant else None, "request", "request_leak")
    scan.layered(req.raw.path.encode("utf-8", "surrogateescape"), "request.path", offsets=False, skip=claimed["path"])
    scan.headers(req.raw.headers, "request", claimed["headers"])
    # A chat request resends its whole conversation: only what is new of it is scanned (`harness.detect.prefixes`).
    known = (req.prefixes, f"{req.endpoint.route} {req.service}") if req.prefixes is not None else None
    scan.body(req.decoded, "request.body", claimed["body"], known)
    report.findings += attribute_body(scan.findings, req.decoded.data, req.doc, f"{req.where}.body")
    report.not_inspected += scan.not_inspected


def refused_credential(req: RequestFacts) -> tuple[str, str] | None:
    """(owner, kind) of the credential a refused request to a host no tenant routes presents: a tenant's key
    addressed to a service the audit does not stub (Hermes checks a saved provider key against the provider's
    `/v1/models`). It never left the machine, and the request is no tenant's, so it is recorded (the ledger's
    `bearer_tenant`, the report's warning line), not a leak; any other canary the request carries is."""
    if not req.raw.refused or req.endpoint.owned or req.owner is None or req.bearer is None:
        return None
    return req.owner.name, next(k for k, v in req.owner.secrets().items() if v == req.bearer)


def check_identity(req: RequestFacts, report: RequestReport) -> None:
    """`wrong_identity`: a request leak, to one of the tenant's services, of another tenant's identity there
    (a canary kind the service lists under `identity`: a user id, a workspace, ...): the request acts as them."""
    if req.tenant is None or req.service == PROVIDER:
        return
    identity = req.tenant.services[req.service].identity
    report.findings = [
        replace(f, kind="wrong_identity",
                detail=f"the request names {f.victim}'s {f.canary} to {f.seen_in}'s {req.service} service")
        if f.kind == "request_leak" and f.canary in identity else f
        for f in report.findings
    ]


RequestCheck = Callable[[RequestFacts, RequestReport], None]
#: The checks of what a request presents (credential, model): cheap, they run in the proxy's hook.
IN_PATH_CHECKS: tuple[RequestCheck, ...] = (check_key, check_model)
#: The checks that scan a request's bytes for canaries, and egress (which reads what the scan found): the live
#: addon may run them in a worker process.
SCAN_CHECKS: tuple[RequestCheck, ...] = (check_request_leaks, check_egress, check_identity)
#: Every request check, in the order they run (see the module's docstring for why this order).
REQUEST_CHECKS: tuple[RequestCheck, ...] = IN_PATH_CHECKS + SCAN_CHECKS


# --- the response checks --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResponseFacts:
    """What every response check reads: the flow's tenant (by its request), the headers and the decoded body."""

    matcher: Matcher
    flow_id: str
    tenant: str | None
    headers: Headers
    decoded: Body
    stream: str | None  # `decode.stream_kind`: "sse", "ndjson" or None

    @property
    def streamed(self) -> bool:
        """Whether it is a `text/event-stream` (which the addon streams through)."""
        return self.stream == "sse"


def response_facts(matcher: Matcher, flow_id: str, tenant: str | None, headers: Headers,
                   body: bytes | None) -> ResponseFacts:
    """Decode a response once for every check."""
    first = first_values(headers)
    decoded = decode_body(body, first.get("content-encoding", ""), first.get("transfer-encoding", ""))
    return ResponseFacts(matcher, flow_id, tenant, headers, decoded, stream_kind(first.get("content-type", "")))


def check_response_leaks(resp: ResponseFacts, report: ResponseReport) -> None:
    """`response_leak`: another tenant's canary in a response header or the decoded body (any layer)."""
    scan = FlowScan(resp.matcher, resp.flow_id, resp.tenant, "response", "response_leak")
    scan.headers(resp.headers, "response")
    scan.body(resp.decoded, "response.body")
    report.findings += scan.findings
    report.not_inspected += scan.not_inspected


def check_stream_leaks(resp: ResponseFacts, report: ResponseReport) -> None:
    """`response_leak` in an SSE or NDJSON stream reassembled whole (the strings at one JSON path across its
    events or records, so a canary split over two deltas is whole, in whatever encoding), for each canary not
    already reported. Location `response.sse.PATH` or `response.ndjson.PATH`.

    The body's scan reassembles records too, around the places a value may be cut (`records:PATH`, the engine's
    framing): a canary it found only so is the same text, better located by the stream's field. Its finding is
    replaced, in place, by this check's, so every path that inspects a response reports the one location."""
    if resp.stream is None or resp.decoded.note:
        return
    scan = FlowScan(resp.matcher, resp.flow_id, resp.tenant, "response", "response_leak")
    in_records = {(f.victim, f.canary): i for i, f in enumerate(report.findings)
                  if f.victim and f.canary and _in_body_records(f.location, resp.flow_id)}
    scan.seen.update((f.victim, f.canary) for f in report.findings
                     if f.victim and f.canary and (f.victim, f.canary) not in in_records)
    for path, text in reassembled(resp.decoded.data, resp.stream).items():
        scan.layered(utf8_bytes(text), f"response.{resp.stream}.{path}", only_new=True)
    for finding in scan.findings:
        at = in_records.get((finding.victim, finding.canary))
        if at is None:
            report.findings.append(finding)
        else:
            report.findings[at] = finding
    report.not_inspected += scan.not_inspected


def _in_body_records(location: str, flow_id: str) -> bool:
    """Whether a response finding's `location` is in the records the body's scan reassembled at its top level
    (`flow:ID:response.body@AT:records:PATH@OFFSET`), not in the body's bytes or another layer."""
    rest = location.removeprefix(f"flow:{flow_id}:response.body@")
    return rest != location and rest.lstrip("0123456789").startswith(":records:")


ResponseCheck = Callable[[ResponseFacts, ResponseReport], None]
#: Every response check, in the order they run: the stream's only after the headers' and body's.
RESPONSE_CHECKS: tuple[ResponseCheck, ...] = (check_response_leaks, check_stream_leaks)

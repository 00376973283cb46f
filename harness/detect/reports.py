"""What the inspection of one flow says: its request's and response's reports (whose, which credential and
model, what leaked) and the flow's line in the ledger (`FlowReport.ledger_entry`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.core.findings import Finding
from harness.core.registry import PROVIDER
from harness.detect.engine.hits import NotInspected
from harness.detect.websocket import WebsocketReport


@dataclass
class RequestReport:
    """What one request was: whose, which credential and model, what kind, and what it leaked."""

    tenant: str | None
    route: str
    method: str
    path: str
    kind: str  # "main", "aux" or "probe" (a provider's), "service" (any other service's)
    bearer: str  # see _bearer_state
    bearer_tenant: str | None
    model: str | None
    size: int
    note: str = ""
    findings: list[Finding] = field(default_factory=list)
    not_inspected: list[NotInspected] = field(default_factory=list)
    service: str = PROVIDER  # which of the tenant's services the request went to


@dataclass
class ResponseReport:
    """What came back: status and size (None when the flow failed first), and any foreign canary."""

    status: int | None
    size: int | None
    streamed: bool = False
    error: str | None = None
    note: str = ""
    findings: list[Finding] = field(default_factory=list)
    not_inspected: list[NotInspected] = field(default_factory=list)


@dataclass
class FlowReport:
    """One flow's request and response reports; `ledger_entry()` is its line in the ledger."""

    flow_id: str
    time: float
    host: str
    request: RequestReport
    response: ResponseReport | None = None
    scenario: str | None = None  # the audit's phase the flow happened in (`label`), if known
    phase: str | None = None
    websocket: WebsocketReport | None = None  # the messages of a connection upgraded to a websocket, or of a TCP one
    refused: bool = False  # answered by the proxy without dialling anything (a host no tenant owns, refused)

    @property
    def parts(self) -> list[RequestReport | ResponseReport | WebsocketReport]:
        return [p for p in (self.request, self.response, self.websocket) if p is not None]

    @property
    def findings(self) -> list[Finding]:
        return [f for part in self.parts for f in part.findings]

    def label(self, scenario: str | None, phase: str | None) -> None:
        """Fill in the scenario/phase the flow happened in (what its findings' fingerprints include)."""
        self.scenario, self.phase = scenario, phase
        for part in self.parts:
            part.findings = [f.labelled(scenario, phase) for f in part.findings]

    @property
    def not_inspected(self) -> list[NotInspected]:
        return [n for part in self.parts for n in part.not_inspected]

    def ledger_entry(self) -> dict[str, Any]:
        req, resp = self.request, self.response
        return {
            "time": self.time,
            "flow": self.flow_id,
            "tenant": req.tenant,
            "route": req.route,
            "host": self.host,
            "method": req.method,
            "path": req.path,
            "kind": req.kind,
            "service": req.service,
            "bearer": req.bearer,
            "bearer_tenant": req.bearer_tenant,
            "model": req.model,
            "request_bytes": req.size,
            "status": resp.status if resp else None,
            "response_bytes": resp.size if resp else None,
            "streamed": resp.streamed if resp else False,
            "error": resp.error if resp else None,
            "flagged": bool(self.findings),
            "findings": [f.to_dict() for f in self.findings],
            "scenario": self.scenario,
            "phase": self.phase,
        } | ({"refused": True} if self.refused else {}) | (
            {self.websocket.protocol: self.websocket.ledger_entry()} if self.websocket is not None else {})

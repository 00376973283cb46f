"""Reconcile an audit from its evidence: the saved flow file, the stubs' own record, homes and logs.

Works only from files (flows.mitm, stubs.jsonl, timeline.json, tenant homes, logs), never from the
live run's memory, so `tenancy-audit reconcile` re-verifies any evidence folder anywhere.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mitmproxy import http, tcp
from mitmproxy.flow import Flow

from harness.core.files import SERVICE_RECORDS
from harness.core.findings import Finding, dedupe
from harness.core.protocol import REFUSED_CONNECTION
from harness.core.record import EvidenceError, Phase, RunRecord
from harness.core.registry import PROVIDER, Registry
from harness.detect import file_versions, planted, records, scan, snapshots
from harness.detect.carriers import Conversations
from harness.detect.decode import loads
from harness.detect.engine import stream
from harness.detect.engine.matcher import Matcher, matcher_for
from harness.detect.flowfile import read_flows
from harness.detect.flows import inspect_flow, inspect_tcp_flow, sent_at
from harness.detect.prefixes import Prefixes
from harness.detect.routes import route_of
from harness.detect.tools import Coverage, tool_for_file, written_files


@dataclass(frozen=True)
class LogSource:
    """A log or RPC stream; `owner` None means it serves every tenant (only secrets may not appear)."""

    path: Path
    owner: str | None
    channel: str = "log"


@dataclass(frozen=True)
class Reading:
    """How a reconciliation reads: `empty_ok`, a missing or empty flow file is a reason, not an error (a live run
    whose proxy recorded nothing); the scan `limits`; `folder`, the evidence folder whose service records and kept
    file versions are read too."""

    empty_ok: bool = False
    limits: stream.Limits = stream.DEFAULT_LIMITS
    folder: Path | None = None


@dataclass
class Reconciliation:
    findings: list[Finding] = field(default_factory=list)
    snapshots: dict[str, list[snapshots.EnvSnapshot]] = field(default_factory=dict)
    flows: int = 0
    flows_per_tenant: Counter[str] = field(default_factory=Counter)
    inspected: Counter[str] = field(default_factory=Counter)
    reasons: list[str] = field(default_factory=list)
    coverage: Coverage = field(default_factory=Coverage)
    #: Everything not read to its end (files, layers, bodies); those read in part are also in `reasons`.
    not_inspected: list[stream.NotInspected] = field(default_factory=list)
    #: Requests the proxy refused (hosts no tenant routes, nothing dialled), by host (and whose credential one
    #: presented, if a tenant's).
    refused: Counter[str] = field(default_factory=Counter)

    def skip(self, entries: Sequence[stream.NotInspected], where: str = "") -> None:
        """Record entries not read to their end (`where`: the home or folder their paths are relative to).
        One read in part is a reason; one not read at all (`unreadable`) has its caller's reason already."""
        for n in entries:
            n = replace(n, path=f"{where}/{n.path}" if where else n.path)
            self.not_inspected.append(n)
            if n.partial and not n.reason.startswith("unreadable"):
                self.reasons.append(f"not fully inspected: {n.summary()}")


def _phase_of(t: float, phases: list[Phase]) -> Phase | None:
    return next((p for p in phases if p.start <= t <= p.end), None)


def _phase_before(t: float, phases: list[Phase]) -> Phase | None:
    """The phase `t` is in, else the last one that started before it (a file a phase's turn wrote can
    change in the pause after it)."""
    return _phase_of(t, phases) or max((p for p in phases if p.start <= t), key=lambda p: p.start, default=None)


def _flow_phase(flow: Flow, phases: list[Phase]) -> Phase | None:
    """The phase a flow happened in: the label the live addon stamped on it (`tenancy_phase_file`), so the
    ledger, the flow file and this reconciliation agree on every fingerprint; else its start time."""
    meta = flow.metadata.get("tenancy")
    if isinstance(meta, dict) and "phase" in meta:
        scenario, name = meta.get("scenario"), meta.get("phase")
        return Phase(scenario, name, 0.0, 0.0) if isinstance(scenario, str) and isinstance(name, str) else None
    return _phase_of(flow.request.timestamp_start if isinstance(flow, http.HTTPFlow) else flow.timestamp_created,
                     phases)


def _tag(findings: list[Finding], phase: Phase | None, when: float) -> list[Finding]:
    """The findings labelled with the phase they happened in (where they have none) and stamped with when (the
    order incidents need)."""
    if phase is None:
        return [replace(f, time=when) for f in findings]
    return [replace(f, scenario=f.scenario or phase.scenario, phase=f.phase or phase.name, time=when)
            for f in findings]


def _sent(findings: list[Finding], flow: http.HTTPFlow | tcp.TCPFlow) -> list[Finding]:
    """The findings in a connection's messages stamped with when their message was sent, not when the connection
    opened: what a bot's long-lived connection sends after a crossing is not before it."""
    return [replace(f, time=sent_at(flow, f.location) or f.time) for f in findings]


@dataclass
class Evidence:
    """What one reconciliation reads (see `reconcile`), and what its passes learn for the later ones."""

    registry: Registry
    matcher: Matcher
    flows_path: Path
    homes: dict[str, Path]
    logs: Sequence[LogSource]
    stub_log: Path | None
    expect_snapshots: dict[str, int]
    phases: list[Phase]
    empty_ok: bool
    limits: stream.Limits
    service_records: Path | None
    kept_versions: Path | None
    flow_ids: set[str] = field(default_factory=set)  # every saved flow's id (the bypass check)
    stub_peers: set[int] = field(default_factory=set)  # the ports saved TCP flows reached their stubs from
    written: dict[str, str] = field(default_factory=dict)  # file name -> the tool whose call wrote it
    #: tenant -> the `~/` paths its own provider's replies named (`detect.planted`: the probe's `MEDIA:` lines)
    named: dict[str, set[str]] = field(default_factory=dict)

    def planted_by(self, tenant: str) -> planted.Planted:
        """The paths the tenant's own replies planted, resolved to the homes they are in."""
        return planted.resolve(self.named.get(tenant, ()), self.registry)


def reconcile(registry: Registry, flows_path: Path, *, homes: dict[str, Path] | None = None,
              logs: Sequence[LogSource] = (), stub_log: Path | None = None, record: RunRecord | None = None,
              reading: Reading | None = None) -> Reconciliation:
    """Every invariant over the evidence, one pass per kind of evidence (`PASSES`, in order); findings carry
    the scenario/phase they happened in (`record`: what the run saw live, its phases and the env snapshots its
    turns owe). Whatever was not read to its end is in `not_inspected`; what was read in part makes a reason
    (inconclusive)."""
    record, reading = record or RunRecord(), reading or Reading()
    folder = reading.folder
    ev = Evidence(registry, matcher_for(registry), flows_path, homes or {}, logs, stub_log, record.expect_snapshots,
                  list(record.phases), reading.empty_ok, reading.limits, folder / SERVICE_RECORDS if folder else None,
                  folder)
    rec = Reconciliation()
    for evidence_pass in PASSES:
        evidence_pass(ev, rec)
    rec.findings = dedupe(rec.findings)
    return rec


def _flows(ev: Evidence, rec: Reconciliation) -> None:
    """Every saved flow inspected as the live addon did, the tool calls and env snapshots its main turns
    carry, and the services each tenant used; a finding in another tenant's conversation gets its carrier."""
    others: list[Flow] = []
    flows, truncated = read_flows(ev.flows_path, empty_ok=ev.empty_ok, others=others)
    if truncated:
        rec.reasons.append(truncated)
    for other in others:  # a connection the proxy refused before dialling (a raw stream after a CONNECT)
        server = other.server_conn
        if server.timestamp_start is None and (server.error or "").startswith(REFUSED_CONNECTION) and server.address:
            rec.refused[server.address[0]] += 1
        elif isinstance(other, tcp.TCPFlow) and route_of(other).topology == "reverse":
            _tcp_flow(ev, rec, other)
    rec.flows = len(flows)
    ev.flow_ids = {f.id for f in flows}
    seen_calls: set[tuple[str, str]] = set()
    chats = Conversations()
    known = Prefixes()
    found = len(rec.findings)
    for flow in flows:
        phase = _flow_phase(flow, ev.phases)
        report = inspect_flow(ev.registry, ev.matcher, flow, prefixes=known)
        rec.findings += _sent(_tag(list(report.findings), phase, flow.request.timestamp_start), flow)
        rec.skip(report.not_inspected)
        if report.refused:
            owner = report.request.bearer_tenant
            rec.refused[report.host + (f" with {owner}'s credential" if owner else "")] += 1
        tenant = report.request.tenant
        if tenant is None:
            continue
        if report.request.service != PROVIDER:
            status = flow.response.status_code if flow.response is not None else 0
            rec.coverage.used(phase.scenario if phase else "run", report.request.service, 200 <= status < 400)
        elif isinstance(flow, http.HTTPFlow):
            ev.named.setdefault(tenant, set()).update(planted.reply_paths(flow))
        rec.flows_per_tenant[tenant] += 1
        rec.inspected["request"] += 1
        rec.inspected["response"] += flow.response is not None
        body = _json_body(flow)
        if body is None:
            continue
        chats.add(flow.request.timestamp_start, flow.id, tenant, flow.request.get_content(strict=False) or b"", body)
        if body.get("tools"):
            rec.coverage.add(phase.scenario if phase else "run", body)
            ev.written.update(written_files(body.get("messages") or []))
        for snap in snapshots.extract(ev.registry[tenant], flow.id, body):
            if (snap.tenant, snap.tool_call_id) in seen_calls:
                continue
            seen_calls.add((snap.tenant, snap.tool_call_id))
            rec.snapshots.setdefault(snap.tenant, []).append(snap)
            rec.inspected["env"] += 1
            rec.findings += _tag(snapshots.check(snap, ev.registry, ev.matcher), phase, flow.request.timestamp_start)
    rec.findings[found:] = chats.carried(rec.findings[found:])


def _tcp_flow(ev: Evidence, rec: Reconciliation, flow: tcp.TCPFlow) -> None:
    """A raw TCP connection (a line protocol on a tenant's reverse listener): its messages inspected as the live
    addon did, its service's use counted, and the port it reached its stub from kept for the bypass check."""
    phase = _flow_phase(flow, ev.phases)
    report = inspect_tcp_flow(ev.registry, ev.matcher, flow)
    rec.findings += _sent(_tag(list(report.findings), phase, flow.timestamp_created), flow)
    rec.skip(report.not_inspected)
    if flow.server_conn.sockname:
        ev.stub_peers.add(flow.server_conn.sockname[1])
    if report.request.tenant is not None:
        rec.inspected["tcp"] += 1
        rec.coverage.used(phase.scenario if phase else "run", report.request.service, flow.error is None)


def _stubs(ev: Evidence, rec: Reconciliation) -> None:
    """Every request a stub recorded passed the proxy; the records of the servers not behind it."""
    if ev.stub_log is not None:
        rec.findings += _bypass(ev.stub_log, ev.flow_ids, ev.stub_peers, ev.phases)
    if ev.service_records is not None:
        _records(ev.service_records, ev.registry, ev.matcher, ev.phases, rec)


def _homes(ev: Evidence, rec: Reconciliation) -> None:
    """Every file of every tenant's home as it is at the end."""
    for name, home in ev.homes.items():
        if not home.exists():
            rec.reasons.append(f"home of tenant {name!r} is missing: {home}")
            continue
        others = [h for n, h in ev.homes.items() if n != name]  # where they are now, not where they ran
        result = scan.scan_tree(home, ev.registry, name, exclude=others, matcher=ev.matcher, limits=ev.limits,
                                planted=ev.planted_by(name))
        rec.findings += [replace(f, tool=f.tool or tool_for_file(f.location, ev.written)) for f in result.findings]
        rec.inspected["file"] += result.files
        rec.reasons += [f"unreadable file {p}" for p in result.unreadable]
        rec.skip(result.not_inspected, str(home))


def _versions(ev: Evidence, rec: Reconciliation) -> None:
    """Every version of the home files kept during the run; a canary gone by the end is transient."""
    if ev.kept_versions is None or not ev.homes:
        return
    ends = [f for f in rec.findings if f.channel == "file"]
    try:
        transient, rec.inspected["version"], skipped = file_versions.scan_versions(
            ev.kept_versions, ev.matcher, ev.homes, ends, ev.limits, stretch=lambda t: _phase_before(t, ev.phases),
            planted={name: ev.planted_by(name) for name in ev.homes})
    except ValueError as exc:
        raise EvidenceError(f"versions: {exc}") from None
    rec.findings += [_tag([f], _phase_before(f.time or 0.0, ev.phases), f.time or 0.0)[0] for f in transient]
    rec.skip(skipped)


def _logs(ev: Evidence, rec: Reconciliation) -> None:
    """Every log and RPC stream."""
    for source in ev.logs:
        if source.channel == "rpc":
            try:
                data = source.path.read_bytes()
            except OSError as exc:
                rec.reasons.append(f"log {source.path} unreadable: {exc.strerror}")
                continue
            rec.inspected["rpc"] += 1
            rec.findings += _scan_rpc(data, ev.registry, ev.matcher, source.path.name, ev.phases, rec)
            continue
        log = scan.scan_log(source.path, ev.registry, source.owner, label=source.path.name, matcher=ev.matcher,
                            limits=ev.limits, planted=ev.planted_by(source.owner) if source.owner else frozenset())
        if log.unreadable:
            rec.reasons.append(f"log {source.path} unreadable")
            continue
        rec.inspected["log"] += 1
        rec.findings += log.findings
        rec.skip(log.not_inspected)


def _snapshot_controls(ev: Evidence, rec: Reconciliation) -> None:
    """The env snapshots' positive control (one shows a HERMES_HOME) and their expected number."""
    for name, snaps in rec.snapshots.items():  # the positive control of the path check
        if not any(snapshots.shows_home(s) for s in snaps):
            rec.reasons.append(f"no env snapshot of {name} shows a HERMES_HOME: a wrong home would not be seen")
    for name, wanted in ev.expect_snapshots.items():
        got = len(rec.snapshots.get(name, []))
        if got < wanted:
            rec.findings.append(Finding(
                "shortfall", name, None, None, "env", "run",
                detail=f"{got} env snapshot(s) reached {name}'s provider, expected >= {wanted}",
                scenario=ev.phases[0].scenario if ev.phases else None,
            ))


#: The evidence passes, in order: the flows first (the bypass check needs their ids, the home scan the files
#: tool calls wrote), the home files before their kept versions (a version's canary still there at the end is
#: not transient).
PASSES: tuple[Callable[[Evidence, Reconciliation], None], ...] = (
    _flows, _stubs, _homes, _versions, _logs, _snapshot_controls)


def _scan_rpc(data: bytes, registry: Registry, matcher: Matcher, label: str, phases: list[Phase],
              rec: Reconciliation) -> list[Finding]:
    """An RPC log (JSONL of frames): each tenant's frames may carry no other tenant's canary; frames that
    belong to no session may carry no secret at all."""
    lines = data.decode("utf-8", "replace").splitlines()
    records = []
    bound: dict[str, str] = {}
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut by a killed run
        records.append(record)
        if record.get("dir") == "bind":
            bound[record["frame"]["session_id"]] = record["tenant"]
    findings = []
    for n, record in enumerate(records, 1):
        if record.get("dir") == "bind":
            continue
        frame = record.get("frame")
        sid = ((frame.get("params") or {}).get("session_id") if isinstance(frame, dict) else None)
        owner = record.get("tenant") or bound.get(sid or "")
        if owner is not None and owner not in registry.tenants:
            owner = None
        skipped: list[stream.NotInspected] = []
        hits = scan.scan_text(json.dumps(frame).encode(), registry, owner, label=f"{label}#{n}", channel="rpc",
                              matcher=matcher, not_inspected=skipped)
        when = record.get("t", 0.0)
        findings += _tag(hits, _phase_of(when, phases), when)
        rec.skip(skipped)
    return findings


def _records(folder: Path, registry: Registry, matcher: Matcher, phases: list[Phase],
             rec: Reconciliation) -> None:
    """The records of the servers not behind the proxy (`detect.records`): findings, and their starts and calls
    counted as their service's use."""
    for record in records.read(folder, registry):
        if record.unreadable:
            rec.reasons.append(f"service record {record.path} unreadable: {record.unreadable}")
            continue
        rec.inspected["service_record"] += 1
        skipped: list[stream.NotInspected] = []
        for when, finding in records.check(record, registry, matcher, skipped):
            rec.findings += _tag([finding], _phase_of(when, phases), when)
        rec.skip(skipped)
        for line in record.lines:  # its start (the tenant's Hermes launched it) and every call
            phase = _phase_of(line.time, phases)
            rec.coverage.used(phase.scenario if phase else "run", record.service, True)


def _json_body(flow: http.HTTPFlow) -> dict[str, Any] | None:
    if not flow.request.path.split("?", 1)[0].endswith("/chat/completions"):
        return None
    body = loads(flow.request.get_content(strict=False) or b"{}")
    return body if isinstance(body, dict) else None


def _bypass(stub_log: Path, flow_ids: set[str], peers: set[int], phases: list[Phase]) -> list[Finding]:
    """Every request a stub saw must have passed the proxy: carry the id of a saved flow, or (a line protocol's)
    come from the port of a saved TCP flow's connection to its stub."""
    try:
        lines = stub_log.read_text().splitlines()
    except OSError as exc:
        raise EvidenceError(f"stub log: cannot read {stub_log}: {exc.strerror}") from None
    findings = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            raise EvidenceError(f"stub log: {stub_log} has a line that is not JSON") from None
        if rec.get("flow") in flow_ids or rec.get("peer", -1) in peers:
            continue
        when = rec.get("time", 0.0)
        findings += _tag([Finding(
            "bypass", rec.get("tenant"), None, None, "request", f"stub:{rec.get('tenant')}#{rec.get('seq')}",
            detail=f"{rec.get('method')} {rec.get('path')} reached the stub without passing the proxy",
        )], _phase_of(when, phases), when)
    return findings

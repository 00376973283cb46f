"""The result of one audit (what every report is made from): its incidents, findings grouped by fingerprint, the
who-leaked-into-whom matrix and the terminal summary."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from harness.core.findings import CHANNELS, FINGERPRINT_VERSION, Finding, Verdict
from harness.core.severity import rank, severity
from harness.detect.incidents import Incident, build, spread_counts
from harness.report.documented import documented


@dataclass
class AuditResult:
    """Everything a report needs about one audit."""

    verdict: Verdict
    tenants: list[str]
    scenario: str
    versions: dict[str, str]
    inspected: dict[str, int] = field(default_factory=dict)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    fixed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    snapshots: dict[str, int] = field(default_factory=dict)  # env snapshots per tenant
    #: What was not read to its end: {path, reason, bytes_read, partial} (`stream.NotInspected.to_dict`).
    not_inspected: list[dict[str, Any]] = field(default_factory=list)
    out: Path | None = None  # the evidence folder the reports were written to (not part of findings.json)
    coverage: dict[str, dict[str, str]] = field(default_factory=dict)  # scenario -> tool -> status
    services: dict[str, dict[str, str]] = field(default_factory=dict)  # scenario -> service -> status
    doors: dict[str, str] = field(default_factory=dict)  # front door -> status
    platforms: dict[str, str] = field(default_factory=dict)  # messaging platform adapter -> status
    unset: dict[str, list[str]] = field(default_factory=dict)  # tenant -> the settings it left unset (`--unset`)
    plants: list[str] = field(default_factory=list)  # negative controls planted (a leak is the expected outcome)
    warnings: list[str] = field(default_factory=list)  # e.g. a version-1 baseline
    policy: dict[str, Any] = field(default_factory=dict)  # the isolation policy it was judged by (`Policy.to_dict`)

    @property
    def negative_control(self) -> bool:
        return bool(self.plants)

    @cached_property
    def incidents(self) -> list[IncidentRow]:
        """The incidents of every finding, new, known and allowed: the most severe first, then in evidence order."""
        v = self.verdict
        new = {id(f) for f in v.findings}
        rows = [IncidentRow(i, any(id(f) in new for f in i.findings), documented(i))
                for i in build(v.findings + v.known + v.allowed)]
        return sorted(rows, key=lambda r: rank(r.incident.severity))

    def to_dict(self) -> dict[str, Any]:
        v = self.verdict
        counts = Counter(f.channel for f in v.findings)
        incident_of = {id(f): row.incident.id for row in self.incidents for f in row.incident.findings}
        return {
            "verdict": v.status,
            "exit_code": v.exit_code,
            "scenario": self.scenario,
            "tenants": self.tenants,
            "reasons": v.reasons,
            "counts": {ch: counts.get(ch, 0) for ch in CHANNELS},
            "counts_by_kind": dict(Counter(f.kind for f in v.findings)),
            "inspected": dict(self.inspected),
            "versions": self.versions,
            "seconds": round(self.seconds, 2),
            "snapshots": dict(self.snapshots),
            "not_inspected": list(self.not_inspected),
            "incidents": [{**row.incident.summary(), "new": row.new, "allowed": row.allowed,
                           "documented": row.documented} for row in self.incidents],
            "findings": [{**f.to_dict(), "incident": incident_of[id(f)]} for f in v.findings],
            "known": [{**f.to_dict(), "incident": incident_of[id(f)]} for f in v.known],
            "allowed": [{**f.to_dict(), "incident": incident_of[id(f)]} for f in v.allowed],
            "policy": self.policy,
            "fixed": self.fixed,
            "timeline": self.timeline,
            "coverage": self.coverage,
            "service_coverage": self.services,
            "door_coverage": self.doors,
            "platform_coverage": self.platforms,
            "unset": self.unset,
            "fingerprint_version": FINGERPRINT_VERSION,
            "plants": list(self.plants),
            "warnings": list(self.warnings),
        }


@dataclass
class IncidentRow:
    """An incident as the reports show it: `new` when one of its findings is not in the baseline, `documented`
    the F-numbers of docs/hermes-findings.md it matches (none: a new root cause)."""

    incident: Incident
    new: bool
    documented: list[str]

    @property
    def allowed(self) -> bool:
        """Every finding of it is on a surface the isolation policy shares by design."""
        return all(f.scope for f in self.incident.findings)

    @property
    def label(self) -> str:
        return "allowed" if self.allowed else ",".join(self.documented) or "new"

    def direction(self, arrow: str = "->") -> str:
        """The first hop's victim -> recipient, and how many more directions crossed the same way."""
        f, more = self.incident.first, len(self.incident.directions) - 1
        return f"{f.victim or '-'} {arrow} {f.seen_in or '-'}" + (f" (+{more})" if more else "")

    def spread(self) -> str:
        return ", ".join(f"{ch} {n}" for ch, n in spread_counts(self.incident.spread).items()) or "none"

    def classes(self) -> list[tuple[str, Group]]:
        """Its finding classes, the most severe first, each a `crossing` or `spread` class (as its first one is)."""
        crossing = {id(f) for f in self.incident.crossings}
        return [("crossing" if id(g.first) in crossing else "spread", g) for g in groups(self.incident.findings)]

    def line(self) -> str:
        """The incident on one line: severity, F-numbers (or new), victim -> recipient, entry point (a carrier with
        how many tools it held), the first hop's kind, scenario/phase and location, how many canary kinds, how far
        it spread."""
        i = self.incident
        f = i.first
        where = f"{f.scenario}/{f.phase}" if f.scenario else "-"
        also = [s for s in i.scenarios if s != f.scenario]
        entry = f"{i.entry} ({len(i.tools)} tool(s))" if i.carrier else i.entry
        return (f"{i.severity:<8} {self.label:<7} {self.direction():<20} {entry}: {f.kind} at {where}"
                + (f" (also {', '.join(also)})" if also else "")
                + f", {len(i.canaries)} canary kind(s), first at {f.location}; spread: {self.spread()} [{i.id}]")


@dataclass
class Group:
    """Every occurrence of one finding class (one fingerprint), in the order they were found."""

    findings: list[Finding]

    @property
    def first(self) -> Finding:
        return self.findings[0]

    @property
    def fingerprint(self) -> str:
        return self.first.fingerprint()

    @property
    def count(self) -> int:
        return len(self.findings)

    @property
    def severity(self) -> str:
        return severity(self.first)

    def direction(self) -> str:
        f = self.first
        return f"{f.victim or '-'} -> {f.seen_in or '-'}"

    def line(self) -> str:
        """The class on one line: severity, kind, victim -> carrier, canary, channel, where, count, first location."""
        f = self.first
        where = f"{f.scenario}/{f.phase}" if f.scenario else "-"
        times = f"{self.count}x" if self.count > 1 else "1x"
        return (f"{self.severity:<8} {f.kind}: {self.direction()} {f.canary or '-'} ({f.channel}) {where} {times}, "
                f"first at {f.location} [{self.fingerprint}]")


def groups(findings: list[Finding]) -> list[Group]:
    """Findings grouped by fingerprint, the most severe class first (then the order they were found in)."""
    by_fp: dict[str, Group] = {}
    for f in findings:
        by_fp.setdefault(f.fingerprint(), Group([])).findings.append(f)
    return sorted(by_fp.values(), key=lambda g: rank(g.severity))


def crossing_grid(findings: list[Finding], tenants: list[str]) -> dict[tuple[str, str], Counter[str]]:
    """(victim, seen_in) -> findings per channel: who leaked into whom."""
    cells: dict[tuple[str, str], Counter[str]] = {(v, s): Counter() for v in tenants for s in tenants}
    for f in findings:
        if f.victim in tenants and f.seen_in in tenants:
            cells[(f.victim, f.seen_in)][f.channel] += 1
    return cells


def summary_table(result: AuditResult) -> str:
    """Per tenant: turns ok/failed, env snapshots, findings (as victim or carrier) per channel."""
    cols = ["tenant", "turns ok", "failed", "snapshots", *CHANNELS]
    rows = []
    for t in result.tenants:
        turns = [e for e in result.timeline if e.get("tenant") == t]
        counts = Counter(f.channel for f in result.verdict.findings if t in (f.victim, f.seen_in))
        rows.append([t, sum(1 for e in turns if e.get("ok")), sum(1 for e in turns if not e.get("ok")),
                     result.snapshots.get(t, 0), *(counts.get(ch, 0) for ch in CHANNELS)])
    table = [cols, *rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(cols))]
    lines = ["  ".join([str(row[0]).ljust(widths[0]), *(str(c).rjust(w) for c, w in zip(row[1:], widths[1:],
                                                                                     strict=True))])
             for row in table]
    v = result.verdict
    lines += coverage_lines(result.coverage)
    lines += coverage_lines(result.services, "services")
    lines += coverage_lines({"state": result.doors} if result.doors else {}, "front doors")
    lines += coverage_lines({"state": result.platforms} if result.platforms else {}, "messaging platforms")
    incidents = sum(row.new for row in result.incidents)
    allowed = f", {len(v.allowed)} allowed by the policy {result.policy.get('name')}" if v.allowed else ""
    return "\n".join([*lines, f"verdict {v.status}: {incidents} new incident(s); {len(v.findings)} new, "
                              f"{len(v.known)} known finding(s){allowed}"])


#: The statuses of the coverage tables, as the reports name them (a service a release lacks: `n/a: <why>`).
COVERAGE_STATES = ("driven", "leak", "allowed", "failed", "not offered", "not driven")
DOOR_STATES_TEXT = ("driven: the door's turns ran; leak: a finding came through it; failed: none of its turns ran; "
                    "not driven: this run did not drive it (the option that does follows); out of scope: the audit "
                    "cannot drive it (why follows).")
PLATFORM_STATES_TEXT = ("Every messaging platform adapter of this Hermes. driven: every tenant's bot signed in and "
                        "its steps held; leak: a finding names the platform; failed: a bot never signed in or a "
                        "step failed; not driven: this run did not drive it (the option that does follows); n/a: "
                        "this Hermes cannot run it (the reason names Hermes' extra); out of scope: the audit cannot "
                        "drive it (why follows).")
SERVICE_STATES_TEXT = ("driven: the service answered the tenant's requests; leak: a finding names the service; failed: "
                       "every request was answered with an error; not driven: nothing reached it; n/a: this Hermes "
                       "cannot use it (the reason follows).")


def coverage_tools(coverage: dict[str, dict[str, str]]) -> list[str]:
    """The tools of the coverage table, in battery order."""
    return list(dict.fromkeys(t for row in coverage.values() for t in row))


def coverage_lines(coverage: dict[str, dict[str, str]], head: str = "tools") -> list[str]:
    """A coverage table for the terminal: one line per tool (or service), one column per scenario; a state's
    reason (`out of scope: ...`, `n/a: ...`) is left to the reports."""
    if not coverage:
        return []
    scenarios = list(coverage)
    table = [[head, *scenarios],
             *[[t, *(coverage[sc].get(t, "-").split(":")[0] for sc in scenarios)] for t in coverage_tools(coverage)]]
    widths = [max(len(str(r[i])) for r in table) for i in range(len(table[0]))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]


def reasons_of(coverage: dict[str, dict[str, str]]) -> dict[str, str]:
    """tool (or service) -> the reason its state gives somewhere (`out of scope: WHY`, `n/a: WHY`), once."""
    out: dict[str, str] = {}
    for row in coverage.values():
        for name, state in row.items():
            if ": " in state:
                out.setdefault(name, state.split(": ", 1)[1])
    return out

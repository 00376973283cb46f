"""Evidence reports: findings.json (the contract), report.md, report.html, junit.xml and findings.sarif for CI."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from harness import report_html
from harness.findings import CHANNELS, Finding, Verdict
from harness.registry import RegistryError, load, write_private
from harness.sarif import sarif

#: One JUnit test case per tenant x invariant; a finding fails the invariant it violates.
INVARIANTS = {
    "own key on every request": {"wrong_key"},
    "own model on every main turn": {"wrong_model"},
    "no foreign canary in requests": {"request_leak", "egress"},
    "no foreign canary in responses": {"response_leak"},
    "tool env and cwd are its own": {"env_leak", "wrong_cwd"},
    "no foreign canary in its files": {"file_leak"},
    "no secret in logs and streams": {"text_leak"},
    "routes open only to their own key": {"route_auth"},
    "profile settings stay its own": {"profile_bleed"},
    "every request passed the proxy": {"bypass"},
    "enough traffic to conclude": {"shortfall"},
}


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

    def to_dict(self) -> dict[str, Any]:
        v = self.verdict
        counts = Counter(f.channel for f in v.findings)
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
            "findings": [f.to_dict() for f in v.findings],
            "known": [f.to_dict() for f in v.known],
            "fixed": self.fixed,
            "timeline": self.timeline,
        }


def matrix(findings: list[Finding], tenants: list[str]) -> dict[tuple[str, str], Counter[str]]:
    """(victim, seen_in) -> findings per channel: who leaked into whom."""
    cells: dict[tuple[str, str], Counter[str]] = {(v, s): Counter() for v in tenants for s in tenants}
    for f in findings:
        if f.victim in tenants and f.seen_in in tenants:
            cells[(f.victim, f.seen_in)][f.channel] += 1
    return cells


def markdown(result: AuditResult) -> str:
    v = result.verdict
    lines = [
        f"# tenancy-audit: **{v.status.upper()}**",
        "",
        f"Scenario `{result.scenario}`, tenants {', '.join(f'`{t}`' for t in result.tenants)}; "
        + ", ".join(f"{k} {val}" for k, val in result.versions.items()) + f"; {result.seconds:.1f} s.",
        "",
    ]
    if v.reasons:
        lines += ["## Why the run is not conclusive", "", *[f"- {r}" for r in v.reasons], ""]
    lines += ["## Who leaked into whom", "", "| canary of \\ seen in | " + " | ".join(result.tenants) + " |",
              "|---" * (len(result.tenants) + 1) + "|"]
    cells = matrix(v.findings, result.tenants)
    for victim in result.tenants:
        row = []
        for seen in result.tenants:
            c = cells[(victim, seen)]
            row.append("-" if victim == seen else (", ".join(f"{ch} {n}" for ch, n in sorted(c.items())) or "0"))
        lines.append(f"| {victim} | " + " | ".join(row) + " |")
    lines += ["", f"## Findings ({len(v.findings)} new, {len(v.known)} known)", ""]
    if not v.findings:
        lines.append("None.")
    for f in v.findings:
        lines += [f"- **{f.kind}** {f.summary()}", f"  - evidence: `{f.evidence.replace('`', "'")}`"]
    if v.known:
        lines += ["", "### Known (in the baseline)", "", *[f"- {f.summary()}" for f in v.known]]
    if result.fixed:
        lines += ["", "### Fixed (in the baseline, no longer seen)", "", *[f"- `{fp}`" for fp in result.fixed]]
    lines += ["", "## Inspected", "", *[f"- {k}: {n}" for k, n in sorted(result.inspected.items())]]
    if result.timeline:
        lines += ["", "## Timeline", "", "| phase | tenant | driver | ok | seconds | detail |", "|---" * 6 + "|"]
        lines += [f"| {e.get('phase', '')} | {e.get('tenant', '')} | {e.get('driver', '')} | {e.get('ok', '')} "
                  f"| {e.get('seconds', '')} | {str(e.get('detail', '')).replace('|', '/')} |" for e in result.timeline]
    return "\n".join(lines) + "\n"


def junit(result: AuditResult) -> str:
    cases = []
    failures = 0
    for tenant in result.tenants:
        for name, kinds in INVARIANTS.items():
            hits = [f for f in result.verdict.findings if f.kind in kinds and tenant in (f.victim, f.seen_in)]
            body = ""
            if hits:
                failures += 1
                text = "\n".join(f.summary() for f in hits)
                body = f"<failure message={quoteattr(f'{len(hits)} finding(s)')}>{escape(text)}</failure>"
            cases.append(f'  <testcase classname={quoteattr(f"tenancy.{tenant}")} name={quoteattr(name)}>'
                         f"{body}</testcase>")
    if result.verdict.status == "inconclusive":
        failures += 1
        why = escape("\n".join(result.verdict.reasons) or "inconclusive")
        cases.append(f'  <testcase classname="tenancy.run" name="run is conclusive"><failure message="inconclusive">'
                     f"{why}</failure></testcase>")
    header = (f'<testsuite name={quoteattr(f"tenancy-audit {result.scenario}")} tests="{len(cases)}" '
              f'failures="{failures}" time="{result.seconds:.2f}">')
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + header + "\n" + "\n".join(cases) + "\n</testsuite>\n"


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
    return "\n".join([*lines, f"verdict {v.status}: {len(v.findings)} new, {len(v.known)} known finding(s)"])


def evidence_homes(out: Path) -> dict[str, str]:
    """Tenant -> its home relative to the evidence folder (from registry.yaml there, when it has one)."""
    try:
        registry = load(out / "registry.yaml")
    except RegistryError:
        return {}
    root = out.resolve()
    return {t.name: Path(t.home).resolve().relative_to(root).as_posix() for t in registry
            if t.home and Path(t.home).resolve().is_relative_to(root)}


def write_reports(out: Path, result: AuditResult) -> None:
    """findings.json, report.md, report.html, junit.xml and findings.sarif, each 0600 and written atomically."""
    write_private(out / "findings.json", json.dumps(result.to_dict(), indent=2).encode())
    write_private(out / "report.md", markdown(result).encode())
    write_private(out / "report.html", report_html.render(result).encode())
    write_private(out / "junit.xml", junit(result).encode())
    doc = sarif(result, out, evidence_homes(out))
    write_private(out / "findings.sarif", json.dumps(doc, indent=2).encode())

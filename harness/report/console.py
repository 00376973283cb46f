"""What the command line prints: a result, findings, a release matrix, a baseline's entries and a verification,
line by line (findings.json, report.md and matrix.md have every class and occurrence)."""

from __future__ import annotations

from typing import Any

from harness.core.findings import Finding
from harness.core.severity import docs_url
from harness.detect.engine.stream import NotInspected
from harness.report.attestation import Verification
from harness.report.matrix import NA, cell_text, wilson
from harness.report.result import AuditResult, groups


def finding_lines(findings: list[Finding]) -> list[str]:
    """One line per finding class (fingerprint), the most severe first; findings.json has every occurrence."""
    return [g.line() for g in groups(findings)]


def not_inspected_lines(entries: list[NotInspected]) -> list[str]:
    return [f"not inspected: {n.summary()}" + (" [read in part]" if n.partial else "") for n in entries]


def result_lines(result: AuditResult) -> list[str]:
    """One line per new incident, then what the baseline knows, why the run is not conclusive, and the verdict."""
    v = result.verdict
    new = [row for row in result.incidents if row.new]
    lines = [row.line() for row in new]
    if v.findings:
        lines.append(f"{len(v.findings)} new finding(s) in {len(groups(v.findings))} class(es) under {len(new)} "
                     "incident(s): every class and occurrence is in report.md and findings.json")
    if v.known:
        lines.append(f"known: {len(v.known)} finding(s) in {len(groups(v.known))} class(es), "
                     f"{sum(not row.new and not row.allowed for row in result.incidents)} incident(s) known to the "
                     "baseline (reported, not failing)")
    lines += [f"inconclusive: {reason}" for reason in v.reasons]
    lines += [f"not inspected: {n['path']}: {n['reason']} ({n['bytes_read']} bytes read)"
              + (" [read in part]" if n["partial"] else "") for n in result.not_inspected]
    lines += [f"warning: {warning}" for warning in result.warnings]
    control = "; negative control (planted: " + ", ".join(result.plants) + ")" if result.plants else ""
    lines.append(f"verdict: {v.status} ({len(new)} new incident(s); {len(v.findings)} new in "
                 f"{len(groups(v.findings))} class(es), {len(v.known)} known, {result.inspected.get('flows', 0)} "
                 f"flows{control})")
    if result.out is not None:
        lines.append(f"evidence: {result.out}")
    if v.findings or v.known:
        lines.append(f"what each finding means and how to fix it: {docs_url()}")
    return lines


def matrix_lines(doc: dict[str, Any]) -> list[str]:
    """One line per incident (`seen k/N ...` per release; an n/a's reason, and every finding class, are in
    matrix.md), then the verdict."""
    releases = doc["plan"]["releases"]

    def text(cell: dict[str, Any]) -> str:
        return NA if cell["state"] == NA else cell_text(cell)

    lines = []
    for row in doc["incidents"]:
        where = f"{row['scenario']}/{row['phase']}" if row["scenario"] else "-"
        cells = "; ".join(f"{r}: {text(row['cells'][r])}" if len(releases) > 1 else text(row["cells"][r])
                          for r in releases)
        lines.append(f"{row['severity']:<8} {','.join(row['documented']) or 'new':<7} {row['audit']} {row['entry']}: "
                     f"{row['kinds'][0]} {row['victim'] or '-'} -> {row['seen_in'] or '-'} at {where}: {cells} "
                     f"[{row['id']}]")
    lines.append(f"verdict: {doc['status']} ({len(doc['incidents'])} incident(s), {len(doc['rows'])} class(es) over "
                 f"{len(doc['cells'])} run(s); every class is in matrix.md)")
    return lines


def baseline_lines(incidents: list[dict[str, Any]]) -> list[str]:
    """One line per baseline incident: how often it was seen, its F-numbers, entry point and hops, its id."""
    lines = []
    for i in incidents:
        k, n = i["seen"], i["runs"]
        rate = cell_text({"state": "seen", "seen": k, "runs": n, "interval": list(wilson(k, n)) if n > 1 else None})
        hops = ", ".join(h["hop"].split(" | ", 1)[1] + (f" {h['seen']}/{n}" if h["seen"] < n else "")
                         for h in i["hops"])
        lines.append(f"{rate}: {','.join(i['documented']) or 'new'} {i['entry']}: {hops}; {len(i['classes'])} "
                     f"class(es) [{i['id']}]")
    return lines


def patch_check_lines(doc: dict[str, Any]) -> list[str]:
    """What `patch-check` prints: each documented finding's fate, then every removed and new crossing."""
    verdicts = ", ".join(f"{name} {v}" for name, v in doc["verdicts"].items())
    on = "".join(f" on {p}" for p in doc.get("on") or [])
    lines = [f"patch-check {doc['patch']}{on} ({doc['scenario']}): {verdicts}"]
    lines += [f"  {number:<4} {fate}" for number, fate in doc["documented"].items()]
    lines += [f"removed  {h}  [{', '.join(ns) or 'new'}]" for h, ns in doc["removed"].items()]
    lines += [f"varied   {h}  [{', '.join(ns)}]" for h, ns in doc["varied"].items()]
    lines += [f"NEW      {h}  [{', '.join(ns) or 'new'}]" for h, ns in doc["new"].items()]
    return [*lines, f"{len(doc['removed'])} crossing(s) removed, {len(doc['remaining'])} remaining, "
                    f"{len(doc['varied'])} varied (spread of a finding both runs show), {len(doc['new'])} new"]


def mutant_lines(doc: dict[str, Any]) -> list[str]:
    """What `mutants` prints: one line per mutant (its state, surface and the bug it reintroduces, or why it is not
    applicable), then the tally."""
    rows = doc["mutants"]
    lines = [f"{state:<15} {r['name']:<20} {r['surface']:<18} {why or r['bug']}"
             for r in rows for state, _, why in [r["state"].partition(": ")]]
    counts = {s: sum(r["state"].startswith(s) for r in rows) for s in ("caught", "missed", "not exercised",
                                                                        "not applicable")}
    on = f", on the twin of {doc['series']}" if doc.get("series") else ""
    return [*lines, f"mutants ({doc['scenario']}{on}, control {doc['control']}): "
                    + ", ".join(f"{n} {s}" for s, n in counts.items())]


def verify_lines(folder: str, v: Verification) -> list[str]:
    """What failed, one line each (the file, the signature, the verdict, incidents or fingerprints), then one line
    saying what was verified or that it was not."""
    rec = v.recorded
    made = f"tenancy-audit {(rec.get('versions') or {}).get('tenancy-audit')}"
    if v.problems:
        return [*v.problems, f"verify: {folder} does NOT verify ({len(v.problems)} problem(s); manifest of {made}, "
                             f"signature {v.signature})"]
    what = (f"verdict {rec['verdict']}, {len(rec['incidents'])} incident(s) and the fingerprints reproduced"
            if v.reconciled else f"the reports of {rec.get('reports_of', 'another folder')}: verify that "
            "evidence folder to reproduce them")
    return [f"verify: {folder} verified: {v.files} file(s) as recorded, signature {v.signature}, {what} "
            f"(manifest of {made})"]

"""report.md: the audit as Markdown (verdict, matrix, findings, timeline)."""

from __future__ import annotations

from harness.report.result import AuditResult, matrix


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
    if result.not_inspected:
        lines += ["", f"## Not inspected ({len(result.not_inspected)})", "",
                  "| path | reason | bytes read | read in part |", "|---" * 4 + "|"]
        lines += [f"| `{n['path']}` | {n['reason'].replace('|', '/')} | {n['bytes_read']} | "
                  f"{'yes (inconclusive)' if n['partial'] else 'no'} |" for n in result.not_inspected]
    if result.timeline:
        lines += ["", "## Timeline", "", "| phase | tenant | driver | ok | seconds | detail |", "|---" * 6 + "|"]
        lines += [f"| {e.get('phase', '')} | {e.get('tenant', '')} | {e.get('driver', '')} | {e.get('ok', '')} "
                  f"| {e.get('seconds', '')} | {str(e.get('detail', '')).replace('|', '/')} |" for e in result.timeline]
    return "\n".join(lines) + "\n"

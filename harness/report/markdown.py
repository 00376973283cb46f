"""report.md: the audit as Markdown (verdict, incidents, matrix, finding classes with their occurrences folded,
timeline).

GitHub renders it (pull requests, `$GITHUB_STEP_SUMMARY`), including the `<details>` that fold each class's
occurrences."""

from __future__ import annotations

from harness.core.findings import Finding
from harness.core.severity import docs_url
from harness.report.result import (
    DOOR_STATES_TEXT,
    PLATFORM_STATES_TEXT,
    SERVICE_STATES_TEXT,
    AuditResult,
    Group,
    IncidentRow,
    coverage_tools,
    crossing_grid,
    groups,
    reasons_of,
)


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return "`" + text.replace("`", "'") + "`"


def _coverage_table(coverage: dict[str, dict[str, str]], what: str) -> list[str]:
    """One row per tool (or service), one column per scenario, and why where a state has a reason."""
    scenarios, reasons = list(coverage), reasons_of(coverage)
    lines = [f"| {what} | " + " | ".join(scenarios) + " | why |", "|---" * (len(scenarios) + 2) + "|"]
    for name in coverage_tools(coverage):
        states = [coverage[sc].get(name, "-").split(": ")[0] for sc in scenarios]
        lines.append(f"| `{name}` | " + " | ".join(states) + f" | {_cell(reasons.get(name, ''))} |")
    return lines


def _policy(result: AuditResult) -> list[str]:
    """What the isolation policy shares by design, and how many findings it allowed."""
    shared = result.policy.get("shared") or []
    if not shared:
        return [f"Isolation policy `{result.policy.get('name', 'strict')}`: nothing is shared by design.", ""]
    allowed = len(result.verdict.allowed)
    lines = [f"## Allowed by the isolation policy `{result.policy['name']}` ({allowed} findings)", "",
             "Surfaces shared between tenants by design: a finding there (and every copy its crossing explains) is "
             "`allowed`, listed with the incidents, never failing the run. `--policy strict` treats them as leaks.",
             "", "| surface | from -> to | why | source |", "|---|---|---|---|"]
    for e in shared:
        surface = next(f"{k} `{e[k]}`" for k in ("tool", "service", "channel") if k in e)
        lines.append(f"| {surface} | {e['from']} -> {e['to']} | {_cell(e['why'])} | {_cell(e['source'])} |")
    return [*lines, ""]


def _banner(result: AuditResult) -> list[str]:
    v = result.verdict
    lines = [f"# tenancy-audit: **{v.status.upper()}**", ""]
    if result.negative_control:
        lines += [f"> **Negative control**: planted {', '.join(result.plants)}; a leak is the expected outcome.", ""]
    if v.known:
        lines += [f"> {len(v.known)} known finding(s) in {len(groups(v.known))} class(es) are listed in the "
                  "baseline: reported below, not failing the run.", ""]
    return lines


def _matrix(result: AuditResult) -> list[str]:
    v = result.verdict
    new, known = crossing_grid(v.findings, result.tenants), crossing_grid(v.known, result.tenants)
    lines = ["## Who leaked into whom", "",
             "Row: whose canary or key. Column: whose channel carried it. New findings per channel; known ones "
             "(in the baseline) in parentheses.", "",
             "| canary of \\ seen in | " + " | ".join(result.tenants) + " |", "|---" * (len(result.tenants) + 1) + "|"]
    for victim in result.tenants:
        row = []
        for seen in result.tenants:
            if victim == seen:
                row.append("-")
                continue
            c, k = new[(victim, seen)], sum(known[(victim, seen)].values())
            text = ", ".join(f"{ch} {n}" for ch, n in sorted(c.items())) or "0"
            row.append(text + (f" ({k} known)" if k else ""))
        lines.append(f"| {victim} | " + " | ".join(row) + " |")
    return lines


def _incidents(rows: list[IncidentRow]) -> list[str]:
    """One row per incident, then each one's first hop, directions and classes (crossing or spread) folded."""
    lines = ["| severity | documented | status | victim → recipient | entry point | first hop | canary kinds | spread "
             "| incident |", "|---" * 9 + "|"]
    for row in rows:
        i, f = row.incident, row.incident.first
        where = f"{f.scenario}/{f.phase}" if f.scenario else "-"
        status = "failing" if row.new else "known"
        lines.append(f"| {i.severity} | {row.label} | {status} | {_cell(row.direction('→'))} | `{_cell(i.entry)}` | "
                     f"{f.kind} at {_cell(where)}, {_code(f.location)} | {len(i.canaries)} | {_cell(row.spread())} "
                     f"| `{i.id}` |")
    lines.append("")
    for row in rows:
        i = row.incident
        lines += [f"<details><summary><code>{i.id}</code> {row.label}: {i.entry}, {len(i.crossings)} crossing(s), "
                  f"{len(i.spread)} spread</summary>", "", f"- first hop: {_occurrence(i.first)[2:]}",
                  "- directions: " + ", ".join(f"{v or '-'} → {r or '-'}" for v, r in i.directions),
                  "- scenarios: " + (", ".join(i.scenarios) or "-"),
                  "- canary kinds: " + (", ".join(i.canaries) or "-"),
                  *([f"- tools it carried: {', '.join(i.tools)}"] if i.carrier else []), ""]
        lines += [f"- {role}: {_code(g.line())}" for role, g in row.classes()]
        lines += ["", "</details>", ""]
    return lines


def _occurrence(f: Finding) -> str:
    enc = f" [{f.encoding}]" if f.encoding and f.encoding != "plain" else ""
    detail = f" {f.detail}" if f.detail else ""
    evidence = f" evidence {_code(f.evidence)}" if f.evidence else ""
    tool = f" (tool `{f.tool}`)" if f.tool else ""
    return f"- {_code(f.location)}{enc}{tool}{evidence}{_cell(detail)}"


def _classes(found: list[Group]) -> list[str]:
    lines = ["| severity | kind | victim → carrier | canary | channel | scenario/phase | count | first location "
             "| fingerprint |", "|---" * 9 + "|"]
    for g in found:
        f = g.first
        where = f"{f.scenario}/{f.phase}" if f.scenario else "-"
        lines.append(f"| {g.severity} | [{f.kind}]({docs_url(f.kind)}) | {_cell(g.direction())} | {f.canary or '-'} "
                     f"| {f.channel} | {_cell(where)} | {g.count} | {_code(f.location)} | `{g.fingerprint}` |")
    lines.append("")
    for g in found:
        lines += [f"<details><summary><code>{g.fingerprint}</code> {g.first.kind}: {g.direction()} "
                  f"{g.first.canary or '-'}, {g.count} occurrence(s)</summary>", ""]
        lines += [_occurrence(f) for f in g.findings]
        lines += ["", "</details>", ""]
    return lines


def markdown(result: AuditResult) -> str:
    v = result.verdict
    lines = [
        *_banner(result),
        f"Scenario `{result.scenario}`, tenants {', '.join(f'`{t}`' for t in result.tenants)}; "
        + ", ".join(f"{k} {val}" for k, val in result.versions.items()) + f"; {result.seconds:.1f} s.",
        "",
    ]
    if v.reasons:
        lines += ["## Why the run is not conclusive", "", *[f"- {r}" for r in v.reasons], ""]
    if result.warnings:
        lines += ["## Warnings", "", *[f"- {w}" for w in result.warnings], ""]
    new, allowed = sum(row.new for row in result.incidents), sum(row.allowed for row in result.incidents)
    lines += [f"## Incidents ({new} new, {len(result.incidents) - new - allowed} known, {allowed} allowed)", "",
              "Each incident is where a tenant's data first crossed into another tenant's context through one entry "
              "point (its first hop), with every copy that crossing explains (its spread); `documented` names the "
              f"finding of docs/hermes-findings.md it matches. The rule: [docs/findings.md]({docs_url('incidents')}).",
              ""]
    lines += _incidents(result.incidents) if result.incidents else ["None.", ""]
    lines += _policy(result)
    if result.unset:
        lines += ["## Tenants that differ", "", "Settings a tenant left unset while the other tenants set them "
                  "(`--unset`): whatever it then did with another tenant's value is among the findings.", "",
                  *(f"- `{t}`: {', '.join(f'`{s}`' for s in settings)}" for t, settings in result.unset.items()), ""]
    lines += _matrix(result)
    if result.coverage:
        lines += ["", "## Tool coverage", "", "What each scenario drove: `driven` (a call's result came back), `leak` "
                  "(a finding came through the tool), `failed` (every call answered with an error), `not offered` "
                  "(this Hermes does not offer the tool there), `out of scope` (offered, not driven: the reason is "
                  "in the last column).", "", *_coverage_table(result.coverage, "tool")]
    if result.services:
        lines += ["", "## Service coverage", "", SERVICE_STATES_TEXT, "", *_coverage_table(result.services, "service")]
    if result.doors:
        lines += ["", "## Front-door coverage", "", DOOR_STATES_TEXT, "",
                  *_coverage_table({"state": result.doors}, "front door")]
    if result.platforms:
        lines += ["", "## Messaging-platform coverage", "", PLATFORM_STATES_TEXT, "",
                  *_coverage_table({"state": result.platforms}, "platform")]
    new, known = groups(v.findings), groups(v.known)
    lines += ["", f"## Findings ({len(v.findings)} new in {len(new)} class(es), {len(v.known)} known)", "",
              f"What each kind means and how to fix it: [docs/findings.md]({docs_url()}).", ""]
    lines += _classes(new) if new else ["None.", ""]
    if known:
        lines += ["### Known (in the baseline, not failing)", "", *_classes(known)]
    if result.fixed:
        lines += ["### Fixed (in the baseline, no longer seen)", "", *[f"- `{fp}`" for fp in result.fixed], ""]
    lines += ["## Inspected", "", *[f"- {k}: {n}" for k, n in sorted(result.inspected.items())]]
    if result.not_inspected:
        lines += ["", f"## Not inspected ({len(result.not_inspected)})", "",
                  "| path | reason | bytes read | read in part |", "|---" * 4 + "|"]
        lines += [f"| `{n['path']}` | {n['reason'].replace('|', '/')} | {n['bytes_read']} | "
                  f"{'yes (inconclusive)' if n['partial'] else 'no'} |" for n in result.not_inspected]
    if result.timeline:
        lines += ["", "## Timeline", "", "| phase | tenant | driver | ok | seconds | detail |", "|---" * 6 + "|"]
        lines += [f"| {e.get('phase', '')} | {e.get('tenant', '')} | {e.get('driver', '')} | {e.get('ok', '')} "
                  f"| {e.get('seconds', '')} | {_cell(e.get('detail', ''))} |" for e in result.timeline]
    return "\n".join(lines) + "\n"

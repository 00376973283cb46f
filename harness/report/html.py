"""report.html: one self-contained page (inline CSS, no script, no external resource) for humans.

Verdict banner (saying when the run is a negative control, and how many known findings the baseline
covers), the incidents (first hop, spread, documented finding; their classes folded), the tenant x tenant
matrix (whose canary was seen in whose channel: new findings per channel, known ones in grey), one row per
finding class (fingerprint) with its occurrences folded in `<details>`, and the scenario timeline. Each kind
links to its remediation in docs/findings.md.
"""

from __future__ import annotations

from html import escape

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

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
main{max-width:1100px;margin:0 auto;padding:0 24px 48px}
.banner{padding:22px 24px;color:#fff;font-size:15px}
.banner h1{margin:0 0 4px;font-size:26px;letter-spacing:.02em}
.clean{background:#1f7a3d}.leak{background:#b3261e}.inconclusive{background:#9a6700}
h2{margin:28px 0 10px;font-size:18px}
table{border-collapse:collapse;background:#fff;width:100%;margin:4px 0}
th,td{border:1px solid #d5d9e0;padding:6px 9px;text-align:left;vertical-align:top}
th{background:#eceff4;font-weight:600}
table.matrix{width:auto}
.matrix td{min-width:110px;text-align:center}
.matrix td.self{background:#eceff4;color:#8a93a3}
.matrix td.hit{background:#fde4e1;color:#8c1d18;font-weight:600}
.matrix td.zero{color:#1f7a3d}
.matrix small{display:block;font-weight:400}
.matrix td.known-only{background:#eef0f3;color:#6b7383}
.matrix small.known,tr.known td{color:#8a93a3}
.banner .note{margin-top:6px;font-weight:600}
.sev{font-weight:600;text-transform:uppercase;font-size:11px;letter-spacing:.04em;white-space:nowrap}
.sev.critical{color:#8c1d18}.sev.high{color:#b3261e}.sev.medium{color:#9a6700}.sev.low{color:#6b7383}
details summary{cursor:pointer;color:#394150}
details table{margin-top:6px}
a{color:#1b4f9c}
code{font:12px/1.4 ui-monospace,monospace;background:#f0f2f5;padding:1px 4px;border-radius:3px;word-break:break-all}
.kind,.fp{font-weight:600;white-space:nowrap}
.muted{color:#6b7383}
ul.reasons{margin:8px 0 0;padding-left:20px}
#coverage td,#service-coverage td,#door-coverage td{text-align:center}
td.driven{color:#1f7a3d}td.leak{background:#fde4e1;color:#8c1d18;font-weight:600}
td.failed{background:#fff4d6;color:#9a6700}td.not-offered,td.not-driven,td.na{color:#8a93a3}
"""


def _cell(victim: str, seen: str, counts: dict[str, int], known: int) -> str:
    total = sum(counts.values())
    attrs = f'data-victim="{escape(victim)}" data-seen-in="{escape(seen)}" data-count="{total}" data-known="{known}"'
    grey = f'<small class="known">+{known} known</small>' if known else ""
    if not total:
        return f'<td class="{"known-only" if known else "zero"}" {attrs}>0{grey}</td>'
    per = ", ".join(f"{escape(ch)} {n}" for ch, n in sorted(counts.items()))
    return f'<td class="hit" {attrs}>{total}<small>{per}</small>{grey}</td>'


def _matrix(result: AuditResult) -> str:
    v = result.verdict
    cells, known = crossing_grid(v.findings, result.tenants), crossing_grid(v.known, result.tenants)
    head = "".join(f"<th>{escape(t)}</th>" for t in result.tenants)
    rows = []
    for victim in result.tenants:
        tds = ['<td class="self">-</td>' if victim == seen else
               _cell(victim, seen, dict(cells[(victim, seen)]), sum(known[(victim, seen)].values()))
               for seen in result.tenants]
        rows.append(f"<tr><th>{escape(victim)}</th>{''.join(tds)}</tr>")
    outside = sum(1 for f in v.findings if f.victim not in result.tenants or f.seen_in not in result.tenants)
    note = (f'<p class="muted">{outside} finding(s) not between two tenants (egress, bypass, shortfall, logs '
            "serving every tenant): see below.</p>") if outside else ""
    return (f'<table class="matrix" id="matrix"><tr><th>canary of \\ seen in</th>{head}</tr>'
            f"{''.join(rows)}</table>{note}")


def _occurrences(g: Group) -> str:
    rows = []
    for f in g.findings:
        enc = f" [{escape(f.encoding)}]" if f.encoding and f.encoding != "plain" else ""
        detail = f"<div>{escape(f.detail)}</div>" if f.detail else ""
        evidence = f"<code>{escape(f.evidence)}</code>" if f.evidence else ""
        rows.append(f"<tr><td><code>{escape(f.location)}</code>{enc}</td><td>{evidence}{detail}</td></tr>")
    return (f"<details><summary>{g.count} occurrence(s)</summary><table class=occurrences><tr>"
            f"<th>pointer (flow id / file@offset)</th><th>evidence (redacted)</th></tr>{''.join(rows)}</table>"
            "</details>")


def _findings(findings: list[Finding], table_id: str) -> str:
    """One row per finding class (fingerprint), the most severe first; its occurrences folded below it."""
    if not findings:
        return '<p class="muted">None.</p>'
    rows = []
    for g in groups(findings):
        f = g.first
        where = f"{f.scenario}/{f.phase}" if f.scenario else "-"
        kind = f'<a href="{escape(docs_url(f.kind))}">{escape(f.kind)}</a>'
        tool = f"<div>tool <code>{escape(f.tool)}</code></div>" if f.tool else ""
        rows.append(f'<tr class="{"known" if table_id == "known" else "new"}" data-fingerprint="{g.fingerprint}" '
                    f'data-severity="{g.severity}" data-count="{g.count}">'
                    f'<td class="sev {g.severity}">{g.severity}</td><td class="kind">{kind}{tool}</td>'
                    f"<td>{escape(f.victim or '-')} &rarr; {escape(f.seen_in or '-')}</td>"
                    f"<td>{escape(f.canary or '-')}</td><td>{escape(f.channel)}</td><td>{escape(where)}</td>"
                    f"<td>{g.count}</td><td><code>{escape(f.location)}</code>{_occurrences(g)}</td>"
                    f"<td><code class='fp'>{g.fingerprint}</code></td></tr>")
    return (f'<table id="{table_id}"><tr><th>severity</th><th>kind</th><th>victim &rarr; carrier</th><th>canary</th>'
            "<th>channel</th><th>scenario/phase</th><th>count</th><th>first location, then every occurrence</th>"
            f"<th>fingerprint</th></tr>{''.join(rows)}</table>")


def _incident_details(row: IncidentRow) -> str:
    i = row.incident
    directions = ", ".join(f"{escape(v or '-')} &rarr; {escape(r or '-')}" for v, r in i.directions)
    classes = "".join(f"<tr><td>{role}</td><td><code>{escape(g.line())}</code></td></tr>" for role, g in row.classes())
    return (f"<details><summary>{len(i.crossings)} crossing(s), {len(i.spread)} spread</summary>"
            f"<div>directions: {directions}</div><div>scenarios: {escape(', '.join(i.scenarios) or '-')}</div>"
            f"<div>canary kinds: {escape(', '.join(i.canaries) or '-')}</div>"
            + (f"<div>tools it carried: {escape(', '.join(i.tools))}</div>" if i.carrier else "")
            + f"<table class=classes><tr><th>role</th><th>class</th></tr>{classes}</table></details>")


def _incidents(result: AuditResult) -> str:
    """One row per incident, the most severe first: its first hop, reach and spread; its classes folded."""
    if not result.incidents:
        return '<p class="muted">None.</p>'
    rows = []
    for row in result.incidents:
        i, f = row.incident, row.incident.first
        where = f"{f.scenario}/{f.phase}" if f.scenario else "-"
        evidence = f"<div><code>{escape(f.evidence)}</code></div>" if f.evidence else ""
        state = "new" if row.new else "allowed" if row.allowed else "known"
        rows.append(f'<tr class="{state}" data-incident="{i.id}" data-severity="{i.severity}" '
                    f'data-new="{str(row.new).lower()}" data-allowed="{str(row.allowed).lower()}" '
                    f'data-documented="{escape(row.label)}">'
                    f'<td class="sev {i.severity}">{i.severity}</td><td>{escape(row.label)}</td>'
                    f"<td>{escape(row.direction('→'))}</td>"
                    f"<td><code>{escape(i.entry)}</code></td><td>{escape(f.kind)} at {escape(where)}"
                    f"<div><code>{escape(f.location)}</code></div>{evidence}</td>"
                    f"<td>{len(i.canaries)}</td><td>{escape(row.spread())}{_incident_details(row)}</td>"
                    f"<td><code class='fp'>{i.id}</code></td></tr>")
    return ('<table id="incidents"><tr><th>severity</th><th>documented</th><th>victim &rarr; recipient</th>'
            "<th>entry point</th><th>first hop</th><th>canary kinds</th><th>spread</th><th>incident</th></tr>"
            f"{''.join(rows)}</table>")


def _timeline(result: AuditResult) -> str:
    if not result.timeline:
        return '<p class="muted">No turns recorded.</p>'
    rows = "".join(
        f"<tr><td>{escape(str(e.get('scenario', '')))}/{escape(str(e.get('phase', '')))}</td>"
        f"<td>{escape(str(e.get('tenant', '')))}</td><td>{escape(str(e.get('driver', '')))}</td>"
        f"<td>{'ok' if e.get('ok') else 'FAILED'}</td><td>{e.get('seconds', '')}</td><td>{e.get('flows', '')}</td>"
        f"<td>{escape(str(e.get('detail', '')))}</td></tr>"
        for e in result.timeline)
    return ('<table id="timeline"><tr><th>scenario/phase</th><th>tenant</th><th>driver</th><th>result</th>'
            f"<th>seconds</th><th>flows so far</th><th>detail</th></tr>{rows}</table>")


def _coverage(result: AuditResult) -> str:
    if not result.coverage:
        return '<p class="muted">No tool battery ran.</p>'
    return (_table("coverage", "tool", result.coverage) +
            '<p class="muted">driven: a call\'s result came back; leak: a finding came through the tool; failed: '
            "every call was answered with an error; not offered: this Hermes does not offer the tool there; out of "
            "scope: offered, not driven, for the reason given.</p>")


def _door_coverage(result: AuditResult) -> str:
    if not result.doors:
        return ""
    return ('<h2>Front-door coverage</h2>' + _table("door-coverage", "door", {"state": result.doors})
            + f'<p class="muted">{DOOR_STATES_TEXT}</p>')


def _platform_coverage(result: AuditResult) -> str:
    if not result.platforms:
        return ""
    return ('<h2>Messaging-platform coverage</h2>' + _table("platform-coverage", "platform",
                                                             {"state": result.platforms})
            + f'<p class="muted">{PLATFORM_STATES_TEXT}</p>')


def _service_coverage(result: AuditResult) -> str:
    if not result.services:
        return '<p class="muted">No service besides the providers ran.</p>'
    return _table("service-coverage", "service", result.services) + f'<p class="muted">{SERVICE_STATES_TEXT}</p>'


def _table(ident: str, what: str, coverage: dict[str, dict[str, str]]) -> str:
    """tool (or service) x scenario: each cell its status, classed by its first word; why, where it says."""
    scenarios, reasons = list(coverage), reasons_of(coverage)
    head = "".join(f"<th>{escape(sc)}</th>" for sc in scenarios)
    rows = []
    for name in coverage_tools(coverage):
        cells = "".join(
            f'<td class="{escape(state.split(":")[0].replace(" ", "-").replace("/", ""))}" '
            f'data-scenario="{escape(sc)}" data-{what}="{escape(name)}" data-status="{escape(state)}">'
            f'{escape(state.split(": ")[0])}</td>' for sc in scenarios for state in [coverage[sc].get(name, "-")])
        why = f'<td class="why">{escape(reasons.get(name, ""))}</td>'
        rows.append(f"<tr><th><code>{escape(name)}</code></th>{cells}{why}</tr>")
    return f'<table id="{ident}"><tr><th>{what} \\ scenario</th>{head}<th>why</th></tr>{"".join(rows)}</table>'


def _policy(result: AuditResult) -> str:
    """The isolation policy: what it shares by design (a finding there is allowed, never failing the run)."""
    name, shared = escape(str(result.policy.get("name", "strict"))), result.policy.get("shared") or []
    if not shared:
        return f'<p class="muted">Isolation policy <code>{name}</code>: nothing is shared by design.</p>'
    rows = "".join(
        f"<tr><td>{escape(next(f'{k} {e[k]}' for k in ('tool', 'service', 'channel') if k in e))}</td>"
        f"<td>{escape(e['from'])} &rarr; {escape(e['to'])}</td><td>{escape(e['why'])}</td>"
        f"<td>{escape(e['source'])}</td></tr>" for e in shared)
    return (f'<h2>Allowed by the isolation policy <code>{name}</code> ({len(result.verdict.allowed)} findings)</h2>'
            '<p class="muted">Surfaces shared between tenants by design: a finding there, and every copy its crossing '
            "explains, is allowed, listed with the incidents, never failing the run; <code>--policy strict</code> "
            "treats them as leaks.</p>"
            f'<table id="policy"><tr><th>surface</th><th>from &rarr; to</th><th>why</th><th>source</th></tr>{rows}'
            "</table>")


def _notes(result: AuditResult) -> str:
    v = result.verdict
    notes = []
    if result.negative_control:
        notes.append(f"Negative control: planted {escape(', '.join(result.plants))}; a leak is the expected outcome.")
    if v.known:
        notes.append(f"{len(v.known)} known finding(s) in {len(groups(v.known))} class(es) are in the baseline: "
                     "listed below, not failing the run.")
    return "".join(f'<div class="note">{n}</div>' for n in notes)


def _not_inspected(result: AuditResult) -> str:
    if not result.not_inspected:
        return '<p class="muted">Everything was read to its end.</p>'
    rows = "".join(
        f"<tr><td><code>{escape(n['path'])}</code></td><td>{escape(n['reason'])}</td><td>{n['bytes_read']}</td>"
        f"<td>{'yes (inconclusive)' if n['partial'] else 'no'}</td></tr>"
        for n in result.not_inspected)
    return ('<table id="not-inspected"><tr><th>path</th><th>reason</th><th>bytes read</th><th>read in part</th>'
            f"</tr>{rows}</table>")


def render(result: AuditResult) -> str:
    """The whole page as one string."""
    v = result.verdict
    versions = ", ".join(f"{escape(k)} {escape(str(val))}" for k, val in result.versions.items())
    reasons = ("<ul class=reasons>" + "".join(f"<li>{escape(r)}</li>" for r in v.reasons) + "</ul>"
               if v.reasons else "")
    warnings = ("<h2>Warnings</h2><ul>" + "".join(f"<li>{escape(w)}</li>" for w in result.warnings) + "</ul>"
                if result.warnings else "")
    inspected = ", ".join(f"{escape(k)} {n}" for k, n in sorted(result.inspected.items())) or "nothing"
    fixed = ("<h2>Fixed (in the baseline, no longer seen)</h2><ul>"
             + "".join(f"<li><code>{escape(fp)}</code></li>" for fp in result.fixed) + "</ul>") if result.fixed else ""
    control = " &middot; negative control" if result.negative_control else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>tenancy-audit: {escape(v.status)}{control}</title><style>{CSS}</style></head>
<body><div class="banner {escape(v.status)}" id="verdict" data-verdict="{escape(v.status)}"
data-negative-control="{str(result.negative_control).lower()}" data-known="{len(v.known)}">
<h1>{escape(v.status.upper())}{" (negative control)" if result.negative_control else ""}</h1>
<div>scenario <b>{escape(result.scenario)}</b> &middot; tenants {escape(", ".join(result.tenants))} &middot;
{len(v.findings)} new finding(s) in {len(groups(v.findings))} class(es), {len(v.known)} known &middot;
{result.seconds:.1f} s &middot; {versions}</div>
{_notes(result)}{reasons}</div>
<main>
{warnings}
<h2>Incidents ({sum(row.new for row in result.incidents)} new, {len(result.incidents)} in all)</h2>
<p class="muted">Each incident is where a tenant's data first crossed into another tenant's context through one
entry point (its first hop), with every copy that crossing explains (its spread); documented: the finding of
docs/hermes-findings.md it matches, else new. <a href="{escape(docs_url("incidents"))}">How incidents are
built</a>.</p>
{_incidents(result)}
{_policy(result)}
<h2>Who leaked into whom</h2>
<p class="muted">Row: the tenant whose canary or key it is. Column: the tenant whose channel carried it. New
findings per channel; known ones (in the baseline) in grey.</p>
{_matrix(result)}
<h2>Tool coverage</h2>
{_coverage(result)}
<h2>Service coverage</h2>
{_service_coverage(result)}
{_door_coverage(result)}
{_platform_coverage(result)}
<h2>Findings ({len(v.findings)} new in {len(groups(v.findings))} class(es))</h2>
<p class="muted">One row per class (fingerprint), the most severe first. What each kind means and how to fix it:
<a href="{escape(docs_url())}">docs/findings.md</a>.</p>
{_findings(v.findings, "findings")}
<h2>Known (in the baseline, {len(v.known)})</h2>
{_findings(v.known, "known")}
{fixed}
<h2>Timeline</h2>
{_timeline(result)}
<h2>Inspected</h2><p>{inspected}</p>
<h2>Not inspected ({len(result.not_inspected)})</h2>
{_not_inspected(result)}
</main></body></html>
"""

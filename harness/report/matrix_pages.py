"""`matrix.md` and `matrix.html` of a release matrix (`report.matrix.document`): one row per incident, then one per
finding class, one column per release, and the runs of every release x scenario. Only kinds, tenants, entry
points and fingerprints appear; no canary value does."""

from __future__ import annotations

from html import escape
from typing import Any

from harness.core.severity import docs_url
from harness.report.matrix import NA, Cell, cell_text, release_key, run_text


def _md(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _releases(doc: dict[str, Any]) -> list[str]:
    return sorted(doc["plan"]["releases"], key=release_key)


def _runs(doc: dict[str, Any], release: str, scenario: str) -> list[Cell]:
    return [Cell.from_dict(c) for c in doc["cells"] if c["release"] == release and c["scenario"] == scenario]


def _heading(doc: dict[str, Any]) -> str:
    plan = doc["plan"]
    tools = "every tool group" if plan["tools"] is None else (", ".join(plan["tools"]) or "the env probe only")
    phases = f"; phases {', '.join(plan['phases'])}" if plan.get("phases") else ""
    services = "" if plan.get("services") is None else f"; services {', '.join(plan['services']) or 'none'}"
    unset = f"; unset {', '.join(plan['unset'])}" if plan.get("unset") else ""
    shard = f"; shard {doc['shard']} only" if doc["shard"] else ""
    return (f"releases {', '.join(_releases(doc))}; scenarios {', '.join(plan['scenarios'])}; "
            f"{plan['runs']} run(s) each; {tools}{phases}{services}{unset}{shard}")


def _who(row: dict[str, Any]) -> str:
    return f"{row['victim'] or '-'} -> {row['seen_in'] or '-'}"


def _label(row: dict[str, Any]) -> str:
    """An incident's F-numbers of docs/hermes-findings.md, or `new`."""
    return ",".join(row["documented"]) or "new"


def _first_hop(row: dict[str, Any]) -> str:
    return f"{row['kinds'][0]} {_who(row)} at {row['scenario'] or '-'}/{row['phase'] or '-'}"


class _Notes:
    """The reasons of `n/a` cells, numbered once each: a cell says `n/a [2]`, the note below the table why."""

    def __init__(self) -> None:
        self.reasons: dict[str, int] = {}

    def text(self, cell: dict[str, Any]) -> str:
        if cell["state"] != NA:
            return cell_text(cell)
        n = self.reasons.setdefault(cell["reason"], len(self.reasons) + 1)
        return f"n/a [{n}]"


def render_markdown(doc: dict[str, Any]) -> str:
    releases = _releases(doc)
    lines = [f"# tenancy-audit release matrix: **{doc['status'].upper()}**", "", _heading(doc), "",
             "## Runs", "", "| scenario \\ release | " + " | ".join(releases) + " |",
             "|---" * (len(releases) + 1) + "|"]
    for scenario in doc["plan"]["scenarios"]:
        lines.append(f"| {scenario} | " + " | ".join(_md(run_text(_runs(doc, r, scenario))) for r in releases) + " |")
    notes = _Notes()
    incidents = doc.get("incidents") or []  # none in a matrix.json from before incidents
    lines += ["", f"## Incidents ({len(incidents)})", "",
              "One per entry point a tenant's data crossed through (docs/findings.md#incidents); `documented`: the "
              "finding of docs/hermes-findings.md it matches, else new.", "",
              "| severity | documented | entry point | first hop | " + " | ".join(releases)
              + " | first seen | last seen | incident |", "|---" * (len(releases) + 7) + "|"]
    for row in incidents:
        cells = " | ".join(_md(notes.text(row["cells"][r])) for r in releases)
        lines.append(f"| {row['severity']} | {_label(row)} | `{_md(row['entry'])}` | {_md(_first_hop(row))} | "
                     f"{cells} | {row['first_seen'] or '-'} | {row['last_seen'] or '-'} | `{row['id']}` |")
    if not incidents:
        lines.append("| " + " | ".join(["-"] * (len(releases) + 7)) + " |")
    lines += ["", f"## Finding classes ({len(doc['rows'])})", "",
              "`seen k/N`: in k of the N runs that completed a turn (95% Wilson interval when N > 1); `n/a`: the "
              f"release could not run it. What each kind means: {docs_url()}", "",
              "| severity | kind | victim -> carrier | canary | channel | scenario/phase | tool | "
              + " | ".join(releases) + " | first seen | last seen | fingerprint |",
              "|---" * (len(releases) + 10) + "|"]
    for row in doc["rows"]:
        cells = " | ".join(_md(notes.text(row["cells"][r])) for r in releases)
        lines.append(f"| {row['severity']} | {row['kind']} | {_md(_who(row))} | {row['canary'] or '-'} | "
                     f"{row['channel']} | {row['scenario'] or '-'}/{row['phase'] or '-'} | {row['tool'] or '-'} | "
                     f"{cells} | {row['first_seen'] or '-'} | {row['last_seen'] or '-'} | `{row['fingerprint']}` |")
    if not doc["rows"]:
        lines.append("| " + " | ".join(["-"] * (len(releases) + 10)) + " |")
    lines += ["", *(f"[{n}] n/a: {_md(reason)}  " for reason, n in notes.reasons.items())]
    return "\n".join(lines) + "\n"


CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;padding:0 24px 48px;max-width:1400px;color:#1d2330;
background:#f6f7f9}
h1{font-size:24px}h2{font-size:18px;margin-top:28px}
table{border-collapse:collapse;background:#fff;margin:4px 0}
th,td{border:1px solid #d5d9e0;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#eceff4}
td.seen{background:#fde4e1;color:#8c1d18;font-weight:600}td.not-seen{color:#1f7a3d}td.n-a{color:#8a93a3}
.leak{color:#b3261e}.clean{color:#1f7a3d}.inconclusive{color:#9a6700}
code{font:12px ui-monospace,monospace}
"""


def _state_class(state: str) -> str:
    return "n-a" if state == NA else state.replace(" ", "-")


def _release_cells(row: dict[str, Any], releases: list[str], notes: _Notes) -> str:
    """One `td[data-release][data-state][data-seen][data-runs]` per release."""
    return "".join(
        f'<td class="{_state_class(c["state"])}" data-release="{escape(r)}" data-state="{escape(c["state"])}" '
        f'data-seen="{c.get("seen", "")}" data-runs="{c.get("runs", "")}">{escape(notes.text(c))}</td>'
        for r, c in ((r, row["cells"][r]) for r in releases))


def render_html(doc: dict[str, Any]) -> str:
    releases = _releases(doc)
    head = "".join(f"<th>{escape(r)}</th>" for r in releases)
    runs = "".join(
        f"<tr><th>{escape(s)}</th>"
        + "".join(f'<td data-release="{escape(r)}" data-scenario="{escape(s)}">{escape(run_text(_runs(doc, r, s)))}'
                  "</td>" for r in releases) + "</tr>"
        for s in doc["plan"]["scenarios"])
    notes = _Notes()
    incidents = []
    for row in doc.get("incidents") or []:
        incidents.append(f'<tr data-incident="{escape(row["id"])}" data-documented="{escape(_label(row))}">'
                         f"<td>{escape(row['severity'])}</td><td>{escape(_label(row))}</td>"
                         f"<td><code>{escape(row['entry'])}</code></td><td>{escape(_first_hop(row))}</td>"
                         f"{_release_cells(row, releases, notes)}<td>{escape(row['first_seen'] or '-')}</td>"
                         f"<td>{escape(row['last_seen'] or '-')}</td><td><code>{escape(row['id'])}</code></td></tr>")
    rows = []
    for row in doc["rows"]:
        tds = _release_cells(row, releases, notes)
        kind = f'<a href="{escape(docs_url(row["kind"]))}">{escape(row["kind"])}</a>'
        rows.append(f'<tr data-fingerprint="{escape(row["fingerprint"])}"><td>{escape(row["severity"])}</td>'
                    f"<td>{kind}</td><td>{escape(_who(row))}</td><td>{escape(row['canary'] or '-')}</td>"
                    f"<td>{escape(row['channel'])}</td>"
                    f"<td>{escape(row['scenario'] or '-')}/{escape(row['phase'] or '-')}</td>"
                    f"<td>{escape(row['tool'] or '-')}</td>{tds}<td>{escape(row['first_seen'] or '-')}</td>"
                    f"<td>{escape(row['last_seen'] or '-')}</td>"
                    f"<td><code>{escape(row['fingerprint'])}</code></td></tr>")
    status = escape(doc["status"])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>tenancy-audit release matrix: {status}</title><style>{CSS}</style></head><body>
<h1 id="verdict" data-verdict="{status}">Release matrix: <span class="{status}">{status.upper()}</span></h1>
<p>{escape(_heading(doc))}</p>
<h2>Runs</h2>
<table id="runs"><tr><th>scenario \\ release</th>{head}</tr>{runs}</table>
<h2>Incidents ({len(incidents)})</h2>
<p>One per entry point a tenant's data crossed through; documented: the finding of docs/hermes-findings.md it
matches, else new.</p>
<table id="incidents"><tr><th>severity</th><th>documented</th><th>entry point</th><th>first hop</th>{head}
<th>first seen</th><th>last seen</th><th>incident</th></tr>
{"".join(incidents)}</table>
<h2>Finding classes ({len(doc["rows"])})</h2>
<p>seen k/N: in k of the N runs that completed a turn (95% Wilson interval when N &gt; 1); n/a: the release
could not run it.</p>
<table id="classes"><tr><th>severity</th><th>kind</th><th>victim &rarr; carrier</th><th>canary</th><th>channel</th>
<th>scenario/phase</th><th>tool</th>{head}<th>first seen</th><th>last seen</th><th>fingerprint</th></tr>
{"".join(rows)}</table>
<ol id="notes">{"".join(f"<li>n/a: {escape(reason)}</li>" for reason in notes.reasons)}</ol>
</body></html>
"""

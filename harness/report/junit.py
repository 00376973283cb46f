"""junit.xml: one test case per incident (failing when new), then one per tenant x invariant (a finding fails the
invariant it violates: what held is a passing case).

Each invariant case's `time` is its tenant's share of the run: the seconds its turns took, split evenly over its
invariants (the run-level case gets what no tenant's turn accounts for), so the cases add up to the suite;
an incident case takes none."""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

from harness.report.result import AuditResult, IncidentRow

INVARIANTS = {
    "own key on every request": {"wrong_key"},
    "own model on every main turn": {"wrong_model"},
    "own identity at every service": {"wrong_identity"},
    "no foreign canary in requests": {"request_leak", "egress"},
    "no foreign canary in responses": {"response_leak"},
    "tool env and cwd are its own": {"env_leak", "wrong_cwd", "wrong_path"},
    "no foreign canary in its files": {"file_leak"},
    "no secret in logs and streams": {"text_leak"},
    "routes open only to their own key": {"route_auth"},
    "profile settings stay its own": {"profile_bleed"},
    "every request passed the proxy": {"bypass"},
    "enough traffic to conclude": {"shortfall"},
}


def _incident_case(row: IncidentRow) -> str:
    """`tenancy.incident / F8 tool session_search`: failing when new (the line, its first hop and its classes),
    passing when the baseline holds all of it."""
    i = row.incident
    head = f"  <testcase classname=\"tenancy.incident\" name={quoteattr(f'{row.label} {i.entry}')} time=\"0.000\">"
    if not row.new:
        return head + "<system-out>every finding of it is in the baseline</system-out></testcase>"
    text = "\n".join([row.line(), f"first hop: {i.first.summary()}", *(f"{role}: {g.line()}"
                                                                       for role, g in row.classes())])
    return head + f"<failure message={quoteattr(row.line())}>{escape(text)}</failure></testcase>"


def junit(result: AuditResult) -> str:
    cases = [_incident_case(row) for row in result.incidents]
    failures = sum(row.new for row in result.incidents)
    driven = {t: sum(float(e.get("seconds") or 0) for e in result.timeline if e.get("tenant") == t)
              for t in result.tenants}
    for tenant in result.tenants:
        share = driven[tenant] / len(INVARIANTS)
        for name, kinds in INVARIANTS.items():
            hits = [f for f in result.verdict.findings if f.kind in kinds and tenant in (f.victim, f.seen_in)]
            body = ""
            if hits:
                failures += 1
                text = "\n".join(f.summary() for f in hits)
                body = f"<failure message={quoteattr(f'{len(hits)} finding(s)')}>{escape(text)}</failure>"
            cases.append(f'  <testcase classname={quoteattr(f"tenancy.{tenant}")} name={quoteattr(name)} '
                         f'time="{share:.3f}">{body}</testcase>')
    if result.verdict.status == "inconclusive":
        failures += 1
        why = escape("\n".join(result.verdict.reasons) or "inconclusive")
        rest = max(0.0, result.seconds - sum(driven.values()))
        cases.append(f'  <testcase classname="tenancy.run" name="run is conclusive" time="{rest:.3f}">'
                     f'<failure message="inconclusive">{why}</failure></testcase>')
    header = (f'<testsuite name={quoteattr(f"tenancy-audit {result.scenario}")} tests="{len(cases)}" '
              f'failures="{failures}" time="{result.seconds:.2f}">')
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + header + "\n" + "\n".join(cases) + "\n</testsuite>\n"

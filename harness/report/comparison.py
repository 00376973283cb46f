"""Two audits of the same scenario side by side, an install and a changed copy of it (`patch-check`): which hops
of the first one's incidents the change removed, which remain, and which are new (a regression).

A hop is an incident's crossing as a baseline names it (`baseline.hop`: entry point, victim -> recipient); each
is linked to the documented findings its incident matches, so "F18: every hop gone, nothing new" reads off.
"""

from __future__ import annotations

from typing import Any

from harness.core.findings import Finding
from harness.detect.incidents import build
from harness.report.baseline import hop
from harness.report.documented import documented


def hops(findings: list[Finding]) -> dict[str, list[str]]:
    """Every hop of the findings' incidents, with the documented findings of its incident."""
    out: dict[str, list[str]] = {}
    for incident in build(findings):
        numbers = documented(incident)
        for f in incident.crossings:
            out.setdefault(hop(incident.entry, f), numbers)
    return out


def compare(before: list[Finding], after: list[Finding]) -> dict[str, Any]:
    """`removed`, `remaining` and `new` hops (each with its documented findings), and per documented finding of
    the first audit whether the change removed all of its hops (`gone`), some (`fewer`) or none (`kept`). A hop
    only the second audit shows is `varied` when every finding it documents is one the first audit showed too
    (the spread of a known root cause, which differs from run to run, as a baseline counts it), else `new`."""
    was, now = hops(before), hops(after)
    shown = {n for ns in was.values() for n in ns}
    added = set(now) - set(was)
    numbers = sorted({n for ns in was.values() for n in ns}, key=lambda n: (len(n), n))
    findings = {}
    for n in numbers:
        mine = {h for h, ns in was.items() if n in ns}
        left = mine & set(now)
        findings[n] = "gone" if not left else "fewer" if len(left) < len(mine) else "kept"
    return {"removed": {h: was[h] for h in sorted(set(was) - set(now))},
            "remaining": {h: was[h] for h in sorted(set(was) & set(now))},
            "varied": {h: now[h] for h in sorted(added) if now[h] and set(now[h]) <= shown},
            "new": {h: now[h] for h in sorted(added) if not now[h] or not set(now[h]) <= shown},
            "documented": findings}

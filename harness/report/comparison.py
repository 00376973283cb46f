"""Two audits of the same scenario side by side, an install and a changed copy of it (`patch-check`): which
crossings of the first one's incidents the change removed, which remain, and which are new (a regression).

A crossing is an incident's hop as a baseline names it (`baseline.hop`: entry point, victim -> recipient) with the
canary kind that crossed: a change that stops a tool's subprocess from seeing another tenant's key but not its
shell variables removes one crossing of that hop and keeps the other, and a change that lets a kind cross a hop
that only carried other kinds before adds one. Each crossing is linked to the documented findings its incident
matches, so "F18: every crossing gone, nothing new" reads off.
"""

from __future__ import annotations

from typing import Any

from harness.core.findings import Finding
from harness.detect.incidents import build
from harness.report.baseline import hop
from harness.report.documented import documented


def crossing(entry: str, f: Finding) -> str:
    """`entry | victim -> recipient | canary kind` (a hop that names its canary kind already, or an exact class,
    is its own crossing)."""
    named = hop(entry, f)
    suffix = f" | {f.canary or '-'}"
    return named if f.seen_in is None or named.endswith(suffix) else named + suffix


def crossings(findings: list[Finding]) -> dict[str, tuple[list[str], str, set[str]]]:
    """Every crossing of the findings' incidents, with the documented findings of its incident, its canary kind
    and the classes (`Finding.fingerprint`) of the findings that make it."""
    out: dict[str, tuple[list[str], str, set[str]]] = {}
    for incident in build(findings):
        numbers = documented(incident)
        for f in incident.crossings:
            out.setdefault(crossing(incident.entry, f), (numbers, f.canary or "-", set()))[2].add(f.fingerprint())
    return out


def compare(before: list[Finding], after: list[Finding]) -> dict[str, Any]:
    """`removed`, `remaining` and `new` crossings (each with its documented findings), and per documented finding
    of the first audit whether the change removed all of its crossings (`gone`), some (`fewer`) or none (`kept`).
    A crossing only the second audit shows is `varied` when each finding it documents carried that canary kind in
    the first audit too (the spread of a known root cause over tenants, which differs from run to run, as a
    baseline counts it), or when the first audit held the same findings as copies inside another incident (a value
    that had crossed elsewhere first: removing that crossing leaves the copy standing on its own); else `new`: a
    kind a finding never carried before is a regression, even on a known hop."""
    was, now = crossings(before), crossings(after)
    carried = {(n, kind) for ns, kind, _ in was.values() for n in ns}
    held = {f.fingerprint() for f in before}
    added = sorted(set(now) - set(was))
    spread = {c for c in added if (now[c][0] and all((n, now[c][1]) in carried for n in now[c][0]))
              or now[c][2] <= held}
    numbers = sorted({n for ns, _, _ in was.values() for n in ns}, key=lambda n: (len(n), n))
    findings = {}
    for n in numbers:
        mine = {c for c, (ns, _, _) in was.items() if n in ns}
        left = mine & set(now)
        findings[n] = "gone" if not left else "fewer" if len(left) < len(mine) else "kept"
    return {"removed": {c: was[c][0] for c in sorted(set(was) - set(now))},
            "remaining": {c: was[c][0] for c in sorted(set(was) & set(now))},
            "varied": {c: now[c][0] for c in added if c in spread},
            "new": {c: now[c][0] for c in added if c not in spread},
            "documented": findings}

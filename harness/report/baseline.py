"""Baselines of known incidents: what a scenario of one Hermes is known to leak, by root cause.

A baseline (version 4) lists **incidents** (`detect.incidents`): each by its entry point, with the **hops** it
crossed by (victim -> recipient; for an entry point that is only a channel, `request` or `rpc`, also the canary
kind, since nothing else names the root cause there) and the classes its spread reached, each seen k of N runs.
A finding of a run is **known** when the hop of its incident is in the baseline: a known incident whose spread
grows (one more copy in a file, one more canary kind, one more phase, a log line from another thread) stays
known. A new entry point, or a new direction through a known one, is **new** and fails the run. A finding that
names no recipient (a shortfall, an egress) is matched by its exact class. A baseline incident that did not
occur at all is **fixed**, unless it was intermittent (seen in fewer than all runs) or none of its phases ran.
A finding a carrier brought (`detect.carriers`: another tenant's conversation) is known by its carrier's hop or by
its tool's (a baseline written before carriers were told apart), and its tool's incident is not fixed.
docs/findings.md#baselines has the rule and its limits.

Versions 1-3 (classes by fingerprint, `baseline_classes`) are still read, with a warning: there a known root
cause whose spread grows is reported as new.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.files import write_private
from harness.core.findings import CHANNELS, Finding
from harness.detect.incidents import Incident, build, own_entry
from harness.report import baseline_classes
from harness.report.baseline_classes import BaselineError, Upgrade
from harness.report.documented import documented

VERSION = 4
READABLE = (*baseline_classes.READABLE, VERSION)

__all__ = ["READABLE", "VERSION", "Baseline", "BaselineError", "Upgrade", "hop", "load", "split", "upgrade",
           "write"]


def hop(entry: str, f: Finding) -> str:
    """The hop a finding of an incident through `entry` stands for: `entry | victim -> recipient`, with the canary
    kind when the entry point is a bare channel; a finding without a recipient is its exact class."""
    if f.seen_in is None:
        return f"{entry} | class {f.fingerprint()}"
    if entry in CHANNELS:
        return f"{entry} | {f.victim or '-'} -> {f.seen_in} | {f.canary or '-'}"
    return f"{entry} | {f.victim or '-'} -> {f.seen_in}"


def hops_of(incidents: Iterable[Incident]) -> dict[int, str]:
    """id(finding) -> its hop, for every finding of `incidents`."""
    return {id(f): hop(i.entry, f) for i in incidents for f in i.findings}


@dataclass
class Baseline:
    """A loaded version-4 baseline: its incidents by entry point, and every hop they crossed by."""

    path: Path
    incidents: dict[str, dict[str, Any]] = field(default_factory=dict)
    made_with: dict[str, Any] = field(default_factory=dict)
    version: int = VERSION

    @property
    def hops(self) -> set[str]:
        return {h["hop"] for i in self.incidents.values() for h in i["hops"]}

    @property
    def warning(self) -> str | None:
        return None


AnyBaseline = Baseline | baseline_classes.Baseline


def load(path: Path) -> AnyBaseline:
    """A baseline of any readable version; BaselineError (one line) when it is missing or malformed."""
    doc = baseline_classes.read(path)
    if doc.get("version") != VERSION:
        return baseline_classes.parse(path, doc)
    if not isinstance(doc.get("incidents"), list):
        raise BaselineError(f"baseline: {path} must be {{version: {VERSION}, incidents: [...]}}")
    base = Baseline(Path(path), made_with=doc.get("made_with") or {})
    for inc in doc["incidents"]:
        if (not isinstance(inc, dict) or not isinstance(inc.get("entry"), str) or not isinstance(inc.get("hops"), list)
                or not all(isinstance(h, dict) and isinstance(h.get("hop"), str) for h in inc["hops"])):
            raise BaselineError(f"baseline: {path} has an incident without an entry point and hops")
        base.incidents[inc["entry"]] = inc
    return base


def split(findings: list[Finding], base: AnyBaseline, ran: set[tuple[str, str]] | None = None
          ) -> tuple[list[Finding], list[Finding], list[str]]:
    """(new findings, known findings, baseline incidents no longer seen: their ids). `ran`: the (scenario, phase)
    pairs that ran; an incident none of whose phases ran is not expected."""
    if isinstance(base, baseline_classes.Baseline):
        return baseline_classes.split(findings, base, ran)
    incidents = build(findings)
    hop_of, known_hops = hops_of(incidents), base.hops

    def known(f: Finding) -> bool:  # a tool's hop of a baseline made before its carrier was told apart still holds
        return hop_of[id(f)] in known_hops or (f.carrier is not None and hop(own_entry(f), f) in known_hops)

    new = [f for f in findings if not known(f)]
    old = [f for f in findings if known(f)]
    seen = {i.entry for i in incidents} | {own_entry(f) for i in incidents for f in i.findings if f.carrier}

    def expected(inc: dict[str, Any]) -> bool:
        phases = {tuple(p) for p in inc.get("phases") or []}
        return not inc.get("intermittent") and (ran is None or not phases or bool(phases & ran))

    return new, old, sorted(inc["id"] for entry, inc in base.incidents.items() if entry not in seen and expected(inc))


def write(path: Path, runs: list[list[Finding]], note: str = "", made_with: dict[str, Any] | None = None
          ) -> list[dict[str, Any]]:
    """Write a baseline of the incidents of every run: each incident, hop and spread class with how many of the
    runs saw it (`seen` of `runs`); an incident missing from some run is `intermittent`. Returns its incidents."""
    merged: dict[str, dict[str, Any]] = {}
    for findings in runs:
        for i in build(findings):
            doc = merged.setdefault(i.entry, {"id": i.id, "entry": i.entry, "documented": set(), "phases": set(),
                                              "hops": {}, "classes": {}, "seen": 0})
            doc["seen"] += 1
            doc["documented"] |= set(documented(i))
            doc["phases"] |= {(f.scenario or "", f.phase or "") for f in i.crossings}
            crossing = {id(f) for f in i.crossings}
            for name, f in {hop(i.entry, f): f for f in i.findings}.items():
                doc["hops"].setdefault(name, _hop_item(name, f))["seen"] += 1
            for name, f in {f.fingerprint(): f for f in i.findings}.items():
                doc["classes"].setdefault(name, _class_item(name, f, id(f) in crossing))["seen"] += 1
    incidents = [{**doc, "documented": sorted(doc["documented"], key=lambda n: int(n[1:])),
                  "phases": [list(p) for p in sorted(doc["phases"])],
                  "hops": sorted(doc["hops"].values(), key=lambda h: h["hop"]),
                  "classes": sorted(doc["classes"].values(), key=lambda c: (c["role"], c["example"])),
                  "seen": doc["seen"], "runs": len(runs), "intermittent": doc["seen"] < len(runs)}
                 for doc in sorted(merged.values(), key=lambda d: d["entry"])]
    out = {"version": VERSION, "tool": "tenancy-audit", "note": note, "runs": len(runs),
           "made_with": made_with or {}, "incidents": incidents}
    write_private(Path(path), (json.dumps(out, indent=2) + "\n").encode())
    return incidents


def _hop_item(name: str, f: Finding) -> dict[str, Any]:
    return {"hop": name, "victim": f.victim, "recipient": f.seen_in, "seen": 0}


def _class_item(name: str, f: Finding, crossing: bool) -> dict[str, Any]:
    return {"fingerprint": name, "role": "crossing" if crossing else "spread", "kind": f.kind, "canary": f.canary,
            "channel": f.channel, "scenario": f.scenario, "phase": f.phase, "seen": 0, "example": f.summary()[:160]}


def upgrade(src: Path, dest: Path) -> Upgrade:
    """Convert a version-1 or version-2 baseline to version 3 (classes); a class baseline cannot become an
    incident baseline without the runs' evidence: regenerate it (`tenancy-audit baseline --runs N`)."""
    return baseline_classes.upgrade(src, dest)

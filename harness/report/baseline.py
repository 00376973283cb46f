"""Baselines of known findings (in the style of detect-secrets/gitleaks baselines).

A baseline lists findings by a stable fingerprint (kind, victim's canary kind, channel, scenario,
phase: never a random value). Known findings are reported as known and do not fail the run; a new
one fails it; a baseline entry that no longer occurs is reported as fixed. Entries marked
`intermittent` (seen in some runs of the same scenario, not all) are never reported as fixed, and an
entry whose scenario/phase did not run this time is neither required nor fixed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.core.files import write_private
from harness.core.findings import Finding

VERSION = 1


class BaselineError(ValueError):
    """The baseline file is missing or malformed; one line."""


def load(path: Path) -> dict[str, dict[str, Any]]:
    """fingerprint -> entry."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BaselineError(f"baseline: {path} does not exist") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BaselineError(f"baseline: {path} is not a readable JSON baseline ({type(exc).__name__})") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("entries"), list):
        raise BaselineError(f"baseline: {path} must be {{version: {VERSION}, entries: [...]}}")
    entries = {}
    for entry in doc["entries"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("fingerprint"), str):
            raise BaselineError(f"baseline: {path} has an entry without a fingerprint")
        entries[entry["fingerprint"]] = entry
    return entries


def split(
    findings: list[Finding], known: dict[str, dict[str, Any]], ran: set[tuple[str, str]] | None = None
) -> tuple[list[Finding], list[Finding], list[str]]:
    """(new findings, known findings, fingerprints of baseline entries no longer seen).

    `ran` is the set of (scenario, phase) that ran; entries of other phases are not expected."""
    new = [f for f in findings if f.fingerprint() not in known]
    old = [f for f in findings if f.fingerprint() in known]
    seen = {f.fingerprint() for f in old}

    def expected(entry: dict[str, Any]) -> bool:
        if entry.get("intermittent"):
            return False
        return ran is None or entry.get("phase") is None or (entry.get("scenario"), entry.get("phase")) in ran

    return new, old, sorted(fp for fp, entry in known.items() if fp not in seen and expected(entry))


def write(path: Path, runs: list[list[Finding]], note: str = "") -> int:
    """Write a baseline that knows every finding of every run; those missing from some run are
    `intermittent`. Returns the number of entries."""
    entries: dict[str, dict[str, Any]] = {}
    counts: dict[str, int] = {}
    for findings in runs:
        for fp in {f.fingerprint() for f in findings}:
            counts[fp] = counts.get(fp, 0) + 1
        for f in findings:
            entries.setdefault(f.fingerprint(), {
                "fingerprint": f.fingerprint(), "kind": f.kind, "canary": f.canary, "channel": f.channel,
                "scenario": f.scenario, "phase": f.phase, "example": f.summary()[:200],
            })
    for fp, entry in entries.items():
        entry["intermittent"] = counts[fp] < len(runs)
    doc = {"version": VERSION, "tool": "tenancy-audit", "note": note,
           "entries": sorted(entries.values(), key=lambda e: (e["scenario"] or "", e["phase"] or "", e["kind"]))}
    write_private(Path(path), (json.dumps(doc, indent=2) + "\n").encode())
    return len(entries)

"""Class baselines (versions 1-3), read and upgraded for older files; `baseline` writes incident baselines.

A class baseline lists findings by their stable fingerprint (version 3: kind, victim, carrier, canary kind,
channel, scenario, phase, service, tool; never a random value). Known findings are reported as known and do
not fail the run; a new one fails it; a baseline entry that no longer occurs is reported as fixed. Entries
marked `intermittent` (seen in some runs of the same scenario, not all) are never reported as fixed, and an
entry whose scenario/phase did not run this time is neither required nor fixed.

Older baselines are still read, with a warning: an entry of version 2 (no service, no tool) also hides the same
leak through a new tool or service, one of version 1 (no victim, no carrier) also a new direction. `upgrade`
converts either.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.files import write_private
from harness.core.findings import FINGERPRINT_VERSION, Finding

VERSION = FINGERPRINT_VERSION
READABLE = (1, 2, 3)
#: What an entry of an older version cannot tell apart, so that it also hides it.
_BLIND = {1: "its fingerprints lack victim and carrier, so an entry also hides the same kind of leak in a new "
             "direction",
          2: "its fingerprints lack the service and tool that carried the data, so an entry also hides the same "
             "leak through a new tool or service",
          3: "it lists finding classes, not incidents, so a known root cause whose spread grows (one more file, "
             "canary kind or phase) is reported as new"}
_REDO = "regenerate it as incidents (tenancy-audit baseline --runs N)"


class BaselineError(ValueError):
    """The baseline file is missing or malformed; one line."""


@dataclass
class Baseline:
    """A loaded baseline: fingerprint -> entry, and the fingerprint version its entries use."""

    path: Path
    version: int
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)

    def fingerprint(self, f: Finding) -> str:
        """`f`'s fingerprint in this baseline's version."""
        return {1: f.fingerprint_v1, 2: f.fingerprint_v2}.get(self.version, f.fingerprint)()

    @property
    def warning(self) -> str:
        convert = "" if self.version == VERSION else " or convert it (tenancy-audit baseline --upgrade FILE)"
        return f"baseline {self.path} is version {self.version}: {_BLIND[self.version]}; {_REDO}{convert}"


def read(path: Path) -> dict[str, Any]:
    """A baseline file's JSON object, of any version; BaselineError (one line) when it is not one."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BaselineError(f"baseline: {path} does not exist") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BaselineError(f"baseline: {path} is not a readable JSON baseline ({type(exc).__name__})") from None
    if not isinstance(doc, dict) or doc.get("version") not in (*READABLE, 4):
        raise BaselineError(f"baseline: {path} must be a JSON object with a version of 1 to 4")
    return doc


def load(path: Path) -> Baseline:
    """A class baseline (version 1-3) from its file."""
    return parse(path, read(path))


def parse(path: Path, doc: dict[str, Any]) -> Baseline:
    """A class baseline from its JSON object."""
    if doc.get("version") not in READABLE or not isinstance(doc.get("entries"), list):
        raise BaselineError(f"baseline: {path} must be {{version: {VERSION}, entries: [...]}} (versions 1 and 2 are "
                            "read too)")
    base = Baseline(Path(path), doc["version"])
    for entry in doc["entries"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("fingerprint"), str):
            raise BaselineError(f"baseline: {path} has an entry without a fingerprint")
        base.entries[entry["fingerprint"]] = entry
    return base


def split(
    findings: list[Finding], base: Baseline, ran: set[tuple[str, str]] | None = None
) -> tuple[list[Finding], list[Finding], list[str]]:
    """(new findings, known findings, fingerprints of baseline entries no longer seen).

    `ran` is the set of (scenario, phase) that ran; entries of other phases are not expected."""
    new = [f for f in findings if base.fingerprint(f) not in base.entries]
    old = [f for f in findings if base.fingerprint(f) in base.entries]
    seen = {base.fingerprint(f) for f in old}

    def expected(entry: dict[str, Any]) -> bool:
        if entry.get("intermittent"):
            return False
        return ran is None or entry.get("phase") is None or (entry.get("scenario"), entry.get("phase")) in ran

    return new, old, sorted(fp for fp, entry in base.entries.items() if fp not in seen and expected(entry))


def entry_of(f: Finding) -> dict[str, Any]:
    return {"fingerprint": f.fingerprint(), "kind": f.kind, "victim": f.victim, "seen_in": f.seen_in,
            "canary": f.canary, "channel": f.channel, "scenario": f.scenario, "phase": f.phase,
            "service": f.service, "tool": f.tool, "example": f.summary()[:200]}


def _save(path: Path, entries: list[dict[str, Any]], note: str) -> list[dict[str, Any]]:
    doc = {"version": VERSION, "tool": "tenancy-audit", "note": note,
           "entries": sorted(entries, key=lambda e: (e["scenario"] or "", e["phase"] or "", e["kind"],
                                                     e.get("victim") or "", e.get("seen_in") or "",
                                                     e["canary"] or "", e["channel"]))}
    write_private(Path(path), (json.dumps(doc, indent=2) + "\n").encode())
    return doc["entries"]


# The summary line a version-1 entry keeps as its `example`: "KIND: VICTIM's CANARY in SEEN_IN's CHANNEL ...".
_EXAMPLE = re.compile(r"^(?P<kind>\w+): (?P<victim>[\w.-]+)(?:'s \S+)?(?: in (?P<seen>[\w.-]+)'s | \()")


def _class_of(entry: dict[str, Any], version: int) -> Finding | None:
    """The class an older entry stands for, as a finding: its own victim and carrier from version 2 on, else the
    direction its example names; None when it names none (or the entry is malformed)."""
    direction: tuple[str | None, str | None] = (entry.get("victim"), entry.get("seen_in"))
    if version == 1:
        m = _EXAMPLE.match(str(entry.get("example", "")))
        if m is None or m["kind"] != entry.get("kind"):
            return None
        direction = (m["victim"] if m["victim"] != "-" else None), m["seen"]
    try:
        return Finding(entry["kind"], *direction, entry.get("canary"), entry["channel"], "",
                       scenario=entry.get("scenario"), phase=entry.get("phase"), tool=entry.get("tool"),
                       service=entry.get("service"))
    except (KeyError, ValueError, TypeError):
        return None


@dataclass
class Upgrade:
    """What `upgrade` wrote: `written` entries; `dropped` ones (a version-1 example naming no direction, a
    malformed entry); `untooled` version-2 entries that name no tool or service field at all (written before
    entries kept them), taken to have none: exact only if their class had none."""

    written: int
    dropped: int
    untooled: int


def upgrade(src: Path, dest: Path) -> Upgrade:
    """Convert a version-1 or version-2 baseline to version 3. From version 2 it is exact: each entry keeps its
    class and the service and tool it names. From version 1 it is inexact by nature (an entry stood for every
    direction; only its example's is kept): regenerating is better."""
    base = load(src)
    if base.version == VERSION:
        raise BaselineError(f"baseline: {src} is already version {VERSION}")
    entries, dropped, untooled = [], 0, 0
    for entry in base.entries.values():
        f = _class_of(entry, base.version)
        if f is None:
            dropped += 1
            continue
        untooled += base.version == 2 and not {"tool", "service"} <= set(entry)
        kept = {k: entry[k] for k in ("example", "seen", "runs") if k in entry}
        entries.append({**entry_of(f), **kept, "intermittent": bool(entry.get("intermittent"))})
    doc = json.loads(Path(src).read_text(encoding="utf-8"))
    how = "exact" if base.version == 2 and not untooled else "inexact: regenerate for an exact one"
    note = f"{doc.get('note', '')}; upgraded from version {base.version} ({how})"
    _save(dest, entries, note.lstrip("; "))
    return Upgrade(len(entries), dropped, untooled)

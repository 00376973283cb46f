"""The versions of home files kept during a run (`harness.capture.file_versions`), scanned like the homes.

A kept version is attributed to the tenant whose home holds its path (the deepest one: a launch profile's
home holds the other profiles') and scanned as that home's file would be. A finding the end-of-run scan of
the same file also shows is that scan's (reported once, at the end); any other is `transient`: the version
that carried it was gone by the end, and the finding says when it was seen and in which phase.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.core.findings import Finding
from harness.detect import scan
from harness.detect.engine import stream
from harness.detect.engine.matcher import Matcher
from harness.detect.planted import Planted

#: Where the copies are in an evidence folder, and their index (one JSON line per kept version).
FOLDER = "versions"
INDEX = "index.jsonl"
MARK = "version"  # a transient finding's location ends `(version ID, gone at the end)`


@dataclass(frozen=True)
class Version:
    id: str
    path: str  # relative to the evidence folder (`sandbox/...`)
    time: float
    size: int
    sha256: str

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Version:
        return cls(str(data["id"]), str(data["path"]), float(data["time"]), int(data["size"]), str(data["sha256"]))


def read_index(out: Path) -> list[Version]:
    """The kept versions of the evidence folder `out` (none when the run kept none). Raises ValueError on a
    malformed index (its message names the line)."""
    path = out / FOLDER / INDEX
    if not path.exists():
        return []
    entries = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                entries.append(Version.from_dict(json.loads(line)))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{n}: not a version entry ({type(exc).__name__})") from None
    return entries


def owner_of(path: Path, homes: dict[str, Path]) -> str | None:
    """The tenant whose home holds `path` (the deepest such home), or None."""
    inside = [(len(h.parts), name) for name, h in homes.items() if path.is_relative_to(h)]
    return max(inside)[1] if inside else None


def scan_versions(
    out: Path, matcher: Matcher, homes: dict[str, Path], end: Sequence[Finding],
    limits: stream.Limits = stream.DEFAULT_LIMITS, stretch: Callable[[float], Any] = lambda t: None,
    planted: Mapping[str, Planted] | None = None,
) -> tuple[list[Finding], int, list[stream.NotInspected]]:
    """The transient findings of the kept versions under `out`, how many versions were scanned, and what was
    not read to its end (listed, never partial: the end-of-run scan is the one that must be whole; a copy of a
    database taken mid-write may not open as one, and is then read as bytes only). `end`: the end-of-run scans'
    findings.

    A finding is not transient when the end-of-run scan shows it in the same file, or in any file that held
    the same content (a temporary file renamed into place); a SQLite side file (`-wal`, `-journal`) counts as
    its database, whose scan reads it. Each transient finding is reported once per file and `stretch` of the run
    (the phase a version's time falls in), for the first version that shows it. `planted`: by owner, what its own
    probe planted (`detect.planted`), which no version counts either."""
    homes = {name: Path(os.path.abspath(h)) for name, h in homes.items()}
    shown: dict[tuple[Any, ...], set[str]] = {}
    for f in end:
        shown.setdefault((f.kind, f.victim, f.seen_in, f.canary), set()).add(database_of(_file_of(f.location)))
    kept = read_index(out)
    where: dict[str, tuple[str, str, str]] = {}  # version id -> (owner, path in the owner's home, file label)
    holders: dict[str, set[str]] = {}  # content (sha256) -> every file (label) that held it
    versions_of: Counter[str] = Counter()  # file (label) -> how many versions of it were kept
    for v in kept:
        path = Path(os.path.abspath(out / v.path))
        owner = owner_of(path, homes)
        if owner is not None:
            rel = path.relative_to(homes[owner]).as_posix()
            label = database_of(scan.redacted_path(matcher, rel))
            where[v.id] = (owner, rel, label)
            holders.setdefault(v.sha256, set()).add(label)
            versions_of[label] += 1
    # a content several files held (a temporary file renamed into place) is reported at the file that had the
    # most versions (the checkpoint, not its temporary file's random name), so its incident is the same each run
    canonical = {sha: min(files, key=lambda f: (-versions_of[f], f)) for sha, files in holders.items()}
    findings: dict[tuple[Any, ...], Finding] = {}
    skipped: list[stream.NotInspected] = []
    for v in kept:
        if v.id not in where:
            continue
        owner, rel, label = where[v.id]
        if label != canonical[v.sha256]:
            continue
        mine = (planted or {}).get(owner, frozenset())
        result = scan.scan_copy(out / FOLDER / v.id, rel, matcher, owner, limits, mine)
        skipped += [replace(n, path=f"{n.path} ({MARK} {v.id})", partial=False) for n in result.not_inspected
                    if not n.reason.startswith("sqlite: cannot")]  # a copy taken mid-write: its raw bytes were read
        for f in result.findings:
            if shown.get((f.kind, f.victim, f.seen_in, f.canary), set()) & holders[v.sha256]:
                continue
            key = (f.kind, f.victim, f.seen_in, f.canary, f.encoding, database_of(_file_of(f.location)),
                   stretch(v.time))
            findings.setdefault(key, replace(f, location=f"{f.location} ({MARK} {v.id}, gone at the end)",
                                             transient=True, time=v.time))
    return list(findings.values()), len(kept), skipped


def version_of(finding: Finding) -> str | None:
    """The kept version a transient finding was seen in."""
    if not finding.transient or f"({MARK} " not in finding.location:
        return None
    return finding.location.rsplit(f"({MARK} ", 1)[1].split(",", 1)[0]


def _file_of(location: str) -> str:
    """The file a home finding's location is in: up to its first layer (`@OFFSET`, `:sqlite:...`, `:name@`)."""
    return re.split(r"@\d|:(?:sqlite:|name@|target@)", location, maxsplit=1)[0]


def database_of(label: str) -> str:
    """A SQLite side file's database (the database's scan reads it); any other file itself."""
    return re.sub(r"-(?:wal|journal|shm)$", "", label)

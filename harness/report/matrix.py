"""The release matrix (`matrix.json`): per incident and per finding class x Hermes release, how often it was seen.

The inputs are cells, one per (release, scenario, run): the audit's verdict and the incidents and finding
classes it saw, or `n/a` with the reason it could not run (the release does not install, the scenario needs a
feature the release lacks). Everything else is derived from the cells alone, so the shards of a matrix merge
into the matrix an unsharded run would have written: per incident, per class and release `seen k/N` (with a 95%
Wilson interval when N > 1), `not seen`, or `n/a` with a reason; the first and last release each was seen in.
A matrix.json written before incidents has none: it is read, with no incident rows.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from packaging.version import InvalidVersion, Version

from harness.core.findings import FINGERPRINT_VERSION, Finding
from harness.core.severity import rank, severity
from harness.report.result import IncidentRow

#: The version of the `matrix.json` layout (docs/contracts.md).
VERSION = 1
NA = "n/a"
Z95 = 1.959963984540054  # the standard normal quantile of a two-sided 95% interval


class MatrixError(ValueError):
    """A matrix.json that cannot be read or merged; one line."""


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for k successes in n trials (stays inside [0, 1], sane at k = 0 and k = n)."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n > 0, got {k}/{n}")
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return round(max(0.0, centre - half), 3), round(min(1.0, centre + half), 3)


def release_key(release: str) -> tuple[int, Version | str]:
    """Releases in version order (a string that is not a version sorts after every version)."""
    try:
        return (0, Version(release))
    except InvalidVersion:
        return (1, release)


def class_of(f: Finding) -> dict[str, Any]:
    """A finding class as the matrix lists it: the fingerprint's fields, its severity, tool and service."""
    return {"kind": f.kind, "victim": f.victim, "seen_in": f.seen_in, "canary": f.canary, "channel": f.channel,
            "scenario": f.scenario, "phase": f.phase, "severity": severity(f), "tool": f.tool, "service": f.service}


def incident_of(row: IncidentRow) -> dict[str, Any]:
    """An incident as the matrix lists it: its entry point, kinds, severity, F-numbers and first hop (with the
    tool and service its first hop names, for `n/a`)."""
    i, f = row.incident, row.incident.first
    return {"entry": i.entry, "kinds": i.kinds, "severity": i.severity, "documented": row.documented,
            "victim": f.victim, "seen_in": f.seen_in, "scenario": f.scenario, "phase": f.phase, "tool": f.tool,
            "service": f.service}


@dataclass
class Cell:
    """One (release, scenario, run) of the plan: an audit's outcome, or why it could not run."""

    release: str
    scenario: str
    run: int  # 1-based
    status: str  # the audit's verdict (clean, leak, inconclusive) or `n/a`
    reason: str = ""  # why n/a; for an inconclusive run its first reason (redacted)
    turns_ok: int = 0  # completed turns: a run that completed none drove nothing
    classes: dict[str, dict[str, Any]] = field(default_factory=dict)  # fingerprint -> class_of
    not_offered: dict[str, list[str]] = field(default_factory=dict)  # scenario -> tools no request advertised
    services_na: dict[str, str] = field(default_factory=dict)  # service -> why the release cannot use it
    evidence: str | None = None  # the run's evidence folder, relative to the matrix folder that ran it
    incidents: dict[str, dict[str, Any]] = field(default_factory=dict)  # incident id -> incident_of
    #: the lock the release's venv was installed from (`hermes-lock` of the run's versions), and how the venv
    #: differed from it, if it did (the run's evidence folder records every distribution)
    venv: str = ""

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.release, self.scenario, self.run)

    @property
    def drove(self) -> bool:
        return self.status != NA and self.turns_ok > 0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Cell:
        try:
            return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
        except TypeError as exc:
            raise MatrixError(f"matrix: malformed cell {data!r:.80}: {exc}") from None


@dataclass(frozen=True)
class Plan:
    """What the matrix covers: every release x scenario x run."""

    releases: tuple[str, ...]
    scenarios: tuple[str, ...]
    runs: int
    tools: tuple[str, ...] | None = None  # battery groups (None: every group)
    phases: tuple[str, ...] | None = None  # multi-profile phases (None: each scenario's default)
    services: tuple[str, ...] | None = None  # services besides the provider (None: every one)
    unset: tuple[str, ...] = ()  # settings a tenant leaves unset in every run (`--unset`; none: every tenant sets all)

    def cell_keys(self) -> list[tuple[str, str, int]]:
        """Every cell of the plan in a fixed order: releases by version, scenarios as given, runs 1..N."""
        return [(r, s, i) for r in sorted(self.releases, key=release_key) for s in self.scenarios
                for i in range(1, self.runs + 1)]

    def to_dict(self) -> dict[str, Any]:
        return {"releases": sorted(self.releases, key=release_key), "scenarios": list(self.scenarios),
                "runs": self.runs, "tools": None if self.tools is None else list(self.tools),
                "phases": None if self.phases is None else list(self.phases),
                "services": None if self.services is None else list(self.services), "unset": list(self.unset)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        try:
            tools, phases = data["tools"], data.get("phases")  # a matrix from before --phases has none
            services = data.get("services", ())  # a matrix from before the services stubbed none
            return cls(tuple(data["releases"]), tuple(data["scenarios"]), int(data["runs"]),
                       None if tools is None else tuple(tools), None if phases is None else tuple(phases),
                       None if services is None else tuple(services),
                       tuple(data.get("unset", ())))  # a matrix from before --unset left nothing unset
        except (KeyError, TypeError, ValueError) as exc:
            raise MatrixError(f"matrix: malformed plan ({type(exc).__name__}: {exc})") from None


def shard_keys(plan: Plan, index: int, count: int) -> list[tuple[str, str, int]]:
    """Shard `index` of `count` (1-based): every count-th cell of the plan, so each shard gets a share of
    every release and scenario."""
    return [k for n, k in enumerate(plan.cell_keys()) if n % count == index - 1]


def row_cell(cls: dict[str, Any], release: str, cells: list[Cell], fingerprint: str,
             key: str = "classes") -> dict[str, Any]:
    """One class (or, `key` "incidents", incident) x release: `seen` k/N, `not seen` 0/N (N: the runs that drove
    something) or `n/a`."""
    if not cells:
        return {"state": NA, "reason": "not run in this shard"}
    drove = [c for c in cells if c.drove]
    if not drove:
        first = next((c for c in cells if c.status == NA), None)
        reason = first.reason if first else f"no turn completed ({cells[0].reason or cells[0].status})"
        return {"state": NA, "reason": reason}
    k, n = sum(fingerprint in getattr(c, key) for c in drove), len(drove)
    tool = cls.get("tool")
    if not k and tool and all(tool in c.not_offered.get(cls["scenario"], []) for c in drove):
        return {"state": NA, "reason": f"hermes-agent {release} does not offer the tool {tool}"}
    service = cls.get("service")
    if not k and service and all(service in c.services_na for c in drove):
        return {"state": NA, "reason": f"hermes-agent {release} cannot use the service {service}: "
                                       f"{drove[0].services_na[service]}"}
    return {"state": "seen" if k else "not seen", "seen": k, "runs": n,
            "interval": list(wilson(k, n)) if n > 1 else None}


def _rows(plan: Plan, cells: list[Cell], key: str, name: str) -> list[dict[str, Any]]:
    """One row per class (`key` "classes", `name` "fingerprint") or incident ("incidents", "id") of any cell: its
    cells per release and the first and last release it was seen in."""
    releases = sorted(plan.releases, key=release_key)
    items: dict[str, tuple[str, dict[str, Any]]] = {}  # fingerprint or id -> (the audit scenario, what it is)
    numbers: dict[str, set[str]] = {}  # an incident's F-numbers in any cell (each release's crossings differ)
    for c in sorted(cells, key=lambda c: (release_key(c.release), c.scenario, c.run)):
        for ident, item in getattr(c, key).items():
            items.setdefault(ident, (c.scenario, item))
            numbers.setdefault(ident, set()).update(item.get("documented") or ())
    out = []
    for ident, (scenario, item) in items.items():
        if "documented" in item:
            item = {**item, "documented": sorted(numbers[ident], key=lambda n: int(n.lstrip("F")))}
        per = {r: row_cell(item, r, [c for c in cells if c.release == r and c.scenario == scenario], ident, key)
               for r in releases}
        seen = [r for r in releases if per[r]["state"] == "seen"]
        out.append({name: ident, **item, "audit": scenario, "cells": per,
                    "first_seen": seen[0] if seen else None, "last_seen": seen[-1] if seen else None})
    return out


def rows(plan: Plan, cells: list[Cell]) -> list[dict[str, Any]]:
    """One row per finding class (fingerprint), the most severe first."""
    return sorted(_rows(plan, cells, "classes", "fingerprint"),
                  key=lambda r: (rank(r["severity"]), r["scenario"] or "", r["phase"] or "", r["kind"],
                                 r["victim"] or "", r["seen_in"] or "", r["canary"] or "", r["channel"]))


def incident_rows(plan: Plan, cells: list[Cell]) -> list[dict[str, Any]]:
    """One row per incident (its id: the entry point), the most severe first, then by audit and entry point."""
    return sorted(_rows(plan, cells, "incidents", "id"),
                  key=lambda r: (rank(r["severity"]), r["audit"], r["entry"]))


def status(cells: list[Cell]) -> str:
    """The matrix's verdict: `leak` if any run leaked, else `inconclusive` if any run was inconclusive or no
    run drove anything, else `clean` (`n/a` cells do not count)."""
    ran = [c for c in cells if c.status != NA]
    if any(c.status == "leak" for c in ran):
        return "leak"
    if not any(c.drove for c in ran) or any(c.status == "inconclusive" for c in ran):
        return "inconclusive"
    return "clean"


def document(plan: Plan, cells: list[Cell], shard: str | None = None) -> dict[str, Any]:
    """The whole `matrix.json`: plan, cells in plan order, derived rows and verdict."""
    order = {k: n for n, k in enumerate(plan.cell_keys())}
    stray = [c.key for c in cells if c.key not in order]
    if stray:
        raise MatrixError(f"matrix: cell {'/'.join(map(str, stray[0]))} is not in the plan")
    cells = sorted(cells, key=lambda c: order[c.key])
    return {"version": VERSION, "tool": "tenancy-audit", "fingerprint_version": FINGERPRINT_VERSION,
            "plan": plan.to_dict(), "shard": shard, "complete": len(cells) == len(order),
            "status": status(cells), "cells": [asdict(c) for c in cells], "rows": rows(plan, cells),
            "incidents": incident_rows(plan, cells)}


def dumps(doc: dict[str, Any]) -> str:
    """`matrix.json` text with one line per cell and per row, so a committed matrix diffs line by line."""
    fields = []
    for key, value in doc.items():
        if isinstance(value, list) and value:
            items = ",\n".join("    " + json.dumps(item) for item in value)
            fields.append(f"  {json.dumps(key)}: [\n{items}\n  ]")
        else:
            fields.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(fields) + "\n}\n"


def load_document(doc: Any, where: str) -> tuple[Plan, list[Cell]]:
    """The plan and cells of a parsed `matrix.json` (MatrixError if it is not one)."""
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("cells"), list):
        raise MatrixError(f"matrix: {where} is not a version-{VERSION} matrix.json")
    return Plan.from_dict(doc.get("plan") or {}), [Cell.from_dict(c) for c in doc["cells"]]


def merge(parts: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One matrix from the matrix.json of every shard (`(where, doc)`): same plan, each cell exactly once."""
    plan: Plan | None = None
    cells: dict[tuple[str, str, int], Cell] = {}
    for where, doc in parts:
        p, part = load_document(doc, where)
        if doc.get("fingerprint_version") != FINGERPRINT_VERSION:
            raise MatrixError(f"merge: {where} holds version-{doc.get('fingerprint_version')} fingerprints, not "
                              f"version {FINGERPRINT_VERSION}: run its shard again")
        if plan is not None and p != plan:
            raise MatrixError(f"merge: {where} covers another plan than the first shard")
        plan = p
        for c in part:
            if c.key in cells:
                raise MatrixError(f"merge: cell {c.release}/{c.scenario}/run-{c.run} is in two shards ({where})")
            cells[c.key] = c
    if plan is None:
        raise MatrixError("merge: no shard given")
    missing = [k for k in plan.cell_keys() if k not in cells]
    if missing:
        r, s, i = missing[0]
        raise MatrixError(f"merge: {len(missing)} cell(s) of the plan are in no shard (e.g. {r}/{s}/run-{i}); "
                          "pass every shard")
    return document(plan, list(cells.values()))


def cell_text(cell: dict[str, Any]) -> str:
    """A row cell for people: `seen 2/3 (95% CI 21-94%)`, `not seen (0/3, 95% CI 0-56%)`, `n/a: reason`."""
    if cell["state"] == NA:
        return f"n/a: {cell['reason']}"
    ci = cell.get("interval")
    interval = f"95% CI {round(ci[0] * 100)}-{round(ci[1] * 100)}%" if ci else ""
    if cell["state"] == "seen":
        return f"seen {cell['seen']}/{cell['runs']}" + (f" ({interval})" if interval else "")
    return "not seen" + (f" (0/{cell['runs']}, {interval})" if interval else "")


def run_text(cells: list[Cell]) -> str:
    """What the runs of one release x scenario were: `leak 2/2`, `inconclusive 1/2`, `n/a: reason`."""
    if not cells:
        return "-"
    ran = [c for c in cells if c.status != NA]
    if not ran:
        return f"n/a: {cells[0].reason}"
    counts: dict[str, int] = {}
    for c in ran:
        counts[c.status] = counts.get(c.status, 0) + 1
    text = ", ".join(f"{s} {n}/{len(cells)}" for s, n in sorted(counts.items()))
    idle = sum(not c.drove for c in ran)
    return text + (f" ({idle} completed no turn)" if idle else "")

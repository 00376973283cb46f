"""Isolation policies: the surfaces an agent shares between tenants by design, which are not leaks.

A policy (YAML, docs/contracts.md) lists `shared` entries, each naming one surface (`tool`, `service` or
`channel`), optionally the directions (`from`/`to`: `launch`, `profile` or `any`, as the victim and the
recipient are the launch profile or another one) and the finding kinds it covers, with `why` and the
`source` it cites. A crossing (`detect.incidents`) on such a surface is *allowed*, and so is every copy it
explains (the later requests, files and logs it spread to); everything else stays what it was. An entry with
`paths` (path canary kinds: `home`) allows instead the path of its tool's shared store: a launch home that a path
into that store continues (`Finding.store`) is where the shared object lives, not the home's data; each is allowed
alone (it explains no other copy), and another canary or another path of the same home stays a leak. Allowed
findings never fail a run, are reported in their own section and keep their evidence; their fingerprints
carry the entry (`Finding.scope`), so a baseline cannot stand in for a policy. `strict` is the empty policy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from harness.core.findings import KINDS, Finding
from harness.core.registry import is_path_kind
from harness.detect.incidents import build

VERSION = 1
STRICT = "strict"
DEFAULT = "hermes"
_ROLES = ("any", "launch", "profile")
_SURFACES = ("tool", "service", "channel")
_FIELDS = {*_SURFACES, "id", "from", "to", "kinds", "paths", "why", "source"}


class PolicyError(ValueError):
    """A policy file is missing or malformed; the message is one line."""


@dataclass(frozen=True)
class Shared:
    """One surface shared by design."""

    id: str
    surface: str  # tool, service or channel
    name: str
    victim: str = "any"  # `from`: whose data
    recipient: str = "any"  # `to`: whose context
    kinds: frozenset[str] = frozenset()  # empty: every kind
    why: str = ""
    source: str = ""
    paths: frozenset[str] = frozenset()  # path canary kinds naming the tool's store; empty: a crossing entry

    def allows(self, f: Finding, launch: str) -> bool:
        """Whether `f` crossed on this surface (with `paths`: names its tool's store by one of those canaries), in a
        direction and of a kind this entry covers."""
        if self.paths:
            on = f.store if f.canary in self.paths else None
        else:
            on = {"tool": f.tool, "service": f.service, "channel": f.channel}[self.surface]
        return (on == self.name and (not self.kinds or f.kind in self.kinds)
                and _role(f.victim, launch, self.victim) and _role(f.seen_in, launch, self.recipient))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, self.surface: self.name, "from": self.victim, "to": self.recipient}
        if self.kinds:
            out["kinds"] = sorted(self.kinds)
        if self.paths:
            out["paths"] = sorted(self.paths)
        return {**out, "why": self.why, "source": self.source}


def _role(tenant: str | None, launch: str, role: str) -> bool:
    return role == "any" or (tenant is not None and (tenant == launch) == (role == "launch"))


@dataclass(frozen=True)
class Policy:
    name: str
    shared: tuple[Shared, ...] = ()

    def apply(self, findings: list[Finding], launch: str) -> tuple[list[Finding], list[Finding]]:
        """(findings it leaves as they are, findings it allows: scoped to their entry). A crossing an entry
        covers is allowed, with the copies it explains; a path of a shared store (a `paths` entry) alone, as its
        tool's."""
        if not self.shared:
            return findings, []
        named = {id(f): e for f in findings if (e := next((e for e in self.shared if e.paths and e.allows(f, launch)),
                                                              None))}
        scope = {n: f"allowed:{self.name}/{e.id}" for n, e in named.items()}
        for incident in build([f for f in findings if id(f) not in named]):
            for crossing in incident.crossings:
                entry = next((e for e in self.shared if e.allows(crossing, launch)), None)
                if entry is not None:
                    scope[id(crossing)] = f"allowed:{self.name}/{entry.id}"
            for copy, crossing in zip(incident.spread, incident.via, strict=True):
                if id(crossing) in scope:
                    scope[id(copy)] = scope[id(crossing)]
        kept = [f for f in findings if id(f) not in scope]
        return kept, [replace(f, scope=scope[id(f)], tool=named[id(f)].name if id(f) in named else f.tool)
                      for f in findings if id(f) in scope]

    def to_dict(self) -> dict[str, Any]:
        return {"version": VERSION, "name": self.name, "shared": [e.to_dict() for e in self.shared]}


def parse(text: str, where: str) -> Policy:
    """A policy from its YAML; any problem is a one-line PolicyError naming `where`."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise PolicyError(f"policy {where}: not valid YAML{f' at line {mark.line + 1}' if mark else ''}") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise PolicyError(f"policy {where}: must be a mapping with version: {VERSION}, name and shared")
    name, shared = doc.get("name"), doc.get("shared") or []
    if not isinstance(name, str) or not name or not isinstance(shared, list):
        raise PolicyError(f"policy {where}: needs a name and a list `shared`")
    entries = [_entry(e, n, where) for n, e in enumerate(shared, 1)]
    return Policy(name, tuple(entries))


def _entry(spec: Any, n: int, where: str) -> Shared:
    at = f"policy {where}: shared entry {n}"
    if not isinstance(spec, dict):
        raise PolicyError(f"{at}: must be a mapping")
    unknown = set(map(str, spec)) - _FIELDS
    if unknown:
        raise PolicyError(f"{at}: unknown field {sorted(unknown)[0]!r}")
    surfaces = [s for s in _SURFACES if s in spec]
    if len(surfaces) != 1 or not isinstance(spec[surfaces[0]], str):
        raise PolicyError(f"{at}: names exactly one of tool, service or channel")
    for field in ("from", "to"):
        if spec.get(field, "any") not in _ROLES:
            raise PolicyError(f"{at}: {field} must be one of {', '.join(_ROLES)}")
    kinds = spec.get("kinds") or []
    if not isinstance(kinds, list) or not set(kinds) <= KINDS:
        raise PolicyError(f"{at}: kinds must be a list of finding kinds")
    paths = spec.get("paths") or []
    if not isinstance(paths, list) or not all(isinstance(p, str) and is_path_kind(p) for p in paths):
        raise PolicyError(f"{at}: paths must be a list of path canary kinds (home)")
    if paths and surfaces != ["tool"]:
        raise PolicyError(f"{at}: paths name a tool's store: only with tool")
    for field in ("why", "source"):
        if not isinstance(spec.get(field), str) or not spec[field].strip():
            raise PolicyError(f"{at}: needs a {field} (what makes it shared by design, and where that is said)")
    surface = surfaces[0]
    ident = spec.get("id") or f"{spec[surface]}-{n}"
    if not isinstance(ident, str):
        raise PolicyError(f"{at}: id must be a string")
    return Shared(ident, surface, spec[surface], spec.get("from", "any"), spec.get("to", "any"),
                  frozenset(kinds), spec["why"].strip(), spec["source"].strip(), frozenset(paths))


def load(choice: str | Path) -> Policy:
    """`strict` (nothing shared), `hermes` (the default policy shipped for Hermes) or a policy file."""
    if str(choice) == STRICT:
        return Policy(STRICT)
    if str(choice) == DEFAULT:
        return parse(resources.files("harness.report").joinpath("policies/hermes.yaml").read_text(), DEFAULT)
    path = Path(choice)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PolicyError(f"policy {path}: does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"policy {path}: cannot be read ({type(exc).__name__})") from None
    return parse(text, str(path))

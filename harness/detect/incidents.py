"""Incidents: where a tenant's data first entered another tenant's context, and what that explains.

Every finding is a *crossing* or *spread*. A crossing is where data entered another tenant's context through
an entry point (`entry_point`): a tool (its result, its subprocess's env), a service (an MCP server, a memory
provider, ...), the provider (a key, a model) or a channel (an RPC reply, a prompt, a file). A *copy*
(`request_leak`, `response_leak`, `text_leak`, `file_leak`) is spread when an earlier crossing explains it
(`explains`: same victim, recipient and canary kind, in the same context, through the same entry point when
the copy names one); a copy nothing explains is a crossing itself. A derived canary the recipient's own model
generated from the victim's data (`derived_TEXT_via_RECIPIENT`, `stubs.derived`) is a copy of whatever of the
victim's had crossed into the recipient before: any earlier crossing between the two explains it, in any scenario.
An incident is every crossing through one entry point (what a fix changes: that tool, that service's client, ...),
with the spread they explain; its first hop is its earliest crossing.

Evidence order is each finding's `time` (a flow's start, an RPC frame's, a service record's line; files and
logs, read at the end of the run, have none). Pure and deterministic: the same findings, in any order, give the
same incidents, so `reconcile` reproduces a run's incidents exactly. docs/findings.md#incidents has the rule.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from harness.core.derived import is_derived_kind
from harness.core.findings import Finding
from harness.core.registry import PROVIDER
from harness.core.severity import rank, severity
from harness.detect.file_versions import database_of

#: Finding kinds that copy a canary from somewhere: spread when an earlier crossing explains them.
COPIES = frozenset({"request_leak", "response_leak", "text_leak", "file_leak"})
#: Channels read at the end of the run (no time): every crossing happened before them.
_AT_END = frozenset({"file", "log"})
_PATH = re.compile(r"[^@:#]+")
#: Entry points named by the finding's kind (when it names no service or tool).
_KIND_ENTRY = {"wrong_key": PROVIDER, "wrong_model": PROVIDER, "route_auth": "route", "egress": "egress",
               "bypass": "bypass", "shortfall": "shortfall"}
#: Servers other than the API server whose routes a `route_auth` finding names (its location `SERVER:...`): each
#: is an entry point of its own (`route SERVER`); the API server's routes are `route`.
ROUTE_SERVERS = frozenset({"dashboard"})
#: What crossed through the gateway's webhook listener (`drive.phases.webhooks`): a route's turn in another profile,
#: on another provider, its reply through another profile's bot (the launch profile's, or one it borrowed) or in
#: another profile's channel.
WEBHOOK_BLEEDS = ("webhook_route", "webhook_turn", "webhook_bot", "webhook_borrowed_bot", "webhook_channel")
#: Entry points named by the setting a profile bleed carried, before its tool: an approval (given, or seeded in a
#: command allowlist) is a root cause of its own, not the terminal's environment the command ran in; so is a run of
#: one profile another controlled, a kanban board pointer and a kanban worker's profile (`drive.kanban`), the
#: toolsets a profile's model is offered (`drive.toolsets`) and the webhook listener (`WEBHOOK_BLEEDS`).
_SETTING_ENTRY = {"approval": "approval", "command_allowlist": "approval", "redaction": "redaction",
                  "run_control": "run", "kanban_board": "kanban board", "kanban_worker": "kanban worker",
                  "toolsets": "toolsets", **{k: "webhook" for k in WEBHOOK_BLEEDS}}


def entry_point(f: Finding) -> str:
    """Where the finding's data entered: its carrier when it has one (`conversation`: another tenant's conversation
    sent whole, `detect.carriers`), else `service NAME`, `tool NAME`, `provider` (a key or model), `route` (an API
    server's route; `route dashboard`: the dashboard's), `approval` (an approval given in one profile that took
    effect in another; `redaction`, `kanban board`, `kanban worker`, `toolsets`, `webhook` likewise), `run` (another
    profile's run stopped or approved on one profile's route), `file PATH` / `log NAME` (a copy found there; a
    database's WAL or journal counts as the database), or its channel (`rpc`, `request`, ...); `egress`, `bypass`
    and `shortfall` are their own."""
    return f.carrier or own_entry(f)


def own_entry(f: Finding) -> str:
    """The entry point a finding names itself, its carrier aside: what `entry_point` gave before carriers were
    told apart (a baseline's incident of a tool a conversation carried is still known: `report.baseline`)."""
    if f.canary in _SETTING_ENTRY and f.kind == "profile_bleed":
        return _SETTING_ENTRY[f.canary]
    if f.service:
        return f"service {f.service}"
    if f.tool:
        return f"tool {f.tool}"
    if f.kind == "route_auth" and (server := f.location.partition(":")[0]) in ROUTE_SERVERS:
        return f"route {server}"
    if f.kind in _KIND_ENTRY:
        return _KIND_ENTRY[f.kind]
    if f.kind in COPIES and f.channel in _AT_END and (m := _PATH.match(f.location)):
        # which side file holds a page when the homes are read is SQLite's checkpoint timing, not another crossing
        return f"{f.channel} {database_of(m[0])}"
    return f.channel


def _when(f: Finding) -> float:
    return math.inf if f.time is None else f.time


def _source(f: Finding) -> tuple[str | None, str | None, str | None]:
    return (f.victim, f.seen_in, f.canary)


def _made_there(f: Finding) -> bool:
    """A derived canary its recipient's model generated from its victim's data (it holds what had crossed)."""
    return (f.canary is not None and f.seen_in is not None and is_derived_kind(f.canary)
            and f.canary.endswith("_via_" + f.seen_in.replace("-", "_")))


def explains(crossing: Finding, copy: Finding) -> bool:
    """Whether `crossing` explains `copy`: a copy of the same victim, recipient and canary kind; a file or log copy,
    read at the end, by any such crossing through the same entry point when it names a tool; an RPC frame by one
    of its scenario in its phase or before (a frame relays a tool's result before the provider sees it); a
    request or response by one of its scenario (any, at a service: its store outlives the backend) not later,
    through the same entry point when it names a tool or service (a later request re-sending a result; through a
    carrier, the same tool too: what an isolation policy allows of a tool stays the tool's); a derived canary its
    recipient's model made, by one of any scenario not later. A home that names a tool's store (`Finding.store`: a
    place, not data) explains only copies naming the same store; one that is the store's (its `tool`: an isolation
    policy allowed it as the path of a shared store, `report.policy`) is explained by nothing else either."""
    if copy.kind not in COPIES or copy.canary is None or (crossing.victim, crossing.seen_in) != (
            copy.victim, copy.seen_in):
        return False
    if (crossing.store is not None or (copy.store is not None and copy.tool == copy.store)) and (
            crossing.store != copy.store):
        return False
    made_there = _made_there(copy)
    if crossing.canary != copy.canary and not made_there:
        return False
    through = made_there or not (copy.tool or copy.service) or (entry_point(crossing) == entry_point(copy)
                                                                and own_entry(crossing) == own_entry(copy))
    if copy.channel in _AT_END:
        return through
    # What the recipient's own model made stays in the recipient's own stores (its memory, its sessions), which
    # outlive one door of `all`: a crossing of any scenario before it explains it
    same_context = made_there or crossing.scenario == copy.scenario
    if copy.channel == "rpc":
        same_phase = crossing.scenario == copy.scenario and crossing.phase == copy.phase
        return same_context and (same_phase or _when(crossing) <= _when(copy))
    return (same_context or copy.service is not None) and _when(crossing) <= _when(copy) and through


@dataclass
class Incident:
    """Every crossing through one entry point, in evidence order, and the spread they explain."""

    entry: str
    crossings: list[Finding] = field(default_factory=list)
    spread: list[Finding] = field(default_factory=list)
    via: list[Finding] = field(default_factory=list)  # the crossing that explains each of `spread`, in its order

    @property
    def id(self) -> str:
        """Stable across runs: its entry point (never a direction, time or location)."""
        return hashlib.sha256(f"incident|{self.entry}".encode()).hexdigest()[:16]

    @property
    def first(self) -> Finding:
        """The first hop: the earliest crossing."""
        return self.crossings[0]

    @property
    def findings(self) -> list[Finding]:
        return self.crossings + self.spread

    @property
    def kinds(self) -> list[str]:
        """The kinds of its crossings, the first hop's first."""
        return list(dict.fromkeys(f.kind for f in self.crossings))

    @property
    def worst(self) -> Finding:
        """Its most severe crossing (the earliest of them): what crossed at its worst."""
        return min(self.crossings, key=lambda f: rank(severity(f)))

    @property
    def severity(self) -> str:
        """How bad what crossed is: its most severe crossing's severity."""
        return severity(self.worst)

    @property
    def carrier(self) -> str | None:
        """What carried its data across when that was not a tool (`conversation`), else None."""
        return self.first.carrier

    @property
    def tools(self) -> list[str]:
        """The tools whose data it holds, in evidence order (through a carrier: every tool the carrier held)."""
        return list(dict.fromkeys(f.tool for f in self.findings if f.tool))

    @property
    def canaries(self) -> list[str]:
        return sorted({f.canary for f in self.findings if f.canary})

    @property
    def directions(self) -> list[tuple[str | None, str | None]]:
        """(victim, recipient) of its crossings, in the order they first crossed."""
        return list(dict.fromkeys((f.victim, f.seen_in) for f in self.crossings))

    @property
    def scenarios(self) -> list[str]:
        """The scenarios it crossed in, in order."""
        return list(dict.fromkeys(f.scenario for f in self.crossings if f.scenario))

    def summary(self) -> dict[str, Any]:
        """The incident as `findings.json` lists it: its first hop, reach and classes (fingerprint ->
        crossings and spread); through a carrier, the tools it held."""
        classes: dict[str, dict[str, int]] = {}
        for role, found in (("crossings", self.crossings), ("spread", self.spread)):
            for f in found:
                counts = classes.setdefault(f.fingerprint(), {"crossings": 0, "spread": 0})
                counts[role] += 1
        carried = {"tools": self.tools} if self.carrier else {}  # the tools a carrier held (no key otherwise)
        return {"id": self.id, "entry": self.entry, "kinds": self.kinds, "severity": self.severity,
                "first": self.first.to_dict(), "directions": [list(d) for d in self.directions],
                "scenarios": self.scenarios, "canaries": self.canaries, "crossings": len(self.crossings),
                "spread": spread_counts(self.spread), **carried, "classes": classes}


def spread_counts(spread: Iterable[Finding]) -> dict[str, int]:
    """Spread per channel, in channel order of first appearance."""
    counts: dict[str, int] = {}
    for f in spread:
        counts[f.channel] = counts.get(f.channel, 0) + 1
    return counts


def _order(f: Finding) -> tuple[Any, ...]:
    """Evidence order: time, crossings before copies at the same moment, then the finding itself (a total order,
    so the input's order never matters)."""
    return (_when(f), f.kind in COPIES, f.location, f.kind, f.victim or "", f.seen_in or "", f.canary or "",
            f.channel, f.encoding or "", f.tool or "", f.service or "", f.scenario or "", f.phase or "", f.detail,
            f.evidence)


def _late(f: Finding) -> bool:
    """A copy judged once every timed crossing is known: read at the end, or relayed before the provider saw it."""
    return f.kind in COPIES and (f.channel in _AT_END or f.channel == "rpc")


def build(findings: Iterable[Finding]) -> list[Incident]:
    """The incidents of a run's findings, in the order of their first hops."""
    found = sorted(findings, key=_order)
    incidents: dict[str, Incident] = {}
    crossed: dict[tuple[str | None, str | None, str | None], list[tuple[Finding, Incident]]] = {}
    between: dict[tuple[str | None, str | None], list[tuple[Finding, Incident]]] = {}  # by (victim, recipient)
    for f in [f for f in found if not _late(f)] + [f for f in found if _late(f)]:
        candidates = between.get((f.victim, f.seen_in), []) if _made_there(f) else crossed.get(_source(f), [])
        source = next(((c, inc) for c, inc in candidates if explains(c, f)), None)
        if source is not None:
            source[1].spread.append(f)
            source[1].via.append(source[0])
            continue
        entry = entry_point(f)
        incident = incidents.setdefault(entry, Incident(entry))
        incident.crossings.append(f)
        crossed.setdefault(_source(f), []).append((f, incident))
        between.setdefault((f.victim, f.seen_in), []).append((f, incident))
    return sorted(incidents.values(), key=lambda i: _order(i.first))

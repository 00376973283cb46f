"""Findings: what the audit reports, and the verdict/exit code they add up to."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field, replace
from typing import Any

KINDS = frozenset(
    {
        "wrong_key",
        "wrong_model",
        "wrong_identity",
        "request_leak",
        "response_leak",
        "env_leak",
        "wrong_cwd",
        "wrong_path",
        "file_leak",
        "text_leak",
        "egress",
        "route_auth",
        "profile_bleed",
        "bypass",
        "shortfall",
    }
)
CHANNELS = ("request", "response", "env", "file", "log", "rpc")
#: Kinds that mean the run could not prove anything, rather than that tenants crossed.
INCONCLUSIVE_KINDS = frozenset({"shortfall", "bypass"})

EXIT_CLEAN, EXIT_LEAK, EXIT_ERROR, EXIT_INCONCLUSIVE = 0, 1, 2, 3
#: What `Finding.fingerprint()` hashes; bumped when that changes (SARIF `tenancyFingerprint/vN`, baselines).
FINGERPRINT_VERSION = 3


@dataclass(frozen=True)
class Finding:
    """One violated invariant, with evidence in which every secret is already redacted."""

    kind: str
    victim: str | None
    seen_in: str | None
    canary: str | None
    channel: str
    location: str
    encoding: str | None = None
    evidence: str = ""
    scenario: str | None = None
    phase: str | None = None
    detail: str = ""
    tool: str | None = None  # the tool whose result, arguments or writes carried it, when known
    service: str | None = None  # the tenant's service (other than its provider) whose traffic carried it
    time: float | None = None  # when the evidence shows it (a flow's start, an RPC frame); None: a file, a log
    scope: str = ""  # `allowed:<policy>/<entry>` when an isolation policy declares its surface shared by design
    transient: bool = False  # seen in a version of a file that was gone by the end of the run (`time`: when)
    #: What carried it across when that was not its tool: `conversation`, another tenant's conversation sent whole
    #: (`detect.carriers`). Not part of its class (fingerprint): the same finding, grouped by its carrier.
    carrier: str | None = None
    #: The tool whose store a `home`'s path goes on into (`<home>/kanban/boards/...` in an RPC reply: the board's
    #: database, `detect.tools.store_named`): a place named, which an isolation policy's `paths` entry allows and
    #: `detect.incidents.explains` keeps apart. Not part of its class.
    store: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown finding kind {self.kind!r}")
        if self.channel not in CHANNELS:
            raise ValueError(f"unknown channel {self.channel!r}")

    def fingerprint(self) -> str:
        """The finding's class (v3): kind, victim, carrier (`seen_in`), canary kind, channel, scenario, phase,
        the service and tool that carried it, and its policy scope (a finding an isolation policy allows is of
        another class than the same finding under `--policy strict`: a baseline cannot stand in for a policy).
        Stable across runs: never a random value, offset or flow id."""
        parts = ("v3", self.kind, self.victim or "", self.seen_in or "", self.canary or "", self.channel,
                 self.scenario or "", self.phase or "", self.service or "", self.tool or "",
                 *((self.scope,) if self.scope else ()))
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]

    def fingerprint_v2(self) -> str:
        """The version-2 fingerprint (no service, no tool): only to read version-2 baselines."""
        parts = ("v2", self.kind, self.victim or "", self.seen_in or "", self.canary or "", self.channel,
                 self.scenario or "", self.phase or "")
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]

    def fingerprint_v1(self) -> str:
        """The version-1 fingerprint (no victim, no carrier): only to read version-1 baselines."""
        parts = (self.kind, self.canary or "", self.channel, self.scenario or "", self.phase or "")
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]

    def identity(self) -> tuple[Any, ...]:
        """What makes two findings the same finding (used to deduplicate)."""
        return (self.kind, self.victim, self.seen_in, self.canary, self.channel, self.location, self.encoding)

    def summary(self) -> str:
        who = f"{self.victim}'s {self.canary}" if self.canary else (self.victim or "-")
        channel = f"{self.service} {self.channel}" if self.service else self.channel
        where = f" in {self.seen_in}'s {channel}" if self.seen_in else f" ({channel})"
        enc = f" [{self.encoding}]" if self.encoding and self.encoding != "plain" else ""
        extra = f": {self.detail}" if self.detail else ""
        return f"{self.kind}: {who}{where}{enc} at {self.location}{extra}"

    def to_dict(self) -> dict[str, Any]:
        """Every field and the fingerprint; `carrier` and `store` only when it has one (findings.json as before
        otherwise)."""
        doc = asdict(self)
        for optional in ("carrier", "store"):
            if doc[optional] is None:
                del doc[optional]
        return {**doc, "fingerprint": self.fingerprint()}

    def labelled(self, scenario: str | None, phase: str | None) -> Finding:
        """The same finding with `scenario`/`phase` filled in where it has none."""
        if (self.scenario or not scenario) and (self.phase or not phase):
            return self
        return replace(self, scenario=self.scenario or scenario, phase=self.phase or phase)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in names})


def dedupe(findings: list[Finding]) -> list[Finding]:
    seen: dict[tuple[Any, ...], Finding] = {}
    for f in findings:
        seen.setdefault(f.identity(), f)
    return list(seen.values())


@dataclass
class Verdict:
    """The outcome of an audit: `clean`, `leak` or `inconclusive`, and why."""

    findings: list[Finding]
    known: list[Finding] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    allowed: list[Finding] = field(default_factory=list)  # on a surface the isolation policy shares by design

    @property
    def status(self) -> str:
        if any(f.kind not in INCONCLUSIVE_KINDS for f in self.findings):
            return "leak"
        if self.reasons or any(f.kind in INCONCLUSIVE_KINDS for f in self.findings):
            return "inconclusive"
        return "clean"

    @property
    def exit_code(self) -> int:
        return {"clean": EXIT_CLEAN, "leak": EXIT_LEAK, "inconclusive": EXIT_INCONCLUSIVE}[self.status]

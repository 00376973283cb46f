"""The run's record (`timeline.json`): what `run` saw live, typed and versioned, so that `reconcile EVIDENCE`
reaches the run's verdict from the files alone.

Version 2 adds `version` to the JSON object and renames no key. A file without `version` is version 1; a folder
written before some keys existed loads with the defaults the judge has always used for them (nothing driven,
nothing planted, no live finding or reason), and a record without `scenario` takes it from `findings.json`.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.core.files import RECORD, write_private
from harness.core.findings import Finding

#: The version `to_dict` writes.
VERSION = 2

#: Each key of the JSON object and the JSON type its value must have (null or missing: the field's default).
SHAPES: dict[str, type] = {
    "scenario": str, "hermes-agent": str, "phases": list, "turns": list, "findings": list, "reasons": list,
    "expect_snapshots": dict, "log_owners": dict, "plants": dict, "homes": dict, "tools": list, "services": dict,
    "services_to_drive": list, "launch": str, "file_versions": dict, "hermes_venv": dict, "harness_venv": dict,
    "doors": dict, "platforms": dict, "unset": dict}


class EvidenceError(ValueError):
    """An evidence file is missing or unreadable; the message is one line."""


@dataclass(frozen=True)
class Phase:
    """A named stretch of a scenario, so findings carry a stable (scenario, phase) for baselines."""

    scenario: str
    name: str
    start: float
    end: float


@dataclass(frozen=True)
class RunRecord:
    """What one run saw live (docs/contracts.md, "The run's record"). `scenario`, `hermes_agent` and `launch`
    are None when the run did not record them (the judge then uses `reconcile`, `?` and the first tenant);
    `version` is the version the record was read as (`to_dict` writes the current one)."""

    scenario: str | None = None
    hermes_agent: str | None = None
    phases: list[Phase] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)  # the timeline: one entry per turn or step
    findings: list[Finding] = field(default_factory=list)  # what drivers observed directly
    reasons: list[str] = field(default_factory=list)  # why the run may not be conclusive, observed live
    expect_snapshots: dict[str, int] = field(default_factory=dict)  # tenant -> env snapshots its turns owe
    log_owners: dict[str, str | None] = field(default_factory=dict)  # log file -> tenant (None: every tenant)
    plants: dict[str, frozenset[str]] = field(default_factory=dict)  # plant -> the finding kinds it must cause
    homes: dict[str, str] = field(default_factory=dict)  # tenant -> its home, relative to the evidence folder
    tools: list[str] = field(default_factory=list)  # the tools the battery drove
    services: dict[str, str] = field(default_factory=dict)  # service -> `on` or `n/a: <why>`
    services_to_drive: list[str] = field(default_factory=list)
    launch: str | None = None  # the launch profile
    file_versions: dict[str, Any] = field(default_factory=dict)  # how the homes were watched
    hermes_venv: dict[str, Any] = field(default_factory=dict)  # `install.venv_record` of the audited Hermes
    harness_venv: dict[str, Any] = field(default_factory=dict)  # the harness venv's distributions
    doors: dict[str, str] = field(default_factory=dict)  # front door -> `on`, `not driven: ...`, `out of scope: ...`
    version: int = VERSION
    platforms: dict[str, str] = field(default_factory=dict)  # messaging platform adapter -> as a service's, or why not
    unset: dict[str, list[str]] = field(default_factory=dict)  # tenant -> the settings it leaves unset (`--unset`)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of `timeline.json`: version 2, every key of version 1 under its old name."""
        return {
            "version": VERSION, "scenario": self.scenario, "hermes-agent": self.hermes_agent,
            "phases": [asdict(p) for p in self.phases], "turns": self.turns,
            "findings": [f.to_dict() for f in self.findings], "reasons": self.reasons,
            "expect_snapshots": self.expect_snapshots, "log_owners": self.log_owners,
            "plants": {name: sorted(kinds) for name, kinds in self.plants.items()}, "homes": self.homes,
            "tools": self.tools, "services": self.services, "services_to_drive": self.services_to_drive,
            "launch": self.launch, "file_versions": self.file_versions, "hermes_venv": self.hermes_venv,
            "harness_venv": self.harness_venv, "doors": self.doors, "platforms": self.platforms, "unset": self.unset}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = RECORD) -> RunRecord:
        """A record of any version (`where`: the file it came from, for the one-line EvidenceError)."""
        version = data.get("version", 1)
        if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= VERSION:
            raise EvidenceError(f"evidence: {where} has record version {version!r}; this tenancy-audit reads 1 to "
                                f"{VERSION}")
        got = {key: data.get(key) for key in SHAPES}
        for key, value in got.items():
            if value is not None and not isinstance(value, SHAPES[key]):
                raise EvidenceError(f"evidence: {where} is malformed ({key}: expected a JSON "
                                    f"{'object' if SHAPES[key] is dict else SHAPES[key].__name__})")
        try:
            phases = [Phase(**p) for p in got["phases"] or []]
            findings = [Finding.from_dict(d) for d in got["findings"] or []]
            plants = {name: frozenset(kinds) for name, kinds in (got["plants"] or {}).items()}
        except (TypeError, KeyError, ValueError, AttributeError) as exc:
            raise EvidenceError(f"evidence: {where} is malformed ({type(exc).__name__}: {exc})") from None
        return cls(got["scenario"], got["hermes-agent"], phases, got["turns"] or [], findings, got["reasons"] or [],
                   got["expect_snapshots"] or {}, got["log_owners"] or {}, plants, got["homes"] or {},
                   got["tools"] or [], got["services"] or {}, got["services_to_drive"] or [], got["launch"],
                   got["file_versions"] or {}, got["hermes_venv"] or {}, got["harness_venv"] or {},
                   got["doors"] or {}, version, got["platforms"] or {}, got["unset"] or {})

    @classmethod
    def read(cls, out: Path) -> RunRecord:
        """The record of an evidence folder; one without `scenario` takes it from the folder's findings.json."""
        path = out / RECORD
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise EvidenceError(f"evidence: {out} has no {RECORD} (not an evidence folder of tenancy-audit run)"
                                ) from None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise EvidenceError(f"evidence: {path} is not readable JSON ({type(exc).__name__})") from None
        if not isinstance(data, dict):
            raise EvidenceError(f"evidence: {path} is not a JSON object")
        if "scenario" not in data:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                data["scenario"] = json.loads((out / "findings.json").read_text()).get("scenario")
        return cls.from_dict(data, str(path))

    def write(self, out: Path) -> None:
        """Write it as the evidence folder's `timeline.json` (0600)."""
        write_private(out / RECORD, json.dumps(self.to_dict(), indent=2).encode())

"""How bad a finding is: its severity, the score code scanning sorts by, and where its remediation is.

The severity follows what crossed: a secret (`critical`), a tenant's private data (`high`), an identifying
but not secret value such as a path, model or title (`medium`), or only the proof of life of the run
(`low`). docs/findings.md explains each finding kind and how to fix it.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from harness.core.findings import Finding

#: docs/findings.md, shipped as package data (in the checkout `harness/core/findings.md` is a link to it).
FINDINGS_DOC = resources.files("harness.core") / "findings.md"
SEVERITIES = ("critical", "high", "medium", "low")
#: GitHub code scanning's `security-severity` (CVSS-like: >= 9 critical, >= 7 high, >= 4 medium, else low).
SECURITY_SEVERITY = {"critical": "9.5", "high": "8.0", "medium": "5.5", "low": "3.0"}

#: Canary kinds that are a tenant's private data (memory, soul, transcripts, tool data).
HIGH_CANARIES = frozenset({"memory", "soul", "cron_prompt", "shell_state", "env_marker", "transcript", "tool_data",
                           "tool_output"})
#: Canary kinds that identify a tenant without being secret or private (paths, models, titles, settings).
MEDIUM_CANARIES = frozenset({"workdir", "workdir_set", "home", "model", "title", "profile_name", "settings",
                             "memory_user", "memory_agent", "aux_model", "delegation_model"})
#: Finding kinds without a canary.
KIND_SEVERITY = {"egress": "high", "profile_bleed": "medium", "bypass": "low", "shortfall": "low"}
_LEAKS = ("critical", "high", "medium")
#: The severities each finding kind can have (SARIF has one rule per kind and severity).
POSSIBLE = {"wrong_key": ("critical", "medium"), "wrong_model": ("medium",), "wrong_identity": _LEAKS,
            "request_leak": _LEAKS, "response_leak": _LEAKS, "env_leak": _LEAKS, "wrong_cwd": ("medium",),
            "wrong_path": _LEAKS, "file_leak": _LEAKS, "text_leak": _LEAKS, "egress": ("high",),
            "route_auth": ("critical", "medium"), "profile_bleed": ("high", "medium"), "bypass": ("low",),
            "shortfall": ("low",)}
#: How sure a finding of each kind is: canaries carry 48 random bits, so a hit is never a coincidence;
#: a profile bleed is inferred from what a backend reports or changes.
PRECISION = {"profile_bleed": "high", "shortfall": "high"}


def is_secret(canary: str) -> bool:
    """Keys, API-server keys, saved keys: any canary kind ending in `key` (as the registry defines secrets); a derived
    canary (`derived_TEXT_via_TENANT`) is generated text, never a secret."""
    return canary.endswith("key") and not canary.startswith("derived_")


def canary_severity(canary: str) -> str:
    if is_secret(canary):
        return "critical"
    if canary in MEDIUM_CANARIES or canary.startswith("derived_title"):
        return "medium"
    return "high"  # memory, soul, transcripts, tool data, text generated from them, any kind this table does not know


def severity(f: Finding) -> str:
    """`critical`, `high`, `medium` or `low` (see the module docstring and docs/findings.md)."""
    if f.kind in ("bypass", "shortfall"):
        return "low"
    if f.canary is None:
        return KIND_SEVERITY.get(f.kind, "high")
    sev = canary_severity(f.canary)
    if f.victim is not None and f.victim == f.seen_in and sev in ("critical", "high"):
        return "medium"  # nothing crossed to another tenant: its own value in the wrong place (a missing key, ...)
    return sev


def precision(kind: str) -> str:
    """SARIF `precision`: `very-high` for every canary match, `high` for inferences."""
    return PRECISION.get(kind, "very-high")


def rank(sev: str) -> int:
    """0 for critical ... 3 for low: sorts the worst first."""
    return SEVERITIES.index(sev)


def docs_url(kind: str | None = None) -> str:
    """Where docs/findings.md explains `kind`: under `$TENANCY_DOCS_URL` when set (for example the file on your
    forge, so SARIF links work in code scanning), else the file: docs/findings.md in a checkout, the package's
    copy when installed (a file on disk either way)."""
    base = os.environ.get("TENANCY_DOCS_URL") or Path(str(FINDINGS_DOC)).resolve().as_uri()
    return f"{base}#{kind}" if kind else base  # docs/findings.md has one `## KIND` heading per kind

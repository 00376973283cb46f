"""What the end-to-end tests of the opt-in phases read of an audit: a phase's steps, the one incident a crossing
must make with its finding's number, and the secondary profiles' config.yaml as the run left them."""

from __future__ import annotations

import json
from typing import Any

from harness.pytest_plugin import Audit


def phase_steps(audit: Audit, phase: str) -> list[dict[str, Any]]:
    """The timeline's steps of `phase`, in order."""
    return [t for t in audit.doc["timeline"] if t["phase"] == phase]


def assert_one_incident(audit: Audit, entry: str, finding: str) -> None:
    """The run has one incident of `entry`, documented as `finding` alone."""
    found = [i for i in audit.doc["incidents"] if i["entry"] == entry]
    assert len(found) == 1 and found[0]["documented"] == [finding], json.dumps(audit.doc["incidents"])[:500]


def profile_configs(audit: Audit) -> dict[str, str]:
    """Each secondary profile's config.yaml in the run's sandbox, by profile name."""
    home = audit.out / "sandbox"
    return {p.parent.name: p.read_text() for p in home.glob("*/.hermes/profiles/*/config.yaml")}

"""One Hermes process serving every tenant (tui, serve, gateway), audited phase by phase.

Hermes 0.19.0 is known to leak between profiles inside one process; the committed baselines list those
findings by fingerprint. Each scenario must reproduce its baseline exactly (nothing new, nothing gone
but intermittent entries), and a planted leak the baseline does not know must fail the run; `reconcile` of
each evidence folder must reach the run's verdict, findings and counts again.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.core.protocol import BATTERY_TOOLS

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
BASELINES = ROOT / "baselines"
SCENARIOS = ("tui", "serve", "gateway")


def _summaries(findings: list[dict]) -> str:
    return "\n".join(f"{f['kind']} {f['canary']} {f['channel']} {f['scenario']}/{f['phase']}" for f in findings)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_reproduces_its_baseline(tenancy_audit, scenario):
    audit = tenancy_audit(scenario=scenario, tenants=3, baseline=BASELINES / f"{scenario}.json")
    assert audit.doc["findings"] == [], "new findings:\n" + _summaries(audit.doc["findings"])
    assert audit.doc["fixed"] == [], f"baseline entries no longer seen: {audit.doc['fixed']}"
    assert audit.doc["reasons"] == []
    assert audit.code == 0 and audit.verdict == "clean"
    assert audit.doc["known"], "Hermes 0.19.0 is known to leak here: the audit must see it"
    assert {t["tenant"] for t in audit.doc["timeline"]} >= {"default", "alpha", "beta"}
    # observe-mode stubs: no turn fails for a foreign key, so every tenant runs every battery tool
    assert all(t["ok"] for t in audit.doc["timeline"] if t["phase"] != "cron"), audit.doc["timeline"]
    coverage = audit.doc["coverage"][scenario]
    assert set(coverage) == set(BATTERY_TOOLS) and set(coverage.values()) <= {"driven", "leak"}, coverage
    assert_reconcile_reproduces(audit)


def assert_reconcile_reproduces(audit) -> None:
    """`reconcile EVIDENCE` (with the run's baseline copy) reaches the run's verdict, findings and counts."""
    done = subprocess.run([sys.executable, "-m", "harness.cli", "reconcile", str(audit.out), "--json"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == audit.code, done.stderr
    again = json.loads(done.stdout)
    for key in ("verdict", "counts", "counts_by_kind", "reasons", "fixed", "findings", "known"):
        assert again[key] == audit.doc[key], key


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_unknown_planted_leak_fails_the_run(tenancy_audit, scenario):
    audit = tenancy_audit(scenario=scenario, tenants=3, baseline=BASELINES / f"{scenario}.json", plants=["memory"],
                          tools=[])  # the env probe only: faster, and the planted memory is no tool's
    assert audit.code == 1 and audit.verdict == "leak"
    new = {(f["kind"], f["canary"], f["victim"]) for f in audit.doc["findings"]}
    # default's memory in alpha's system prompt (the file_leak of that canary is known: with the battery,
    # session_search copies default's transcripts, memory included, into alpha's state.db)
    assert ("request_leak", "memory", "default") in new, _summaries(audit.doc["findings"])
    assert_reconcile_reproduces(audit)


@pytest.mark.parametrize("scenario", ("serve", "gateway"))
def test_cron_ticker_phase(tenancy_audit, scenario):
    """Seed a due job in every profile; the backend's ticker must fire each (slow: waits past one tick)."""
    audit = tenancy_audit(scenario=scenario, tenants=3, phases=["turns", "cron"],
                          baseline=BASELINES / f"{scenario}-cron.json")
    assert audit.doc["findings"] == [], "new findings:\n" + _summaries(audit.doc["findings"])
    assert audit.doc["fixed"] == [], f"baseline entries no longer seen: {audit.doc['fixed']}"
    cron = [t for t in audit.doc["timeline"] if t["phase"] == "cron"]
    assert {t["tenant"] for t in cron} == {"default", "alpha", "beta"}
    assert any(t["ok"] for t in cron), "not even the launch profile's cron job fired"

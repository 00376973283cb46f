"""Reports from a synthetic audit: SARIF 2.1.0 structure and locations, HTML escaping and matrix, summary table."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from harness.core.findings import KINDS, Finding, Verdict
from harness.core.registry import mint
from harness.drive.hermes import Sandbox
from harness.report.result import AuditResult, summary_table
from harness.report.writer import write_reports

FLOW = "flow:0b7e2c1a-1111-2222-3333-444455556666"

# The properties SARIF 2.1.0 allows (additionalProperties: false) on each object this project emits, and
# the ones it requires.
ALLOWED = {
    "log": ({"$schema", "version", "runs", "inlineExternalProperties", "properties"}, {"version", "runs"}),
    "run": ({"tool", "invocations", "conversion", "language", "versionControlProvenance", "originalUriBaseIds",
             "artifacts", "logicalLocations", "graphs", "results", "automationDetails", "runAggregates",
             "baselineGuid", "redactionTokens", "defaultEncoding", "defaultSourceLanguage", "newlineSequences",
             "columnKind", "externalPropertyFileReferences", "threadFlowLocations", "taxonomies", "addresses",
             "translations", "policies", "webRequests", "webResponses", "specialLocations", "properties"},
            {"tool"}),
    "tool": ({"driver", "extensions", "properties"}, {"driver"}),
    "driver": ({"guid", "name", "organization", "product", "productSuite", "shortDescription", "fullDescription",
                "fullName", "version", "semanticVersion", "dottedQuadFileVersion", "releaseDateUtc", "downloadUri",
                "informationUri", "globalMessageStrings", "notifications", "rules", "taxa", "locations",
                "language", "contents", "isComprehensive", "localizedDataSemanticVersion",
                "minimumRequiredLocalizedDataSemanticVersion", "associatedComponent", "translationMetadata",
                "supportedTaxonomies", "properties"}, {"name"}),
    "rule": ({"id", "deprecatedIds", "guid", "deprecatedGuids", "name", "deprecatedNames", "shortDescription",
              "fullDescription", "messageStrings", "defaultConfiguration", "helpUri", "help", "relationships",
              "properties"}, {"id"}),
    "result": ({"ruleId", "ruleIndex", "rule", "kind", "level", "message", "analysisTarget", "locations", "guid",
                "correlationGuid", "occurrenceCount", "partialFingerprints", "fingerprints", "stacks",
                "codeFlows", "graphs", "graphTraversals", "relatedLocations", "suppressions", "baselineState",
                "rank", "attachments", "hostedViewerUri", "workItemUris", "provenance", "fixes", "taxa",
                "webRequest", "webResponse", "properties"}, {"message"}),
    "location": ({"id", "physicalLocation", "logicalLocations", "message", "annotations", "relationships",
                  "properties"}, set()),
    "physical": ({"address", "artifactLocation", "region", "contextRegion", "properties"}, {"artifactLocation"}),
    "artifact": ({"uri", "uriBaseId", "index", "description", "properties"}, set()),
    "region": ({"startLine", "startColumn", "endLine", "endColumn", "charOffset", "charLength", "byteOffset",
                "byteLength", "snippet", "message", "sourceLanguage", "properties"}, set()),
    "logical": ({"name", "index", "fullyQualifiedName", "decoratedName", "parentIndex", "kind", "properties"},
                set()),
    "suppression": ({"guid", "kind", "status", "justification", "location", "properties"}, {"kind"}),
    "invocation": ({"commandLine", "arguments", "responseFiles", "startTimeUtc", "endTimeUtc", "exitCode",
                    "ruleConfigurationOverrides", "notificationConfigurationOverrides", "toolExecutionNotifications",
                    "toolConfigurationNotifications", "exitCodeDescription", "exitSignalName", "exitSignalNumber",
                    "processStartFailureMessage", "executionSuccessful", "machine", "account", "processId",
                    "executableLocation", "workingDirectory", "environmentVariables", "stdin", "stdout", "stderr",
                    "stdoutStderr", "properties"}, {"executionSuccessful"}),
    "message": ({"text", "markdown", "id", "arguments", "properties"}, {"text"}),
}
LEVELS = {"none", "note", "warning", "error"}


def _obj(value: Any, kind: str, where: str, problems: list[str]) -> dict[str, Any]:
    allowed, required = ALLOWED[kind]
    if not isinstance(value, dict):
        problems.append(f"{where}: not an object")
        return {}
    problems += [f"{where}: unknown property {k!r}" for k in value if k not in allowed]
    problems += [f"{where}: missing {k!r}" for k in required if k not in value]
    return value


def sarif_problems(doc: Any) -> list[str]:
    """Every way `doc` breaks the SARIF 2.1.0 schema for the objects this project emits."""
    p: list[str] = []
    log = _obj(doc, "log", "log", p)
    if log.get("version") != "2.1.0":
        p.append("log.version is not 2.1.0")
    for r, run in enumerate(log.get("runs") or []):
        run = _obj(run, "run", f"runs[{r}]", p)
        driver = _obj(_obj(run.get("tool"), "tool", "tool", p).get("driver"), "driver", "driver", p)
        rules = driver.get("rules", [])
        ids = [rule.get("id") for rule in rules]
        if len(set(ids)) != len(ids):
            p.append("duplicate rule ids")
        for i, rule in enumerate(rules):
            rule = _obj(rule, "rule", f"rules[{i}]", p)
            _obj(rule.get("shortDescription", {"text": ""}), "message", f"rules[{i}].shortDescription", p)
            if rule.get("defaultConfiguration", {}).get("level", "error") not in LEVELS:
                p.append(f"rules[{i}]: bad level")
        for base, loc in (run.get("originalUriBaseIds") or {}).items():
            _obj(loc, "artifact", f"originalUriBaseIds.{base}", p)
            if not str(loc.get("uri", "")).endswith("/"):
                p.append(f"originalUriBaseIds.{base}: uri must end with /")
        for i, inv in enumerate(run.get("invocations") or []):
            if not isinstance(_obj(inv, "invocation", f"invocations[{i}]", p).get("executionSuccessful"), bool):
                p.append(f"invocations[{i}].executionSuccessful is not a boolean")
        for i, res in enumerate(run.get("results") or []):
            w = f"results[{i}]"
            res = _obj(res, "result", w, p)
            _obj(res.get("message"), "message", f"{w}.message", p)
            if res.get("level", "warning") not in LEVELS:
                p.append(f"{w}: bad level {res.get('level')!r}")
            idx = res.get("ruleIndex")
            if idx is not None and (not isinstance(idx, int) or idx >= len(ids) or ids[idx] != res.get("ruleId")):
                p.append(f"{w}: ruleIndex does not point at ruleId")
            if not all(isinstance(v, str) for v in (res.get("partialFingerprints") or {}).values()):
                p.append(f"{w}: partialFingerprints values must be strings")
            for j, loc in enumerate(res.get("locations") or []):
                loc = _obj(loc, "location", f"{w}.locations[{j}]", p)
                if "physicalLocation" in loc:
                    phys = _obj(loc["physicalLocation"], "physical", f"{w}.physical", p)
                    art = _obj(phys.get("artifactLocation"), "artifact", f"{w}.artifact", p)
                    if art.get("uri", "").startswith("/") or " " in art.get("uri", ""):
                        p.append(f"{w}: uri {art.get('uri')!r} is not a relative URI reference")
                    if "region" in phys:
                        offset = _obj(phys["region"], "region", f"{w}.region", p).get("byteOffset", 0)
                        if not isinstance(offset, int) or offset < 0:
                            p.append(f"{w}: bad byteOffset")
                for k, logical in enumerate(loc.get("logicalLocations") or []):
                    _obj(logical, "logical", f"{w}.logical[{k}]", p)
            for k, sup in enumerate(res.get("suppressions") or []):
                if _obj(sup, "suppression", f"{w}.suppressions[{k}]", p).get("kind") not in ("inSource", "external"):
                    p.append(f"{w}: bad suppression kind")
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
    run = doc["runs"][0]
    assert {r["id"] for r in run["tool"]["driver"]["rules"]} == KINDS
    assert run["originalUriBaseIds"]["EVIDENCE"]["uri"] == out.resolve().as_uri() + "/"
    results = run["results"]
    findings = result.verdict.findings + result.verdict.known
    assert [r["ruleId"] for r in results] == [f.kind for f in findings]
    assert [r["partialFingerprints"]["tenancyFingerprint/v1"] for r in results] == [f.fingerprint() for f in findings]
    phys = [r["locations"][0]["physicalLocation"] for r in results]
    assert [p["artifactLocation"]["uri"] for p in phys] == [
        "flows.mitm", "sandbox/home/.hermes/profiles/alpha/memories/MEMORY.md",
        "sandbox/home/.hermes/profiles/alpha/state.db", "logs/oneshot-alpha-0.log", "logs/rpc-serve.jsonl",
        "flows.mitm", "stubs.jsonl", "findings.json", "flows.mitm"]
    assert all(p["artifactLocation"]["uriBaseId"] == "EVIDENCE" for p in phys)
    assert phys[1]["region"] == {"byteOffset": 33}
    assert "region" not in phys[2]  # the hit is inside a SQLite cell: the logical location says where
    assert results[2]["locations"][0]["logicalLocations"][0]["fullyQualifiedName"].startswith("state.db:sqlite:")
    assert results[0]["locations"][0]["logicalLocations"][0]["name"] == FLOW.removeprefix("flow:")
    assert [r["level"] for r in results] == ["error"] * 6 + ["warning", "warning", "error"]
    assert "suppressions" not in results[0] and results[-1]["suppressions"][0]["kind"] == "external"


def test_sarif_rejects_what_the_schema_rejects():
    assert sarif_problems({"version": "2.1.0", "runs": [{"tool": {"driver": {}}, "results": [
        {"message": {"text": "x"}, "level": "fatal", "extra": 1}]}]}) == [
        "driver: missing 'name'", "results[0]: unknown property 'extra'", "results[0]: bad level 'fatal'"]


def test_html_escapes_evidence_and_fills_the_matrix(audit):
    out, _ = audit
    html = (out / "report.html").read_text()
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'class="banner leak"' in html
    assert 'data-victim="default" data-seen-in="alpha" data-count="4"' in html  # request, 2 x file, log
    assert 'data-victim="alpha" data-seen-in="default" data-count="0"' in html  # the known one is not counted
    assert "4 finding(s) not between two tenants" in html  # rpc text_leak, egress, bypass, shortfall
    assert "http://" not in html.replace("http://127", "") and "src=" not in html  # self-contained


def test_summary_table(audit):
    _, result = audit
    lines = summary_table(result).splitlines()
    assert lines[0].split() == ["tenant", "turns", "ok", "failed", "snapshots", "request", "response", "env",
                                "file", "log", "rpc"]
    assert lines[1].split() == ["default", "1", "0", "1", "1", "0", "0", "2", "1", "0"]
    assert lines[2].split() == ["alpha", "0", "1", "0", "2", "0", "1", "2", "1", "1"]  # request: leak + bypass
    assert lines[-1] == "verdict leak: 8 new, 1 known finding(s)"

"""findings.sarif: SARIF 2.1.0 for code-scanning uploaders: one result per incident, one rule per finding kind and
severity.

Each rule (`KIND/SEVERITY`) carries the remediation of docs/findings.md as `help`, a `helpUri` to it, and
`properties.security-severity` and `precision`, so code scanning shows and sorts by severity. An incident's
result is its first hop (`locations`) under the rule of its worst crossing, with one related location per
other finding class it holds (other directions, and everything it spread to). Locations point into the
evidence folder (`uriBaseId` EVIDENCE): a file finding at its path (relative to the folder, with its byte
offset when the hit is in the file's own bytes), a flow finding at `flows.mitm` plus a logical location
naming the flow id and part. An incident wholly in the baseline is a suppressed result.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from harness.core.files import FLOWS
from harness.core.findings import FINGERPRINT_VERSION, INCONCLUSIVE_KINDS, Finding
from harness.core.severity import FINDINGS_DOC, POSSIBLE, SECURITY_SEVERITY, docs_url, precision, rank, severity
from harness.detect.incidents import spread_counts
from harness.report.result import AuditResult, IncidentRow

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
RULES = {
    "wrong_key": "A request carried another tenant's key, or none where its own was required.",
    "wrong_model": "A main turn asked for a model that is not its tenant's.",
    "wrong_identity": "A request to a tenant's service named another tenant's identity there (user, workspace).",
    "request_leak": "A request carried another tenant's canary.",
    "response_leak": "A response carried another tenant's canary.",
    "env_leak": "A tool subprocess saw another tenant's canary in its environment.",
    "wrong_cwd": "A tool subprocess ran in a working directory that is not its tenant's.",
    "wrong_path": "A tool subprocess's environment names another tenant's home or working directory.",
    "file_leak": "A tenant's files hold another tenant's canary.",
    "text_leak": "A log or RPC stream carried a canary where it must not appear.",
    "egress": "A request went to a host that no tenant owns.",
    "route_auth": "A tenant's route accepted a credential that is not its own.",
    "profile_bleed": "A profile setting of one tenant took effect for another.",
    "bypass": "A service stub saw a request that did not pass the proxy.",
    "shortfall": "Too little happened to conclude (a turn failed, a snapshot is missing).",
}
SEVERITY_TEXT = {"critical": "a secret crossed tenants", "high": "a tenant's private data crossed tenants",
                 "medium": "a value that identifies a tenant crossed tenants or landed in the wrong place",
                 "low": "the run could not prove isolation"}
FINGERPRINT_KEY = f"tenancyFingerprint/v{FINGERPRINT_VERSION}"
INCIDENT_KEY = "tenancyIncident/v1"
#: GitHub code scanning keeps at most 1000 related locations per result.
MAX_RELATED = 1000
_FILE = re.compile(r"^(?P<path>[^@:#]+)(?:@(?P<offset>\d+))?$")
_LABEL = re.compile(r"^(?P<path>[^@:#]+)")


@functools.cache
def remediation() -> dict[str, str]:
    """Kind -> its section of docs/findings.md (Markdown)."""
    text = FINDINGS_DOC.read_text(encoding="utf-8")
    sections = {}
    for block in text.split("\n## ")[1:]:
        title, _, body = block.partition("\n")
        sections[title.strip()] = " ".join(body.split())
    return sections


def rule_id(kind: str, sev: str) -> str:
    return f"{kind}/{sev}"


def _rule_name(kind: str, sev: str) -> str:
    return sev.capitalize() + "".join(part.capitalize() for part in kind.split("_"))


def _level(sev: str, kind: str) -> str:
    return "warning" if kind in INCONCLUSIVE_KINDS or sev in ("medium", "low") else "error"


def rule(kind: str, sev: str) -> dict[str, Any]:
    """The reporting descriptor of one finding kind at one severity."""
    fix = remediation().get(kind) or RULES[kind]
    plain = fix.replace("**", "").replace("`", "")
    return {
        "id": rule_id(kind, sev),
        "name": _rule_name(kind, sev),
        "shortDescription": {"text": RULES[kind]},
        "fullDescription": {"text": f"{RULES[kind]} Severity {sev}: {SEVERITY_TEXT[sev]}."},
        "help": {"text": f"{plain} See {docs_url(kind)}", "markdown": f"{fix}\n\n[docs/findings.md]({docs_url(kind)})"},
        "helpUri": docs_url(kind),
        "defaultConfiguration": {"level": _level(sev, kind)},
        "properties": {"tags": ["security", "multi-tenancy", "external/cwe/cwe-668"],
                       "security-severity": SECURITY_SEVERITY[sev], "precision": precision(kind)},
    }


def _artifact(uri: str) -> dict[str, Any]:
    return {"artifactLocation": {"uri": uri, "uriBaseId": "EVIDENCE"}}


def location(f: Finding, homes: dict[str, str]) -> dict[str, Any]:
    """Where a finding is, as a SARIF location; `homes` maps tenants to their home relative to the folder."""
    loc = f.location
    if loc.startswith("flow:"):
        flow_id = loc.split(":", 2)[1]
        return {"physicalLocation": _artifact(FLOWS),
                "logicalLocations": [{"name": flow_id, "fullyQualifiedName": loc, "kind": "resource"}]}
    if loc.startswith("stub:"):
        return {"physicalLocation": _artifact("stubs.jsonl"),
                "logicalLocations": [{"name": loc, "fullyQualifiedName": loc, "kind": "resource"}]}
    if f.channel in ("file", "log", "rpc") and (m := _LABEL.match(loc)):
        base = homes.get(f.seen_in or "") if f.channel == "file" else "logs"
        if base is not None:
            physical = _artifact(f"{base}/{m['path']}")
            exact = _FILE.match(loc)
            if exact and exact["offset"] is not None:
                physical["region"] = {"byteOffset": int(exact["offset"])}
            out: dict[str, Any] = {"physicalLocation": physical}
            if not exact:
                out["logicalLocations"] = [{"fullyQualifiedName": loc, "kind": "element"}]
            return out
    return {"physicalLocation": _artifact("findings.json"),
            "logicalLocations": [{"fullyQualifiedName": loc, "kind": "resource"}]}


def _related(row: IncidentRow, homes: dict[str, str]) -> list[dict[str, Any]]:
    """One related location per finding class of the incident but the first hop's: its first occurrence."""
    first = row.incident.first.fingerprint()
    out: list[dict[str, Any]] = []
    for role, g in row.classes():
        if g.fingerprint != first and len(out) < MAX_RELATED:
            out.append({**location(g.first, homes), "id": len(out),
                        "message": {"text": f"{role}: {g.line()}"}})
    return out


def _result(row: IncidentRow, rule_index: dict[str, int], homes: dict[str, str]) -> dict[str, Any]:
    i, sev = row.incident, row.incident.severity
    f = i.first
    rid = rule_id(i.worst.kind, sev)
    res: dict[str, Any] = {
        "ruleId": rid,
        "ruleIndex": rule_index[rid],
        "level": _level(sev, i.worst.kind),
        "message": {"text": f"{row.line()} (severity {sev})"},
        "locations": [location(f, homes)],
        "relatedLocations": _related(row, homes),
        "partialFingerprints": {INCIDENT_KEY: i.id, FINGERPRINT_KEY: f.fingerprint()},
        "properties": {k: v for k, v in (
            ("incident", i.id), ("entry", i.entry), ("documented", row.documented), ("kinds", i.kinds),
            ("severity", sev), ("security-severity", SECURITY_SEVERITY[sev]), ("victim", f.victim),
            ("seenIn", f.seen_in), ("directions", [f"{v or '-'} -> {r or '-'}" for v, r in i.directions]),
            ("canaries", i.canaries), ("channel", f.channel), ("encoding", f.encoding), ("evidence", f.evidence),
            ("scenario", f.scenario), ("phase", f.phase), ("scenarios", i.scenarios), ("crossings", len(i.crossings)),
            ("spread", spread_counts(i.spread)), ("classes", sorted({g.fingerprint() for g in i.findings})))
            if v},
    }
    if row.allowed:
        scopes = sorted({g.scope.removeprefix("allowed:") for g in i.findings})
        res["suppressions"] = [{"kind": "external", "justification": "the isolation policy shares this surface by "
                                f"design ({', '.join(scopes)})"}]
    elif not row.new:
        res["suppressions"] = [{"kind": "external", "justification": "every finding of it is in the baseline"}]
    return res


def sarif(result: AuditResult, out: Path, homes: dict[str, str]) -> dict[str, Any]:
    """The SARIF log of one audit whose evidence folder is `out`."""
    v = result.verdict
    pairs = {(k, sev) for k, sevs in POSSIBLE.items() for sev in sevs}
    pairs |= {(f.kind, severity(f)) for f in v.findings + v.known}
    ordered = sorted(pairs, key=lambda p: (p[0], rank(p[1])))
    rule_index = {rule_id(k, sev): i for i, (k, sev) in enumerate(ordered)}
    rules = [rule(k, sev) for k, sev in ordered]
    run = {
        "tool": {"driver": {"name": "tenancy-audit", "version": result.versions.get("tenancy-audit", "0"),
                            "informationUri": docs_url(), "rules": rules}},
        "originalUriBaseIds": {"EVIDENCE": {"uri": out.resolve().as_uri() + "/"}},
        "results": [_result(row, rule_index, homes) for row in result.incidents],
        "invocations": [{"executionSuccessful": v.status != "inconclusive",
                         "properties": {"verdict": v.status, "scenario": result.scenario,
                                        "reasons": v.reasons, "versions": result.versions}}],
    }
    return {"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}

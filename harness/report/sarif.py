"""findings.sarif: SARIF 2.1.0 for code-scanning uploaders (one rule per finding kind and severity).

Each rule (`KIND/SEVERITY`) carries the remediation of docs/findings.md as `help`, a `helpUri` to it, and
`properties.security-severity` and `precision`, so code scanning shows and sorts by severity. Locations
point into the evidence folder (`uriBaseId` EVIDENCE): a file finding at its path (relative to the folder,
with its byte offset when the hit is in the file's own bytes), a flow finding at `flows.mitm` plus a
logical location naming the flow id and part. Known (baselined) findings are suppressed results.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from harness.core.files import REPO
from harness.core.findings import FINGERPRINT_VERSION, INCONCLUSIVE_KINDS, Finding
from harness.core.severity import POSSIBLE, SECURITY_SEVERITY, docs_url, precision, rank, severity
from harness.report.result import AuditResult

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
_FILE = re.compile(r"^(?P<path>[^@:#]+)(?:@(?P<offset>\d+))?$")
_LABEL = re.compile(r"^(?P<path>[^@:#]+)")


@functools.cache
def remediation() -> dict[str, str]:
    """Kind -> its section of docs/findings.md (Markdown); empty when the docs are not next to the code."""
    try:
        text = (REPO / "docs" / "findings.md").read_text(encoding="utf-8")
    except OSError:
        return {}
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
        return {"physicalLocation": _artifact("flows.mitm"),
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


def _result(f: Finding, rule_index: dict[str, int], homes: dict[str, str], known: bool) -> dict[str, Any]:
    sev = severity(f)
    rid = rule_id(f.kind, sev)
    res: dict[str, Any] = {
        "ruleId": rid,
        "ruleIndex": rule_index[rid],
        "level": _level(sev, f.kind),
        "message": {"text": f"{f.summary()} (severity {sev})"},
        "locations": [location(f, homes)],
        "partialFingerprints": {FINGERPRINT_KEY: f.fingerprint()},
        "properties": {k: v for k, v in (("kind", f.kind), ("severity", sev),
                                         ("security-severity", SECURITY_SEVERITY[sev]), ("victim", f.victim),
                                         ("seenIn", f.seen_in), ("canary", f.canary), ("channel", f.channel),
                                         ("encoding", f.encoding), ("evidence", f.evidence),
                                         ("scenario", f.scenario), ("phase", f.phase)) if v},
    }
    if known:
        res["suppressions"] = [{"kind": "external", "justification": "in the baseline"}]
    return res


def sarif(result: AuditResult, out: Path, homes: dict[str, str]) -> dict[str, Any]:
    """The SARIF log of one audit whose evidence folder is `out`."""
    v = result.verdict
    pairs = {(k, sev) for k, sevs in POSSIBLE.items() for sev in sevs}
    pairs |= {(f.kind, severity(f)) for f in v.findings + v.known}
    ordered = sorted(pairs, key=lambda p: (p[0], rank(p[1])))
    rule_index = {rule_id(k, sev): i for i, (k, sev) in enumerate(ordered)}
    rules = [rule(k, sev) for k, sev in ordered]
    results = [_result(f, rule_index, homes, False) for f in v.findings]
    results += [_result(f, rule_index, homes, True) for f in v.known]
    run = {
        "tool": {"driver": {"name": "tenancy-audit", "version": result.versions.get("tenancy-audit", "0"),
                            "informationUri": docs_url(), "rules": rules}},
        "originalUriBaseIds": {"EVIDENCE": {"uri": out.resolve().as_uri() + "/"}},
        "results": results,
        "invocations": [{"executionSuccessful": v.status != "inconclusive",
                         "properties": {"verdict": v.status, "scenario": result.scenario,
                                        "reasons": v.reasons, "versions": result.versions}}],
    }
    return {"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}

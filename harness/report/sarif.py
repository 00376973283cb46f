"""findings.sarif: SARIF 2.1.0 for code-scanning uploaders (one rule per finding kind).

Locations point into the evidence folder (`uriBaseId` EVIDENCE): a file finding at its path (relative to
the folder, with its byte offset when the hit is in the file's own bytes), a flow finding at `flows.mitm`
plus a logical location naming the flow id and part. Known (baselined) findings are suppressed results.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from harness.core.findings import INCONCLUSIVE_KINDS, KINDS, Finding
from harness.report.result import AuditResult

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
RULES = {
    "wrong_key": "A request carried another tenant's key, or none where its own was required.",
    "wrong_model": "A main turn asked for a model that is not its tenant's.",
    "request_leak": "A request carried another tenant's canary.",
    "response_leak": "A response carried another tenant's canary.",
    "env_leak": "A tool subprocess saw another tenant's canary in its environment.",
    "wrong_cwd": "A tool subprocess ran in a working directory that is not its tenant's.",
    "file_leak": "A tenant's files hold another tenant's canary.",
    "text_leak": "A log or RPC stream carried a canary where it must not appear.",
    "egress": "A request went to a host that no tenant owns.",
    "route_auth": "A tenant's route accepted a credential that is not its own.",
    "profile_bleed": "A profile setting of one tenant took effect for another.",
    "bypass": "A provider stub saw a request that did not pass the proxy.",
    "shortfall": "Too little happened to conclude (a turn failed, a snapshot is missing).",
}
_FILE = re.compile(r"^(?P<path>[^@:#]+)(?:@(?P<offset>\d+))?$")
_LABEL = re.compile(r"^(?P<path>[^@:#]+)")


def _rule_name(kind: str) -> str:
    return "".join(part.capitalize() for part in kind.split("_"))


def _level(f: Finding) -> str:
    return "warning" if f.kind in INCONCLUSIVE_KINDS else "error"


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
    res: dict[str, Any] = {
        "ruleId": f.kind,
        "ruleIndex": rule_index[f.kind],
        "level": _level(f),
        "message": {"text": f.summary()},
        "locations": [location(f, homes)],
        "partialFingerprints": {"tenancyFingerprint/v1": f.fingerprint()},
        "properties": {k: v for k, v in (("victim", f.victim), ("seenIn", f.seen_in), ("canary", f.canary),
                                         ("channel", f.channel), ("encoding", f.encoding),
                                         ("evidence", f.evidence), ("scenario", f.scenario),
                                         ("phase", f.phase)) if v},
    }
    if known:
        res["suppressions"] = [{"kind": "external", "justification": "in the baseline"}]
    return res


def sarif(result: AuditResult, out: Path, homes: dict[str, str]) -> dict[str, Any]:
    """The SARIF log of one audit whose evidence folder is `out`."""
    kinds = sorted(KINDS)
    rule_index = {k: i for i, k in enumerate(kinds)}
    rules = [{"id": k, "name": _rule_name(k), "shortDescription": {"text": RULES[k]},
              "defaultConfiguration": {"level": "warning" if k in INCONCLUSIVE_KINDS else "error"},
              "properties": {"tags": ["security", "multi-tenancy"]}} for k in kinds]
    v = result.verdict
    results = [_result(f, rule_index, homes, False) for f in v.findings]
    results += [_result(f, rule_index, homes, True) for f in v.known]
    run = {
        "tool": {"driver": {"name": "tenancy-audit", "version": result.versions.get("tenancy-audit", "0"),
                            "rules": rules}},
        "originalUriBaseIds": {"EVIDENCE": {"uri": out.resolve().as_uri() + "/"}},
        "results": results,
        "invocations": [{"executionSuccessful": v.status != "inconclusive",
                         "properties": {"verdict": v.status, "scenario": result.scenario,
                                        "reasons": v.reasons, "versions": result.versions}}],
    }
    return {"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}

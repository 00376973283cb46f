"""The verdict of an evidence folder, from its files only, and the one place an `AuditResult` is built.

`run` judges its folder once it has written it, and `reconcile EVIDENCE` judges it again later, so both reach
the same findings, fingerprints and verdict; `reconcile --registry --flows` judges loose files the same way.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import mitmproxy.version

import harness
from harness.core.distributions import differences
from harness.core.files import POLICY_COPY, RECORD, STUB_LOG
from harness.core.findings import Finding, Verdict
from harness.core.protocol import OUT_OF_SCOPE
from harness.core.registry import load
from harness.detect.engine.stream import DEFAULT_LIMITS, Limits
from harness.detect.reconcile import EvidenceError, LogSource, Phase, Reconciliation, reconcile
from harness.drive import plants
from harness.drive.services import SERVICE_RECORDS
from harness.report import baseline as baselines
from harness.report import policy as policies
from harness.report.policy import Policy
from harness.report.result import AuditResult


def versions(hermes: str | None = None, venv: dict[str, Any] | None = None) -> dict[str, str]:
    """The versions a result names: Hermes' (when known) and the lock its venv was installed from (file and
    sha256, `made` when no lock was committed for it), mitmproxy's and this tool's."""
    lock = (venv or {}).get("lock")
    locked = {"hermes-lock": f"{lock['file']} {lock['sha256'][:12]}" + ("" if lock["committed"] else " (made)")
              } if lock else {}
    return {**({"hermes-agent": hermes} if hermes else {}), **locked, "mitmproxy": mitmproxy.version.VERSION,
            "tenancy-audit": harness.__version__}


def venv_warnings(record: dict[str, Any], base: baselines.AnyBaseline | None) -> list[str]:
    """One line for each way the audited Hermes venv is not what the lock, or the baseline's runs, had."""
    venv = record.get("hermes_venv")
    if not venv:  # a folder from before venvs were recorded
        return []
    lock, version = venv.get("lock"), record.get("hermes-agent") or "?"
    lines = [venv["problem"]] if venv.get("problem") else []
    if lock is None and not venv.get("problem"):
        lines.append(f"hermes-agent {version} was audited without a lock: its venv's versions are recorded, not pinned")
    elif lock is not None:
        lines += [lock["differs"]] if lock.get("differs") else []
        lines += [] if lock["committed"] else [f"hermes-agent {version} has no committed lock: one was made on its "
                                               f"first install ({lock['file']}), so another machine may resolve "
                                               "other versions"]
    made_with = getattr(base, "made_with", None) or {}
    if made_with.get("installed") and venv.get("installed"):
        differs = differences(venv["installed"], made_with["installed"], "the Hermes venv",
                              against=("the one that made the baseline", "baseline"))
        lines += [differs] if differs else []
    return lines


def result_of(rec: Reconciliation | None, tenants: list[str], scenario: str, found: list[Finding], *,
              reasons: list[str], base: baselines.AnyBaseline | None = None, ran: set[tuple[str, str]] | None = None,
              allowed: list[Finding] | None = None, warnings: list[str] | None = None,
              **fields: Any) -> AuditResult:
    """The result of a reconciliation (None: nothing was reconciled): `found` split by the baseline into new, known
    and fixed (`ran`: the phases that ran), the verdict, and what was inspected; `fields`: the rest of
    `AuditResult` (versions, timeline, seconds, out, ...)."""
    findings, known, fixed, warnings = found, [], [], list(warnings or [])
    if base is not None:
        findings, known, fixed = baselines.split(found, base, ran)
        warnings += [base.warning] if base.warning else []
    seen = {} if rec is None else {
        "inspected": {**rec.inspected, "flows": rec.flows},
        "snapshots": {t: len(snaps) for t, snaps in rec.snapshots.items()},
        "not_inspected": [n.to_dict() for n in rec.not_inspected]}
    return AuditResult(Verdict(findings, known, reasons, allowed or []), tenants, scenario, fixed=fixed,
                       warnings=warnings, **seen, **fields)


def read_record(out: Path) -> dict[str, Any]:
    """The run's record (`timeline.json`) of an evidence folder; an older folder's lacks some keys."""
    path = out / RECORD
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EvidenceError(f"evidence: {out} has no {RECORD} (not an evidence folder of tenancy-audit run)") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise EvidenceError(f"evidence: {path} is not readable JSON ({type(exc).__name__})") from None
    if not isinstance(record, dict):
        raise EvidenceError(f"evidence: {path} is not a JSON object")
    if "scenario" not in record:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            record["scenario"] = json.loads((out / "findings.json").read_text()).get("scenario")
    return record


def evaluate(out: Path, record: dict[str, Any], base: baselines.AnyBaseline | None, *, seconds: float = 0.0,
             flows: Path | None = None, limits: Limits | None = None, policy: Policy | None = None) -> AuditResult:
    """The verdict of an evidence folder, from its files only. What the run saw live (driver findings, failed
    turns, teardown reasons, plants) comes from `record`; `policy`: the isolation policy (default: the one the
    run used, `policy.yaml` of the folder)."""
    registry = load(out / "registry.yaml")
    scenario = record.get("scenario") or "reconcile"
    try:
        phases = [Phase(**p) for p in record.get("phases", [])]
        live = [Finding.from_dict(d) for d in record.get("findings", [])]
        turns = failed_turns(record.get("turns", []))
    except (TypeError, KeyError, ValueError) as exc:
        raise EvidenceError(f"evidence: {out / RECORD} is malformed ({type(exc).__name__}: {exc})") from None
    rel = record.get("homes") or {}
    homes = {t.name: out / rel[t.name] if t.name in rel else Path(t.home) for t in registry if t.home}
    owners = record.get("log_owners") or {}
    logs = [LogSource(p, owners.get(p.name)) for p in sorted((out / "logs").glob("*.log"))]
    logs += [LogSource(p, None, "rpc") for p in sorted((out / "logs").glob("rpc-*.jsonl"))]
    stub_log = out / STUB_LOG
    rec = reconcile(registry, flows or out / "flows.mitm", homes=homes, logs=logs,
                    stub_log=stub_log if stub_log.exists() else None,
                    expect_snapshots=record.get("expect_snapshots"), phases=phases, empty_ok=True,
                    limits=limits or DEFAULT_LIMITS, service_records=out / SERVICE_RECORDS, kept_versions=out)
    starts = {(p.scenario, p.name): p.start for p in phases}
    live = [f if f.time is not None else replace(f, time=starts.get((f.scenario, f.phase))) for f in live + turns]
    found = [f if f.scenario else replace(f, scenario=scenario, phase=f.phase or "end") for f in rec.findings + live]
    policy = policy or evidence_policy(out)
    kept, allowed = policy.apply(found, record.get("launch") or registry.names()[0])
    planted = {name: frozenset(kinds) for name, kinds in (record.get("plants") or {}).items()}
    service_coverage = rec.coverage.service_table(record.get("services") or {}, kept, allowed)
    reasons = [*record.get("reasons", []), *rec.reasons, *check_plants(planted, found)]
    reasons += [f"service {s} was not driven in scenario {sc}: none of its requests reached its stub"
                for sc, row in service_coverage.items() for s in record.get("services_to_drive") or []
                if row.get(s) == "not driven"]
    return result_of(
        rec, registry.names(), scenario, kept, reasons=reasons, base=base, allowed=allowed,
        ran={(ph.scenario, ph.name) for ph in phases} | {(scenario, "end")},  # files: at the end
        warnings=[*venv_warnings(record, base), *(f"service {name} was not audited, {state}"
                                                  for name, state in (record.get("services") or {}).items()
                                                  if state != "on")],
        versions=versions(record.get("hermes-agent") or "?", record.get("hermes_venv")),
        timeline=record.get("turns", []), seconds=seconds,
        out=out, plants=sorted(planted), coverage=rec.coverage.table(record.get("tools") or [], kept, OUT_OF_SCOPE,
                                                                     allowed),
        services=service_coverage, policy=policy.to_dict())


def evidence_policy(out: Path) -> Policy:
    """The isolation policy an evidence folder was judged by (its `policy.yaml`), else the default one."""
    path = out / POLICY_COPY
    return policies.load(path if path.exists() else policies.DEFAULT)


def failed_turns(timeline: list[dict[str, Any]]) -> list[Finding]:
    """A turn, cron fire or phase step that did not happen is a shortfall naming what did not happen."""
    return [Finding("shortfall", e["tenant"], None, None, "env", f"{e['driver']}:{e['phase']}",
                    detail=f"{e['driver']} {e['phase']} of {e['tenant']} failed: {e['detail']}",
                    scenario=e.get("scenario"), phase=e["phase"])
            for e in timeline if not e["ok"]]


def check_plants(planted: dict[str, frozenset[str]], findings: list[Finding]) -> list[str]:
    """A plant whose finding kinds did not all appear means a detector is blind: not conclusive. A plant
    of a tool's store must also come back through one of its tools (`plants.TOOL_PLANTS`), a plant of a
    service's settings through that service (`plants.SERVICE_PLANTS`), a transient writer's in a version of a
    file gone by the end (`plants.TRANSIENT_PLANTS`)."""
    kinds = {f.kind for f in findings}
    through = {(f.kind, f.tool) for f in findings if f.tool and f.channel != "file"}  # the file scan does not count
    reasons = [f"plant {name} was not detected: missing {sorted(expected - kinds)}"
               for name, expected in planted.items() if not expected <= kinds]
    reasons += [f"plant {name} was not caught through a tool: none of {sorted(plants.TOOL_PLANTS[name])}"
                for name, expected in planted.items() if name in plants.TOOL_PLANTS
                and not {(k, t) for k in expected | {"request_leak"} for t in plants.TOOL_PLANTS[name]} & through]
    transient = {f.kind for f in findings if f.transient}
    reasons += [f"plant {name} was not caught in a file version gone by the end (transient)"
                for name, expected in planted.items() if name in plants.TRANSIENT_PLANTS and not expected & transient]
    services = {(f.kind, f.service) for f in findings if f.service}
    reasons += [f"plant {name} was not caught through its service {plants.SERVICE_PLANTS[name][0]}"
                for name, expected in planted.items() if name in plants.SERVICE_PLANTS
                and not {(k, plants.SERVICE_PLANTS[name][0]) for k in expected} & services]
    return reasons

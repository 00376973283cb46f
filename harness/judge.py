"""The verdict of an evidence folder, from its files only, and the one place an `AuditResult` is built.

`run` judges its folder once it has written it, and `reconcile EVIDENCE` judges it again later, so both reach
the same findings, fingerprints and verdict; `reconcile --registry --flows` judges loose files the same way.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import mitmproxy.version

import harness
from harness.core.distributions import TOOLS, differences
from harness.core.evidence import EvidenceFolder
from harness.core.findings import INCONCLUSIVE_KINDS, Finding, Verdict
from harness.core.protocol import OUT_OF_SCOPE
from harness.core.record import EvidenceError, RunRecord
from harness.core.registry_file import load
from harness.detect.engine.stream import DEFAULT_LIMITS, Limits
from harness.detect.reconcile import LogSource, Reading, Reconciliation, reconcile
from harness.detect.tools import door_table, platform_table
from harness.drive import plants
from harness.drive.doors import DOORS
from harness.drive.services import GROUP_SERVICES, SERVICES, TOOL_GROUPS
from harness.report import baseline as baselines
from harness.report import policy as policies
from harness.report.policy import Policy
from harness.report.result import AuditResult


def release_versions(hermes: str | None = None, venv: dict[str, Any] | None = None) -> dict[str, str]:
    """The versions a result names: Hermes' (when known) and the lock its venv was installed from (file and
    sha256, `made` when no lock was committed for it), mitmproxy's and this tool's."""
    lock = (venv or {}).get("lock")
    locked = {"hermes-lock": f"{lock['file']} {lock['sha256'][:12]}" + ("" if lock["committed"] else " (made)")
              } if lock else {}
    return {**({"hermes-agent": hermes} if hermes else {}), **locked, "mitmproxy": mitmproxy.version.VERSION,
            "tenancy-audit": harness.__version__}


def venv_warnings(record: RunRecord, base: baselines.AnyBaseline | None) -> list[str]:
    """One line for each way the audited Hermes venv is not what the lock, or the baseline's runs, had."""
    venv = record.hermes_venv
    if not venv:  # a folder from before venvs were recorded
        return []
    lock, version = venv.get("lock"), record.hermes_agent or "?"
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
        # a distribution only the SDKs of services, or doors, this run did not drive bring cannot have changed it
        declared = [(spec.packages, record.services.get(name) == "on") for name, spec in SERVICES.items()]
        declared += [(door.packages, record.doors.get(name) == "on") for name, door in DOORS.items()]
        used = frozenset(p for packages, on in declared if on for p in packages)
        unused = frozenset(p for packages, _ in declared for p in packages) - used
        differs = differences(venv["installed"], made_with["installed"], "the Hermes venv", ignore=TOOLS | unused,
                              against=("the one that made the baseline", "baseline"))
        lines += [differs] if differs else []
    return lines


def result_of(rec: Reconciliation | None, judged: Verdict, *, base: baselines.AnyBaseline | None = None,
              ran: set[tuple[str, str]] | None = None, warnings: list[str] | None = None,
              **fields: Any) -> AuditResult:
    """The result of a reconciliation (None: nothing was reconciled): the findings of `judged` split by the baseline
    into new, known and fixed (`ran`: the phases that ran), the verdict, and what was inspected; `fields`: the rest
    of `AuditResult` (tenants, scenario, versions, timeline, seconds, out, ...)."""
    findings, known, fixed, warnings = judged.findings, [], [], list(warnings or [])
    if base is not None:
        findings, known, fixed = baselines.split(judged.findings, base, ran)
        warnings += [base.warning] if base.warning else []
    seen = {} if rec is None else {
        "inspected": {**rec.inspected, "flows": rec.flows},
        "snapshots": {t: len(snaps) for t, snaps in rec.snapshots.items()},
        "not_inspected": [n.to_dict() for n in rec.not_inspected]}
    return AuditResult(Verdict(findings, known, judged.reasons, judged.allowed), fixed=fixed, warnings=warnings,
                       **seen, **fields)


def evaluate(out: Path, record: RunRecord, base: baselines.AnyBaseline | None, *, seconds: float = 0.0,
             flows: Path | None = None, limits: Limits | None = None, policy: Policy | None = None) -> AuditResult:
    """The verdict of an evidence folder, from its files only. What the run saw live (driver findings, failed
    turns, teardown reasons, plants) comes from `record`; `policy`: the isolation policy (default: the one the
    run used, `policy.yaml` of the folder)."""
    folder = EvidenceFolder(out)
    registry = load(folder.registry)
    scenario = record.scenario or "reconcile"
    try:
        turns = failed_turns(record.turns)
    except (TypeError, KeyError, ValueError, AttributeError) as exc:
        raise EvidenceError(f"evidence: {folder.record} is malformed ({type(exc).__name__}: {exc})") from None
    homes = {t.name: out / record.homes[t.name] if t.name in record.homes else Path(t.home) for t in registry if t.home}
    logs = [LogSource(p, record.log_owners.get(p.name)) for p in sorted(folder.logs.glob("*.log"))]
    logs += [LogSource(p, None, "rpc") for p in sorted(folder.logs.glob("rpc-*.jsonl"))]
    rec = reconcile(registry, flows or folder.flows, homes=homes, logs=logs,
                    stub_log=folder.stub_log if folder.stub_log.exists() else None, record=record,
                    reading=Reading(empty_ok=True, limits=limits or DEFAULT_LIMITS, folder=out))
    starts = {(p.scenario, p.name): p.start for p in record.phases}
    live = [f if f.time is not None else replace(f, time=starts.get((f.scenario, f.phase)))
            for f in record.findings + turns]
    found = [f if f.scenario else replace(f, scenario=scenario, phase=f.phase or "end") for f in rec.findings + live]
    policy = policy or evidence_policy(out)
    kept, allowed = policy.apply(found, record.launch or registry.names()[0])
    service_coverage = rec.coverage.service_table(record.services, kept, allowed,
                                                  {n: s.doors for n, s in SERVICES.items() if s.doors})
    door_coverage = door_table(record.doors, record.turns, kept, allowed)
    platform_coverage = platform_table(record.platforms, record.turns, kept, allowed)
    reasons = [*record.reasons, *rec.reasons, *check_plants(record.plants, found)]
    reasons += [f"service {s} was not driven in scenario {sc}: none of its requests reached its stub"
                for sc, row in service_coverage.items() for s in record.services_to_drive
                if row.get(s) == "not driven"]
    return result_of(
        rec, Verdict(kept, reasons=reasons, allowed=allowed), base=base,
        ran={(ph.scenario, ph.name) for ph in record.phases} | {(scenario, "end")},  # files: at the end
        warnings=[*venv_warnings(record, base), *(f"service {name} was not audited, {state}"  # asked, not offered
                                                  for name, state in record.services.items()
                                                  if state.startswith("n/a")), *refusals(rec)],
        tenants=registry.names(), scenario=scenario,
        versions=release_versions(record.hermes_agent or "?", record.hermes_venv), timeline=record.turns,
        seconds=seconds,
        out=out, plants=sorted(record.plants),
        coverage=rec.coverage.table(record.tools, kept, OUT_OF_SCOPE, allowed, left_out(record)),
        services=service_coverage, doors=door_coverage, platforms=platform_coverage, unset=record.unset,
        policy=policy.to_dict())


def refusals(rec: Reconciliation) -> list[str]:
    """A line naming the hosts no tenant routes that the proxy refused requests to (nothing was dialled; one that
    carried a canary is also an `egress` finding)."""
    if not rec.refused:
        return []
    hosts = ", ".join(f"{host} ({n})" for host, n in sorted(rec.refused.items()))
    return [f"the proxy refused {rec.refused.total()} request(s) to hosts no tenant routes, nothing dialled: {hosts}"]


def left_out(record: RunRecord) -> dict[str, str]:
    """The battery's tools this run's options left out, and the option that drives each: `--services NAME` for the
    tools of a service it did not set up, `--tools GROUP` for a group it did not run (a record without its tools
    says nothing)."""
    if not record.tools:
        return {}
    out = {t: f"--tools {g}" for g, tools in TOOL_GROUPS.items() if not set(tools) & set(record.tools) for t in tools}
    for group, names in GROUP_SERVICES.items():
        if not any(record.services.get(n) == "on" for n in names):
            out.update({t: f"--services {names[0]}" for t in TOOL_GROUPS[group]})
    return out


def evidence_policy(out: Path) -> Policy:
    """The isolation policy an evidence folder was judged by (its `policy.yaml`), else the default one."""
    path = EvidenceFolder(out).policy_copy
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
                and not expected <= INCONCLUSIVE_KINDS  # one that defeats the proof (a bot never signs in) carries none
                and not {(k, plants.SERVICE_PLANTS[name][0]) for k in expected} & services]
    return reasons

"""One audit, start to finish: options, evidence folder, session (mint, stubs, proxy), homes, scenario, stop,
reconcile, report.

The reader can follow an audit top to bottom in `run_audit`; its resources are set up and torn down by
`harness.session.AuditSession`, its verdict comes from `harness.judge.evaluate`, scenario drivers live in
`harness.drive.doors`, invariants in `harness.detect.reconcile`, output in `harness.report.result`.
"""

from __future__ import annotations

import contextlib
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.capture.file_versions import FileVersions, keep_only
from harness.capture.proxy import free_port
from harness.core import dsse
from harness.core.distributions import current
from harness.core.evidence import EvidenceFolder
from harness.core.files import write_private
from harness.core.findings import Verdict
from harness.core.record import RunRecord
from harness.detect.file_versions import version_of
from harness.drive import battery
from harness.drive.context import Context
from harness.drive.doors import SCENARIOS, door_states, doors_of, missing
from harness.drive.hermes import features
from harness.drive.hermes.agent import Hermes, HermesError, require_python
from harness.drive.hermes.install import venv_record
from harness.drive.hermes.rpc import BackendError
from harness.drive.homes import write_homes
from harness.drive.plants import plant_all
from harness.drive.services import PROBES, TOOL_GROUPS, unavailable
from harness.judge import evaluate, release_versions, result_of
from harness.options import RunOptions, check_options, hermes_python
from harness.report import baseline as baselines
from harness.report import policy as policies
from harness.report.attestation import write_manifest
from harness.report.redact import write_redacted
from harness.report.result import AuditResult, summary_table
from harness.report.writer import write_reports
from harness.session import AuditSession, Guard, Interrupted, Setup, tenant_names


def progress(quiet: bool, msg: str) -> None:
    if not quiet:
        print(f"[tenancy] {msg}", file=sys.stderr, flush=True)


@dataclass
class RunState:
    """What one audit has done so far: its scenario context, Hermes' version, the plants and why it may not be
    conclusive (what an interrupted one still reports)."""

    opts: RunOptions
    out: Path
    started: float = field(default_factory=time.monotonic)
    ctx: Context | None = None
    version: str | None = None
    venv: dict[str, Any] = field(default_factory=dict)  # `install.venv_record` of the Hermes audited, at the end
    planted: dict[str, frozenset[str]] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    done: bool = False  # the evidence is complete (sealed): an interrupt while tearing down leaves it so

    def say(self, msg: str) -> None:
        progress(self.opts.quiet, msg)


def run_audit(opts: RunOptions) -> AuditResult:
    """Run one audit, write its evidence folder (`result.out`) and return its result. On SIGINT/SIGTERM the
    folder still gets its reports (verdict inconclusive, reason `interrupted`) before `Interrupted` is raised."""
    check_options(opts)
    key = dsse.signing_key(opts.sign_key) if opts.sign_key else None  # a key that cannot sign: before any writing
    base = baselines.load(opts.baseline) if opts.baseline else None
    policy = policies.load(opts.policy)  # a bad policy is one line, exit 2, before anything is written
    python = hermes_python(opts.hermes_python, lambda line: progress(opts.quiet, line))
    require_python(python)
    folder = EvidenceFolder.for_run(opts.out, opts.force)
    audit = RunState(opts, folder.path)
    out = audit.out
    if base is not None and base.warning:
        audit.say(f"warning: {base.warning}")
    setup = Setup(opts.topology, opts.service_names(), opts.stubs, opts.stub_fault, opts.scenario)
    guard = Guard(signals=True, reap=True, on_interrupt=lambda exc: _report_interrupted(audit, exc), say=audit.say)
    with AuditSession(out, tenant_names(opts.tenants), setup=setup, guard=guard) as session:
        session.open(wait=False)
        _drive(audit, session, Hermes(python, session.sandbox, session.procs, out / "logs"))
        audit.reasons += session.finish()
        audit.venv = venv_record(python, audit.version)
        record = _record(audit)
        if opts.baseline is not None:
            write_private(folder.baseline_copy, Path(opts.baseline).read_bytes())
        write_private(folder.policy_copy, yaml.safe_dump(policy.to_dict(), sort_keys=False).encode())
        audit.say("phase reconcile: flows.mitm, homes, logs")
        result = evaluate(out, record, base, seconds=time.monotonic() - audit.started, policy=policy)
        v = result.verdict
        keep_only(out, {i for f in [*v.findings, *v.known, *v.allowed] if (i := version_of(f))})
        write_reports(out, result)
        for line in summary_table(result).splitlines():
            audit.say(line)
        if opts.redact:
            write_redacted(out, session.require_registry())
        folder.seal()
        write_manifest(out, result, audit.venv.get("lock"), key)  # last: every other file is its subject
        audit.done = True
        return result


def _report_interrupted(audit: RunState, exc: Interrupted) -> None:
    """findings.json and the reports of a run stopped by a signal: inconclusive, nothing reconciled. A run
    stopped while tearing down after its evidence was complete keeps that evidence (still exit 3)."""
    if audit.done or not audit.out.is_dir():
        return
    reason = f"interrupted ({exc}): the run was stopped before it finished; nothing was reconciled"
    result = result_of(None, Verdict([], reasons=[reason]), tenants=tenant_names(audit.opts.tenants),
                       scenario=audit.opts.scenario, versions=release_versions("?"),
                       timeline=audit.ctx.timeline if audit.ctx else [], seconds=time.monotonic() - audit.started,
                       out=audit.out, plants=list(audit.opts.plants))
    folder = EvidenceFolder(audit.out)
    with contextlib.suppress(Exception):
        folder.phase_file.unlink(missing_ok=True)
        if audit.ctx is not None:  # what `reconcile` of the folder needs later (it stays inconclusive: the reason)
            _record(RunState(audit.opts, audit.out, ctx=audit.ctx, reasons=[reason]))
        write_reports(audit.out, result)
        folder.seal()


def _record(audit: RunState) -> RunRecord:
    """Write the run's record (`timeline.json`, see docs/contracts.md) and return it."""
    ctx, out = audit.ctx, audit.out
    assert ctx is not None, "the scenario has not started"
    record = RunRecord(
        scenario=audit.opts.scenario, hermes_agent=audit.version, phases=ctx.phases, turns=ctx.timeline,
        findings=ctx.findings, reasons=audit.reasons, expect_snapshots=ctx.expected_snapshots(),
        log_owners={p.name: ctx.log_owner(p) for p in sorted((out / "logs").glob("*.log"))},
        plants=audit.planted,
        homes={t.name: Path(t.home).resolve().relative_to(out).as_posix() for t in ctx.registry if t.home},
        tools=[t for g in ctx.opts.tools for t in TOOL_GROUPS[g]], services=ctx.service_states(),
        services_to_drive=ctx.services_to_drive(), launch=ctx.sandbox.launch, file_versions=ctx.versions_kept,
        hermes_venv=audit.venv, harness_venv=current(),
        doors=door_states(audit.opts.scenario, [*(audit.opts.phases or ()), *(p.name for p in ctx.phases)]),
        platforms=ctx.platform_states(), unset={t: s for t in ctx.registry.names() if (s := ctx.unset_by(t))})
    record.write(out)
    return record


def _drive(audit: RunState, session: AuditSession, hermes: Hermes) -> None:
    """Check Hermes, write the homes, plant, and drive the scenario while mitmdump comes up; `audit` gets the
    scenario context, Hermes' version, the plants and why the run may not be conclusive."""
    opts, proxy, registry = audit.opts, session.proxy, session.require_registry()
    assert proxy is not None, "mitmdump was not started"
    # Hermes' check, the homes and the scenario go on while mitmdump starts: a connection made before it
    # serves waits in the backlog of the listener it was handed, and is served with the addon loaded.
    with ThreadPoolExecutor(max_workers=1) as pool:
        coming_up = pool.submit(proxy.wait_ready)
        try:
            version = hermes.check()
            offered = features.probe(hermes, version, PROBES)
            lack = missing(offered, opts.scenario) or unavailable(offered.offers, opts.service_names())
            if lack:
                raise HermesError(f"hermes-agent {version} cannot drive {lack}")
        except HermesError:
            proxy.stop()
            EvidenceFolder(audit.out).discard()
            raise
        audit.version = version
        hermes.usage_file = offered.usage_file
        audit.say(f"Hermes {version}; {len(registry.names())} tenants; scenario {opts.scenario}; {opts.topology}")
        hermes.route_env = proxy.child_env()
        ctx = audit.ctx = Context(
            registry=registry, registry_path=session.registry_path, sandbox=session.sandbox, hermes=hermes,
            proxy=proxy, stubs=session.stubs, opts=opts.scenario_options(), out=audit.out, say=audit.say,
            scenario=opts.scenario, gateway_port=free_port() if any(d.gateway for d in doors_of(opts.scenario)) else 0,
            service_stubs=session.service_stubs, features=offered)
        write_homes(ctx)
        battery.mint(ctx)
        ctx.versions = FileVersions([session.sandbox.home_of(t.name) for t in registry], audit.out).start()
        audit.planted = plant_all(ctx, opts.plants)
        try:
            SCENARIOS[opts.scenario](ctx)
        except BackendError as exc:
            audit.reasons.append(f"driver failed: {exc}")
        finally:
            for log in ctx.rpc_logs.values():
                log.close()
            for writer in ctx.during:
                writer.join()
            ctx.versions_kept = ctx.versions.stop()
        coming_up.result()  # ProxyError if it never came up: nothing was recorded

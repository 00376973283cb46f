"""One audit, start to finish: mint, stubs, proxy, homes, scenario, stop, reconcile, report.

The reader can follow an audit top to bottom in `run_audit`; scenario drivers live in
`harness.drive.scenarios`, invariants in `harness.detect.reconcile`, output in `harness.report.result`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import mitmproxy.version
import yaml

import harness
from harness.capture.proxy import FORWARD_DOMAIN, Proxy, bind_listener, free_port, port_of
from harness.capture.services.base import MODES, Service, stop_all
from harness.capture.services.provider import StubProvider
from harness.capture.versions import FileVersions, keep_only
from harness.core.files import seal, write_private
from harness.core.findings import Finding, Verdict
from harness.core.places import evidence_root
from harness.core.procs import ProcessSet, reap_stale
from harness.core.protocol import OUT_OF_SCOPE, TOOL_GROUPS
from harness.core.registry import PROVIDER, Registry, load, mint
from harness.detect.engine.stream import DEFAULT_LIMITS, Limits
from harness.detect.reconcile import EvidenceError, LogSource, Phase, reconcile
from harness.detect.versions import version_of
from harness.drive import battery, features, plants, services
from harness.drive.backends import BackendError
from harness.drive.context import Context, ScenarioOptions
from harness.drive.hermes import Hermes, HermesError, Sandbox, require_python, write_home
from harness.drive.install import default_python
from harness.drive.phases import ALL_PHASES
from harness.drive.scenarios import SCENARIOS
from harness.drive.services import SERVICE_RECORDS, SERVICES
from harness.report import baseline as baselines
from harness.report import policy as policies
from harness.report.policy import Policy
from harness.report.redact import write_redacted
from harness.report.result import AuditResult, summary_table
from harness.report.writer import write_reports

#: The run's record in the evidence folder: phases, turns, what drivers saw live (what `evaluate` reads).
RECORD = "timeline.json"
#: A copy of the baseline the run was judged against (`reconcile EVIDENCE` uses it by default).
BASELINE_COPY = "baseline.json"
#: The isolation policy the run was judged by (`reconcile EVIDENCE` uses it by default).
POLICY_COPY = "policy.yaml"
#: Where the harness names the current scenario/phase for the addon while the run goes on.
PHASE_FILE = "phase.json"


class UsageError(ValueError):
    """Bad options or output folder; one line, exit 2."""


@dataclass
class RunOptions:
    scenario: str = "oneshot"
    tenants: int = 2
    topology: str = "reverse"
    plants: list[str] = field(default_factory=list)
    baseline: Path | None = None
    out: Path | None = None
    hermes_python: Path | None = None
    force: bool = False
    quiet: bool = False
    turns: int = 1
    timeout: float = 180.0
    stub_fault: str = ""
    redact: bool = False  # also write redacted/: flows, ledger, reports with every secret as <tenant:kind>
    phases: list[str] = field(default_factory=list)  # multi-profile phases to run (default: all but cron)
    cron_wait: float = 75.0
    tools: list[str] | None = None  # tool battery groups (None: every group; []: the env probe only)
    stubs: str = "observe"  # "strict": a stub answers a foreign key with 401
    policy: str = policies.DEFAULT  # the isolation policy: `hermes`, `strict` or a policy file
    services: list[str] | None = None  # services besides the provider (None: every one; []: the provider only)

    def tool_groups(self) -> list[str]:
        return list(TOOL_GROUPS) if self.tools is None else list(self.tools)

    def service_names(self) -> list[str]:
        return list(SERVICES) if self.services is None else list(self.services)

    def scenario_options(self) -> ScenarioOptions:
        return ScenarioOptions(turns=self.turns, timeout=self.timeout, phases=list(self.phases),
                               cron_wait=self.cron_wait, tools=self.tool_groups(), services=self.service_names())


def tenant_names(n: int) -> list[str]:
    greek = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda"]
    rest = greek + [f"tenant{i}" for i in range(len(greek), n)]
    return ["default", *rest[: n - 1]]


def hermes_python(opt: Path | None, say: Callable[[str], None] | None = None) -> Path:
    """--hermes-python, else $TENANCY_HERMES_PYTHON, else the default (`install.default_python`: installed first
    when `say` is given); absolute, links kept (a venv's python is a symlink, and resolving it would leave the
    venv)."""
    if opt is not None:
        return Path(os.path.abspath(opt))
    if env := os.environ.get("TENANCY_HERMES_PYTHON"):
        return Path(os.path.abspath(env))
    return default_python(say)


def prepare_out(out: Path | None, force: bool) -> Path:
    """The evidence folder: new, or empty, or (with --force) emptied; mode 0700."""
    if out is None:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        out = evidence_root() / stamp
        n = 1
        while out.exists():
            out = evidence_root() / f"{stamp}-{n}"
            n += 1
    out = out.resolve()
    created = not out.exists()
    if not created:
        if not out.is_dir():
            raise UsageError(f"--out {out} exists and is not a directory")
        try:
            empty = not any(out.iterdir())
        except OSError as exc:
            raise UsageError(f"--out {out}: cannot list it ({exc.strerror or exc})") from None
        if not empty:
            if not force:
                raise UsageError(f"--out {out} exists and is not empty (pass --force to replace it)")
            if not (out / "registry.yaml").exists():
                raise UsageError(f"--out {out} is not an evidence folder; refusing to empty it even with --force")
            try:
                shutil.rmtree(out)
            except OSError as exc:
                raise UsageError(f"--out {out}: cannot empty it ({exc.strerror or exc})") from None
    return make_out_dir(out, created)


def make_out_dir(out: Path, created: bool) -> Path:
    """Create `out` with mode 0700 and prove it writable here and now (not a read-only or pseudo file system).
    On failure the folder is removed again if it is new (`created`), and the error is one line."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        out.chmod(0o700)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()
        raise UsageError(f"--out {out}: cannot create a writable folder there ({exc.strerror or exc})") from None
    return out


class Interrupted(BaseException):
    """SIGTERM/SIGINT: unwind through every `finally` so children are reaped."""


def _interrupter(procs: ProcessSet) -> Callable[[int, Any], None]:
    """SIGTERM/SIGINT: stop every child at once (no worker thread waits out its turn), then unwind; a
    second signal is ignored so that teardown always finishes."""
    fired = False

    def handler(signum: int, _frame: Any) -> None:
        nonlocal fired
        if not fired:
            fired = True
            procs.terminate()
            raise Interrupted(signal.Signals(signum).name)

    return handler


def _discard(out: Path) -> None:
    """A run that failed before it audited anything leaves no half-written evidence folder."""
    shutil.rmtree(out, ignore_errors=True)


def progress(quiet: bool, msg: str) -> None:
    if not quiet:
        print(f"[tenancy] {msg}", file=sys.stderr, flush=True)


def check_options(opts: RunOptions) -> None:
    """Every option is valid before anything is written (UsageError otherwise)."""
    if opts.scenario not in SCENARIOS:
        raise UsageError(f"unknown scenario {opts.scenario!r} (choose from {', '.join(SCENARIOS)})")
    for p in opts.plants:
        if p not in plants.PLANTS:
            raise UsageError(f"unknown plant {p!r} (choose from {', '.join(plants.PLANTS)})")
        if plants.TOPOLOGY.get(p, opts.topology) != opts.topology:
            raise UsageError(f"plant {p!r} needs --topology {plants.TOPOLOGY[p]}")
        if p in plants.SCENARIO and opts.scenario not in (plants.SCENARIO[p], "serve", "gateway", "all"):
            raise UsageError(f"plant {p!r} needs a scenario whose Hermes offers its tool (--scenario "
                             f"{plants.SCENARIO[p]}, serve, gateway or all)")
    for ph in opts.phases:
        if ph not in ALL_PHASES:
            raise UsageError(f"unknown phase {ph!r} (choose from {', '.join(ALL_PHASES)})")
    unknown = battery.check_groups(opts.tool_groups())
    if unknown:
        raise UsageError(f"unknown tool group {unknown[0]!r} (choose from {', '.join(TOOL_GROUPS)}, or none)")
    unknown = services.check(opts.service_names())
    if unknown:
        raise UsageError(f"unknown service {unknown[0]!r} (choose from {', '.join(SERVICES)}, or none)")
    for p in opts.plants:
        if p in plants.SERVICE_PLANTS and plants.SERVICE_PLANTS[p][0] not in opts.service_names():
            raise UsageError(f"plant {p!r} needs the service {plants.SERVICE_PLANTS[p][0]!r} (--services)")
    if opts.stubs not in MODES:
        raise UsageError(f"unknown stub mode {opts.stubs!r} (choose from {', '.join(MODES)})")
    if opts.tenants < 2:
        raise UsageError("--tenants must be at least 2")


def run_audit(opts: RunOptions) -> AuditResult:
    """Run one audit, write its evidence folder (`result.out`) and return its result. On SIGINT/SIGTERM the
    folder still gets its reports (verdict inconclusive, reason `interrupted`) before `Interrupted` is raised."""
    check_options(opts)
    base = baselines.load(opts.baseline) if opts.baseline else None
    policy = policies.load(opts.policy)  # a bad policy is one line, exit 2, before anything is written
    python = hermes_python(opts.hermes_python, lambda line: progress(opts.quiet, line))
    require_python(python)
    out = prepare_out(opts.out, opts.force)
    if base is not None and base.warning:
        progress(opts.quiet, f"warning: {base.warning}")
    reaped = reap_stale()
    if reaped:
        progress(opts.quiet, f"reaped {reaped} process(es) left by an earlier run")
    procs = ProcessSet()
    old = {s: signal.signal(s, _interrupter(procs)) for s in (signal.SIGTERM, signal.SIGINT)}
    started = time.monotonic()
    stubs: dict[str, StubProvider] = {}
    service_stubs: dict[tuple[str, str], Service] = {}
    proxy: Proxy | None = None
    names = tenant_names(opts.tenants)
    driven: list[Context] = []  # the scenario context, once there is one (what an interrupted run reports)
    interrupted: Interrupted | None = None
    try:
        sandbox = Sandbox(out / "sandbox")
        registry, listeners = _tenants(opts, names, sandbox, stubs, service_stubs, out)
        registry_path = out / "registry.yaml"
        registry.save(registry_path)
        hermes = Hermes(python, sandbox, procs, out / "logs")
        proxy = Proxy(registry, registry_path, out, procs, topology=opts.topology, listeners=listeners,
                      phase_file=out / PHASE_FILE)
        proxy.label(opts.scenario, "end")  # outside every phase, as the home scans
        proxy.spawn()
        ctx, planted, version, reasons = _drive(opts, registry, registry_path, sandbox, hermes, proxy, stubs, out,
                                                driven, service_stubs)
        if not proxy.alive():
            reasons.append("mitmdump died during the run; flows after its death were not recorded")
        proxy.stop()
        reasons += procs.quiesce()
        write_stub_log(out / "stubs.jsonl", [*stubs.values(), *service_stubs.values()])
        (out / PHASE_FILE).unlink(missing_ok=True)
        record = _record(out, opts.scenario, ctx, version, reasons, planted)
        if opts.baseline is not None:
            write_private(out / BASELINE_COPY, Path(opts.baseline).read_bytes())
        write_private(out / POLICY_COPY, yaml.safe_dump(policy.to_dict(), sort_keys=False).encode())
        progress(opts.quiet, f"phase reconcile: {proxy.flows_path.name}, homes, logs")
        result = evaluate(out, record, base, seconds=time.monotonic() - started, policy=policy)
        v = result.verdict
        keep_only(out, {i for f in [*v.findings, *v.known, *v.allowed] if (i := version_of(f))})
        write_reports(out, result)
        for line in summary_table(result).splitlines():
            progress(opts.quiet, line)
        if opts.redact:
            write_redacted(out, registry)
        seal(out)
        return result
    except Interrupted as exc:
        interrupted = exc
        raise
    finally:
        with contextlib.suppress(Exception):
            if proxy is not None:
                proxy.stop()
        stop_all([*stubs.values(), *service_stubs.values()])
        survivors = procs.close()
        if interrupted is not None and out.is_dir():  # our handler still ignores a second signal meanwhile
            _report_interrupted(out, opts, names, driven, interrupted, time.monotonic() - started)
        for s, handler in old.items():
            signal.signal(s, handler)
        if survivors:
            print(f"tenancy-audit: {len(survivors)} child process(es) survived teardown", file=sys.stderr)


def _tenants(opts: RunOptions, names: list[str], sandbox: Sandbox, stubs: dict[str, StubProvider],
             service_stubs: dict[tuple[str, str], Service], out: Path) -> tuple[Registry, list[socket.socket]]:
    """Bind the listeners (one per tenant and proxied service in the reverse topology, else one), mint the
    tenants, start their provider and service stubs (into `stubs`, `service_stubs`) and record every route and
    upstream in the registry. The listeners are bound first, so the registry names the ports mitmdump will
    serve (never a taken one)."""
    wanted = opts.service_names()
    proxied = [s for s in wanted if SERVICES[s].proxied]
    ends = [(n, s) for n in names for s in (PROVIDER, *proxied)] if opts.topology == "reverse" else [("", "")]
    listeners = {end: bind_listener() for end in ends}

    def route(tenant: str, service: str) -> dict[str, Any]:
        if opts.topology == "reverse":
            return {"listen": port_of(listeners[(tenant, service)])}
        host = f"{tenant}.{FORWARD_DOMAIN}"
        return {"host": host if service == PROVIDER else f"{service}.{host}"}

    registry = mint(names, sandbox.root / "work", {n: route(n, PROVIDER) for n in names})
    services.mint(registry, wanted)
    for t in registry:
        stubs[t.name] = StubProvider(t, opts.stubs, fault=opts.stub_fault).start()
        t.upstream = stubs[t.name].url
        t.home = str(sandbox.home_of(t.name))
        registry.add_canary(t.name, "home", t.home)  # a path of it elsewhere is a finding (`wrong_path` in an env)
        for name in wanted:
            stub = service_stubs[(t.name, name)] = SERVICES[name].make(t, opts.stubs).start()
            services.attach(registry, name, t.name, route(t.name, name) if name in proxied else None, stub.url)
    (out / SERVICE_RECORDS).mkdir(mode=0o700, exist_ok=True)
    return registry, list(listeners.values())


def _report_interrupted(out: Path, opts: RunOptions, names: list[str], driven: list[Context], exc: Interrupted,
                        seconds: float) -> None:
    """findings.json and the reports of a run stopped by a signal: inconclusive, nothing reconciled."""
    timeline = driven[0].timeline if driven else []
    reason = f"interrupted ({exc}): the run was stopped before it finished; nothing was reconciled"
    result = AuditResult(Verdict([], [], [reason]), names, opts.scenario, _versions(None), timeline=timeline,
                         seconds=seconds, out=out, plants=list(opts.plants))
    with contextlib.suppress(Exception):
        (out / PHASE_FILE).unlink(missing_ok=True)
        if driven:  # what `reconcile` of the folder needs later (it stays inconclusive: the reason is recorded)
            _record(out, opts.scenario, driven[0], None, [reason], {})
        write_reports(out, result)
        seal(out)


def _record(out: Path, scenario: str, ctx: Context, version: str | None, reasons: list[str],
            planted: dict[str, frozenset[str]]) -> dict[str, Any]:
    """Write the run's record (`timeline.json`, see docs/contracts.md) and return it."""
    record = {
        "scenario": scenario, "hermes-agent": version,
        "phases": [p.__dict__ for p in ctx.phases], "turns": ctx.timeline,
        "findings": [f.to_dict() for f in ctx.findings], "reasons": reasons,
        "expect_snapshots": ctx.expected_snapshots(),
        "log_owners": {p.name: ctx.log_owner(p) for p in sorted((out / "logs").glob("*.log"))},
        "plants": {name: sorted(kinds) for name, kinds in planted.items()},
        "homes": {t.name: Path(t.home).resolve().relative_to(out).as_posix() for t in ctx.registry if t.home},
        "tools": [t for g in ctx.opts.tools for t in TOOL_GROUPS[g]],
        "services": ctx.service_states(),
        "services_to_drive": ctx.services_to_drive(),
        "launch": ctx.sandbox.launch,
        "file_versions": ctx.versions_kept,
    }
    write_private(out / RECORD, json.dumps(record, indent=2).encode())
    return record


def _versions(hermes: str | None) -> dict[str, str]:
    return {"hermes-agent": hermes or "?", "mitmproxy": mitmproxy.version.VERSION,
            "tenancy-audit": harness.__version__}


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


def evaluate(out: Path, record: dict[str, Any], base: baselines.Baseline | None, *, seconds: float = 0.0,
             flows: Path | None = None, limits: Limits | None = None, policy: Policy | None = None) -> AuditResult:
    """The verdict of an evidence folder, from its files only: `run` calls this once it has written them, and
    `reconcile EVIDENCE` calls it again later, so both reach the same findings, fingerprints and verdict.
    What the run saw live (driver findings, failed turns, teardown reasons, plants) comes from `record`;
    `policy`: the isolation policy (default: the one the run used, `policy.yaml` of the folder)."""
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
    stub_log = out / "stubs.jsonl"
    rec = reconcile(registry, flows or out / "flows.mitm", homes=homes, logs=logs,
                    stub_log=stub_log if stub_log.exists() else None,
                    expect_snapshots=record.get("expect_snapshots"), phases=phases, empty_ok=True,
                    limits=limits or DEFAULT_LIMITS, service_records=out / SERVICE_RECORDS, kept_versions=out)
    starts = {(p.scenario, p.name): p.start for p in phases}
    live = [f if f.time is not None else replace(f, time=starts.get((f.scenario, f.phase))) for f in live + turns]
    found = [f if f.scenario else replace(f, scenario=scenario, phase=f.phase or "end") for f in rec.findings + live]
    reasons = [*record.get("reasons", []), *rec.reasons]
    policy = policy or evidence_policy(out)
    kept, allowed = policy.apply(found, record.get("launch") or registry.names()[0])
    findings, known, fixed = kept, [], []
    warnings = [f"service {name} was not audited, {state}" for name, state in (record.get("services") or {}).items()
                if state != "on"]
    if base is not None:
        ran = {(ph.scenario, ph.name) for ph in phases} | {(scenario, "end")}  # files: at the end
        findings, known, fixed = baselines.split(kept, base, ran)
        warnings += [base.warning] if base.warning else []
    planted = {name: frozenset(kinds) for name, kinds in (record.get("plants") or {}).items()}
    reasons += check_plants(planted, found)
    coverage = rec.coverage.table(record.get("tools") or [], kept, OUT_OF_SCOPE, allowed)
    service_coverage = rec.coverage.service_table(record.get("services") or {}, kept, allowed)
    reasons += [f"service {s} was not driven in scenario {sc}: none of its requests reached its stub"
                for sc, row in service_coverage.items() for s in record.get("services_to_drive") or []
                if row.get(s) == "not driven"]
    return AuditResult(Verdict(findings, known, reasons, allowed), registry.names(), scenario,
                       _versions(record.get("hermes-agent")), inspected={**rec.inspected, "flows": rec.flows},
                       timeline=record.get("turns", []), fixed=fixed, seconds=seconds,
                       snapshots={t: len(snaps) for t, snaps in rec.snapshots.items()}, out=out,
                       plants=sorted(planted), warnings=warnings,
                       not_inspected=[n.to_dict() for n in rec.not_inspected], coverage=coverage,
                       services=service_coverage, policy=policy.to_dict())


def evidence_policy(out: Path) -> Policy:
    """The isolation policy an evidence folder was judged by (its `policy.yaml`), else the default one."""
    path = out / POLICY_COPY
    return policies.load(path if path.exists() else policies.DEFAULT)


def _drive(
    opts: RunOptions, registry: Registry, registry_path: Path, sandbox: Sandbox, hermes: Hermes, proxy: Proxy,
    stubs: dict[str, StubProvider], out: Path, driven: list[Context], service_stubs: dict[tuple[str, str], Service],
) -> tuple[Context, dict[str, frozenset[str]], str, list[str]]:
    """Check Hermes, write the homes, plant, and drive the scenario while mitmdump comes up; returns the
    scenario context, the plants, Hermes' version and why the run may not be conclusive."""
    reasons: list[str] = []
    # Hermes' check, the homes and the scenario go on while mitmdump starts: a connection made before it
    # serves waits in the backlog of the listener it was handed, and is served with the addon loaded.
    with ThreadPoolExecutor(max_workers=1) as pool:
        coming_up = pool.submit(proxy.wait_ready)
        try:
            version = hermes.check()
            offered = features.probe(hermes, version)
            lack = features.missing(offered, opts.scenario)
            if lack:
                raise HermesError(f"hermes-agent {version} cannot drive {lack}")
        except HermesError:
            proxy.stop()
            _discard(out)
            raise
        hermes.usage_file = offered.usage_file
        progress(opts.quiet, f"Hermes {version}; {len(registry.names())} tenants; scenario {opts.scenario}; "
                             f"{opts.topology}")
        hermes.route_env = proxy.child_env()
        ctx = Context(registry=registry, registry_path=registry_path, sandbox=sandbox, hermes=hermes, proxy=proxy,
                      stubs=stubs, opts=opts.scenario_options(), out=out, say=lambda m: progress(opts.quiet, m),
                      scenario=opts.scenario,
                      gateway_port=free_port() if opts.scenario in ("gateway", "all") else 0,
                      service_stubs=service_stubs, features=offered)
        driven.append(ctx)
        write_homes(ctx)
        battery.mint(ctx)
        ctx.versions = FileVersions([sandbox.home_of(t.name) for t in registry], out).start()
        planted = plant_all(ctx, opts.plants)
        try:
            SCENARIOS[opts.scenario](ctx)
        except BackendError as exc:
            reasons.append(f"driver failed: {exc}")
        finally:
            for log in ctx.rpc_logs.values():
                log.close()
            for writer in ctx.during:
                writer.join()
            ctx.versions_kept = ctx.versions.stop()
        coming_up.result()  # ProxyError if it never came up: nothing was recorded
    return ctx, planted, version, reasons


def write_homes(ctx: Context) -> None:
    """Every tenant's Hermes home: its provider, and every service the release supports (`ctx.services()`)."""
    active = ctx.services()
    for t in ctx.registry:
        where = {s: services.Where(ctx.proxy.service_url(t.name, s) if SERVICES[s].proxied else "",
                                   ctx.registry_path, ctx.out / SERVICE_RECORDS) for s in active}
        extra = services.setup(t, active, where, second=t.name == ctx.registry.names()[1])
        home = ctx.sandbox.home_of(t.name)
        write_home(t, home, ctx.proxy.base_url(t.name), launch=t.name == ctx.sandbox.launch,
                   extra_config=services.merged(ctx.extra_config(t.name), extra.config), extra_env=extra.env)
        for rel, data in extra.files.items():
            write_private(home / rel, data)
        for rel, data in extra.workdir_files.items():
            (Path(t.canaries["workdir"]) / rel).write_bytes(data)


def failed_turns(timeline: list[dict[str, Any]]) -> list[Finding]:
    """A turn, cron fire or phase step that did not happen is a shortfall naming what did not happen."""
    return [Finding("shortfall", e["tenant"], None, None, "env", f"{e['driver']}:{e['phase']}",
                    detail=f"{e['driver']} {e['phase']} of {e['tenant']} failed: {e['detail']}",
                    scenario=e.get("scenario"), phase=e["phase"])
            for e in timeline if not e["ok"]]


def plant_all(ctx: Context, names: list[str]) -> dict[str, frozenset[str]]:
    """Plant every named negative control (the first tenant's data into the second's home)."""
    tenants = ctx.registry.names()
    donor, target = ctx.registry[tenants[0]], ctx.registry[tenants[1]]
    planted = {}
    for name in names:
        pc = plants.PlantContext(donor, target, ctx.sandbox.home_of(target.name), ctx.proxy.base_url(donor.name),
                                 ctx.stubs[target.name].url)
        planted[name] = plants.apply(name, pc)
        ctx.during += pc.during
        ctx.say(f"planted {name}: {donor.name} -> {target.name}")
    return planted


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


def write_stub_log(path: Path, stubs: list[Service]) -> None:
    """`stubs.jsonl`: every request every stub saw, one line each (what `_bypass` checks against the flows)."""
    lines = [json.dumps({"tenant": s.tenant.name, **r.to_dict()}) for s in stubs for r in s.snapshot()]
    write_private(path, ("\n".join(lines) + "\n").encode() if lines else b"")

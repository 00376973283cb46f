"""`tenancy-audit`: run, reconcile, scan, selftest, baseline, matrix, merge, export, cleanup. Exit 0 clean, 1 leak,
2 error, 3 inconclusive."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import mitmproxy.version

import harness
from harness.capture.proxy import ProxyError
from harness.capture.services.base import MODES, ServiceError
from harness.capture.services.provider import FAULTS
from harness.core.files import write_private
from harness.core.findings import (
    EXIT_CLEAN,
    EXIT_ERROR,
    EXIT_INCONCLUSIVE,
    EXIT_LEAK,
    INCONCLUSIVE_KINDS,
    Finding,
    Verdict,
)
from harness.core.procs import reap_stale
from harness.core.protocol import TOOL_GROUPS
from harness.core.registry import RegistryError, load
from harness.core.severity import docs_url
from harness.detect import scan, stream
from harness.detect.matcher import matcher_for
from harness.detect.reconcile import EvidenceError, LogSource, read_flows, reconcile
from harness.drive import plants, scenarios
from harness.drive.hermes import HermesError
from harness.drive.phases import ALL_PHASES
from harness.drive.services import SERVICES
from harness.judge import BASELINE_COPY, evaluate, read_record
from harness.matrix import MatrixOptions, merge_dirs, parse_releases, parse_scenarios, parse_shard, repeat, run_matrix
from harness.report import baseline, export
from harness.report import policy as policies
from harness.report.baseline import BaselineError
from harness.report.matrix import NA, MatrixError, cell_text, wilson
from harness.report.policy import PolicyError
from harness.report.result import AuditResult, groups
from harness.report.writer import write_reports
from harness.run import Interrupted, RunOptions, UsageError, hermes_python, run_audit

ERRORS = (RegistryError, EvidenceError, HermesError, UsageError, BaselineError, MatrixError, ServiceError,
          PolicyError)
FAIL_ON = ("leak", "inconclusive", "never")


def hermes_version(python: Path) -> str:
    """The hermes-agent version installed for `python`, or why there is none."""
    if not python.exists():
        return f"not installed ({python} does not exist)"
    code = "from importlib.metadata import version; print(version('hermes-agent'))"
    try:
        done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({python}: {exc})"
    if done.returncode != 0:
        return f"not installed for {python}"
    return done.stdout.strip()


def version_text() -> str:
    python = hermes_python(None)
    return (f"tenancy-audit {harness.__version__}\nmitmproxy {mitmproxy.version.VERSION}\n"
            f"hermes-agent {hermes_version(python)} ({python})")


class _Version(argparse.Action):
    """`--version`: this tool, mitmproxy, and the Hermes a `run` would audit ($TENANCY_HERMES_PYTHON or the pin)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the versions of tenancy-audit, mitmproxy and "
                         "the Hermes a run would audit, then exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(version_text())
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tenancy-audit", description=__doc__)
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="command", required=True)
    fail_on = argparse.ArgumentParser(add_help=False)
    fail_on.add_argument("--fail-on", choices=FAIL_ON, default="inconclusive",
                         help="what fails the command: a leak only (inconclusive exits 0), a leak or an inconclusive "
                              "run (the default: exit 1 or 3), or never (exit 0; errors still exit 2)")

    run = sub.add_parser("run", parents=[fail_on], help="drive Hermes through the proxy and write an evidence folder")
    run.add_argument("--scenario", default="oneshot", choices=sorted(scenarios.SCENARIOS))
    run.add_argument("--tenants", type=int, default=None, help="number of tenants (default 2; 3 for backends)")
    run.add_argument("--topology", default="reverse", choices=["reverse", "forward"])
    run.add_argument("--plant", action="append", default=[], choices=sorted(plants.PLANTS),
                     help="deliberately break isolation (negative control); repeatable")
    run.add_argument("--baseline", type=Path, help="known findings that do not fail the run")
    run.add_argument("--out", type=Path, help="evidence folder (default evidence/<timestamp>)")
    run.add_argument("--force", action="store_true", help="replace an existing evidence folder")
    run.add_argument("--hermes-python", type=Path, help="python of the Hermes install to audit")
    run.add_argument("--turns", type=int, default=1, help="turns per tenant")
    run.add_argument("--runs", type=int, default=1, help="run the audit N times (evidence in OUT/run-<i>) and report "
                     "per finding class how often it was seen (seen k/N; OUT/matrix.json, .md, .html)")
    run.add_argument("--timeout", type=float, default=180.0, help="seconds per Hermes turn")
    run.add_argument("--phases", help="comma-separated multi-profile phases (default: all but cron; 'cron' waits "
                     "for the tickers; 'all': every phase, cron included)")
    run.add_argument("--cron-wait", type=float, default=75.0, help="seconds after the backend starts within which "
                     "every cron job must fire (its ticker ticks at start and every 60 s)")
    run.add_argument("--tools", help="tool battery groups, comma-separated (default: all of "
                     f"{','.join(TOOL_GROUPS)}); 'none' keeps only the env probe")
    run.add_argument("--services", help="services besides each tenant's provider, comma-separated (default: all "
                     f"of {','.join(SERVICES)}); 'none' stubs the providers only")
    run.add_argument("--policy", default="hermes", help="the isolation policy: hermes (default: what Hermes shares "
                     "between profiles by design is allowed), strict (nothing shared) or a policy file "
                     "(docs/contracts.md)")
    run.add_argument("--stubs", default="observe", choices=MODES,
                     help="observe (default): a stub answers a foreign key too, so later leaks show; "
                     "strict: it answers 401")
    run.add_argument("--quiet", action="store_true", help="no progress on stderr")
    run.add_argument("--redact", action="store_true",
                     help="also write redacted/ (flows, ledger, reports, registry) with every secret as <tenant:kind>")
    run.add_argument("--stub-fault", default="", choices=sorted(FAULTS), help=argparse.SUPPRESS)  # fault tests
    run.add_argument("--json", action="store_true", help="print findings.json to stdout")

    rec = sub.add_parser("reconcile", parents=[fail_on],
                         help="re-verify saved evidence: an evidence folder, or a registry + flow file (+ logs)")
    rec.add_argument("evidence", type=Path, nargs="?",
                     help="an evidence folder of `run`: reproduces its verdict, findings and fingerprints")
    rec.add_argument("--baseline", type=Path,
                     help=f"known findings that do not fail (default for a folder: its {BASELINE_COPY}, if any)")
    rec.add_argument("--registry", type=Path, help="the registry (default: registry.yaml of the folder)")
    rec.add_argument("--flows", type=Path, help="the flow file (default: flows.mitm of the folder)")
    rec.add_argument("--scenario", help="without a folder: the scenario the flows belong to (for fingerprints)")
    rec.add_argument("--phase", help="without a folder: the phase the flows belong to (for fingerprints)")
    rec.add_argument("--logs", type=Path, nargs="*", default=[], help="logs/RPC streams (scanned for secrets)")
    rec.add_argument("--stubs", type=Path, help="stubs.jsonl: prove every upstream request passed the proxy")
    rec.add_argument("--no-homes", action="store_true", help="do not scan the tenant homes named in the registry")
    rec.add_argument("--policy", help="the isolation policy: hermes, strict or a policy file (default with a "
                     "folder: the one the run used)")
    rec.add_argument("--out", type=Path, help="write findings.json/report.md/junit.xml here")
    rec.add_argument("--json", action="store_true")
    _limit_options(rec)

    sc = sub.add_parser("scan", help="scan files/trees for canaries of the registry")
    sc.add_argument("--registry", type=Path, required=True)
    sc.add_argument("--owner", help="the tenant the paths belong to (default: secrets of every tenant)")
    sc.add_argument("--json", type=Path, dest="json_out", help="write the findings JSON here")
    _limit_options(sc)
    sc.add_argument("paths", type=Path, nargs="+")

    st = sub.add_parser("selftest", help="plant every kind of leak in real Hermes and prove each is caught")
    st.add_argument("--hermes-python", type=Path)
    st.add_argument("--out", type=Path)

    bl = sub.add_parser("baseline", help="run a scenario N times and write its findings as a baseline (or --upgrade "
                                         "an older baseline)")
    bl.add_argument("--scenario", default="oneshot", choices=sorted(scenarios.SCENARIOS))
    bl.add_argument("--runs", type=int, default=3, help="runs; findings missing from some run are intermittent "
                    "(each entry keeps its rate: seen, runs)")
    bl.add_argument("--phases", help="comma-separated multi-profile phases (as for run)")
    bl.add_argument("--hermes-python", type=Path)
    bl.add_argument("--evidence", type=Path, help="keep the runs' evidence folders here")
    bl.add_argument("--out", type=Path, help="the baseline file to write (default with --upgrade: in place)")
    bl.add_argument("--upgrade", type=Path, metavar="FILE",
                    help="convert a version-2 (exact) or version-1 (inexact) baseline to version 3 instead of running")

    mx = sub.add_parser("matrix", parents=[fail_on], help="run the audit against several Hermes releases and "
                        "tabulate each finding class per release")
    mx.add_argument("--hermes", required=True, metavar="VERSIONS",
                    help="releases, comma-separated (e.g. 0.16.0,0.19.0), each installed into a cached venv; "
                    "VERSION=PYTHON uses an existing install instead")
    mx.add_argument("--scenario", default="oneshot",
                    help="a scenario, a comma-separated list, or all (default oneshot)")
    mx.add_argument("--runs", type=int, default=1, help="runs per release and scenario (default 1)")
    mx.add_argument("--tools", help="tool battery groups, as for run ('none': the env probe only)")
    mx.add_argument("--phases", help="multi-profile phases, as for run (all: every phase, cron included)")
    mx.add_argument("--services", help="services besides the providers, as for run ('none': the providers only)")
    mx.add_argument("--shard", help="I/N: run only this share of the release x scenario x run cells")
    mx.add_argument("--timeout", type=float, default=180.0, help="seconds per Hermes turn")
    mx.add_argument("--out", type=Path, required=True, help="matrix folder: matrix.json/.md/.html, evidence per run")
    mx.add_argument("--force", action="store_true", help="run into a folder that already holds a matrix")
    mx.add_argument("--quiet", action="store_true", help="no progress on stderr")

    mg = sub.add_parser("merge", parents=[fail_on], help="combine the matrix.json of every shard into one matrix")
    mg.add_argument("shards", type=Path, nargs="+", help="shard folders (or their matrix.json)")
    mg.add_argument("--out", type=Path, required=True, help="where matrix.json/.md/.html are written")

    ex = sub.add_parser("export", help="redacted copies of saved flows: HAR 1.2 and/or a .mitm flow file")
    ex.add_argument("source", type=Path, help="an evidence folder (registry.yaml + flows.mitm) or a flow file")
    ex.add_argument("--registry", type=Path, help="the registry (default: registry.yaml in the evidence folder)")
    ex.add_argument("--har", type=Path, help="write a HAR 1.2 file here")
    ex.add_argument("--flows", type=Path, help="write a redacted flow file here (mitmweb -r, reconcile)")

    sub.add_parser("cleanup", help="reap processes a killed run left behind")
    return p


def _phases(text: str | None) -> list[str]:
    """`--phases a,b` as a list; `all` is every phase, cron included; none given: the default."""
    names = [p for p in (text or "").split(",") if p]
    return list(ALL_PHASES) if names == ["all"] else names


def _limit_options(p: argparse.ArgumentParser) -> None:
    d = stream.DEFAULT_LIMITS
    p.add_argument("--max-stream-bytes", type=int, default=d.stream_bytes, metavar="N",
                   help=f"decoded bytes read from one compressed stream (default {d.stream_bytes}); a stream "
                   "with more is listed as not inspected and the verdict is at best inconclusive")
    p.add_argument("--max-file-bytes", type=int, default=d.total_bytes, metavar="N",
                   help=f"decoded bytes read from all the compressed streams of one file (default {d.total_bytes})")
    p.add_argument("--max-depth", type=int, default=d.depth, metavar="N",
                   help=f"layers inside layers that are decoded (default {d.depth})")
    p.add_argument("--max-seconds", type=float, default=d.seconds, metavar="S",
                   help=f"seconds spent decoding the layers of one file (default {d.seconds:g}); the layers left "
                   "are listed as not inspected")


def _limits(a: argparse.Namespace) -> stream.Limits:
    if min(a.max_stream_bytes, a.max_file_bytes) < 1 or a.max_depth < 0 or a.max_seconds < 0:
        raise UsageError("--max-stream-bytes and --max-file-bytes must be positive, --max-depth and --max-seconds "
                         "not negative")
    return stream.Limits(stream_bytes=a.max_stream_bytes, total_bytes=a.max_file_bytes, depth=a.max_depth,
                         seconds=a.max_seconds)


def _print_not_inspected(entries: list[stream.NotInspected]) -> None:
    for n in entries:
        print(f"not inspected: {n.summary()}" + (" [read in part]" if n.partial else ""))


def _print_findings(findings: list[Finding]) -> None:
    """One line per finding class (fingerprint), the most severe first; findings.json has every occurrence."""
    for g in groups(findings):
        print(g.line())


def _print_result(result: AuditResult) -> None:
    """One line per new incident (findings.json and report.md have every class and occurrence), then what the
    baseline knows, why the run is not conclusive, and the verdict."""
    v = result.verdict
    new = [row for row in result.incidents if row.new]
    for row in new:
        print(row.line())
    if v.findings:
        print(f"{len(v.findings)} new finding(s) in {len(groups(v.findings))} class(es) under {len(new)} "
              "incident(s): every class and occurrence is in report.md and findings.json")
    if v.known:
        print(f"known: {len(v.known)} finding(s) in {len(groups(v.known))} class(es), "
              f"{len(result.incidents) - len(new)} incident(s) wholly listed in the baseline (reported, not failing)")
    for reason in v.reasons:
        print(f"inconclusive: {reason}")
    for n in result.not_inspected:
        print(f"not inspected: {n['path']}: {n['reason']} ({n['bytes_read']} bytes read)"
              + (" [read in part]" if n["partial"] else ""))
    for warning in result.warnings:
        print(f"warning: {warning}")
    control = "; negative control (planted: " + ", ".join(result.plants) + ")" if result.plants else ""
    print(f"verdict: {v.status} ({len(new)} new incident(s); {len(v.findings)} new in {len(groups(v.findings))} "
          f"class(es), {len(v.known)} known, {result.inspected.get('flows', 0)} flows{control})")
    if result.out is not None:
        print(f"evidence: {result.out}")
    if v.findings or v.known:
        print(f"what each finding means and how to fix it: {docs_url()}")


def _exit_code(verdict: Verdict, fail_on: str) -> int:
    """The verdict's exit code, unless --fail-on says that outcome does not fail (then 0; never a false 1)."""
    return _failing(verdict.exit_code, fail_on)


def _failing(code: int, fail_on: str) -> int:
    """`code` (0, 1 or 3), or 0 when --fail-on says that outcome does not fail."""
    if fail_on == "never" or (fail_on == "leak" and code == EXIT_INCONCLUSIVE):
        return EXIT_CLEAN
    return code


def _step_summary(out: Path | None) -> None:
    """On GitHub Actions, append report.md to the job's summary page."""
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if not summary or out is None or not (out / "report.md").exists():
        return
    text = (out / "report.md").read_text(encoding="utf-8")
    limit = 900_000  # GitHub takes at most 1 MiB per step
    if len(text) > limit:
        text = text[:limit] + f"\n\n(cut at {limit} characters: see report.md in the evidence)\n"
    with open(summary, "a", encoding="utf-8") as fh:
        fh.write(text + "\n")


def parse_tools(value: str | None) -> list[str] | None:
    """`--tools` (and `--services`): None (every one), `none` ([]) or a comma-separated list."""
    if value is None:
        return None
    return [] if value.strip() == "none" else [g for g in value.split(",") if g]


def run_options(a: argparse.Namespace) -> RunOptions:
    """`run`'s options from its arguments (`run_audit` checks them: `check_options`)."""
    if a.runs < 1:
        raise UsageError("--runs must be at least 1")
    return RunOptions(scenario=a.scenario, tenants=a.tenants or (2 if a.scenario == "oneshot" else 3),
                      topology=a.topology, plants=a.plant, baseline=a.baseline, out=a.out,
                      hermes_python=a.hermes_python, force=a.force, quiet=a.quiet, turns=a.turns, timeout=a.timeout,
                      phases=_phases(a.phases), cron_wait=a.cron_wait,
                      redact=a.redact, stub_fault=a.stub_fault, tools=parse_tools(a.tools), stubs=a.stubs,
                      services=parse_tools(a.services), policy=a.policy)


def matrix_options(a: argparse.Namespace) -> MatrixOptions:
    """`matrix`'s options from its arguments (UsageError for a malformed release, scenario or shard)."""
    return MatrixOptions(releases=parse_releases(a.hermes), scenarios=parse_scenarios(a.scenario), runs=a.runs,
                         out=a.out, tools=parse_tools(a.tools), phases=_phases(a.phases),
                         services=parse_tools(a.services),
                         shard=parse_shard(a.shard) if a.shard else None,
                         timeout=a.timeout, force=a.force, quiet=a.quiet)


def cmd_run(a: argparse.Namespace) -> int:
    opts = run_options(a)
    if a.runs > 1:
        doc, _ = repeat(opts, a.runs)
        return _print_matrix(doc, a.fail_on)
    result = run_audit(opts)
    if a.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        _print_result(result)
    _step_summary(result.out)
    return _exit_code(result.verdict, a.fail_on)


MATRIX_EXIT = {"clean": EXIT_CLEAN, "leak": EXIT_LEAK, "inconclusive": EXIT_INCONCLUSIVE}


def _print_matrix(doc: dict[str, Any], fail_on: str) -> int:
    """One line per incident (`seen k/N ...` per release; an n/a's reason, and every finding class, are in
    matrix.md), the verdict; returns the exit code."""
    releases = doc["plan"]["releases"]

    def text(cell: dict[str, Any]) -> str:
        return NA if cell["state"] == NA else cell_text(cell)

    for row in doc["incidents"]:
        where = f"{row['scenario']}/{row['phase']}" if row["scenario"] else "-"
        cells = "; ".join(f"{r}: {text(row['cells'][r])}" if len(releases) > 1 else text(row["cells"][r])
                          for r in releases)
        print(f"{row['severity']:<8} {','.join(row['documented']) or 'new':<7} {row['audit']} {row['entry']}: "
              f"{row['kinds'][0]} {row['victim'] or '-'} -> {row['seen_in'] or '-'} at {where}: {cells} [{row['id']}]")
    print(f"verdict: {doc['status']} ({len(doc['incidents'])} incident(s), {len(doc['rows'])} class(es) over "
          f"{len(doc['cells'])} run(s); every class is in matrix.md)")
    return _failing(MATRIX_EXIT[doc["status"]], fail_on)


def cmd_matrix(a: argparse.Namespace) -> int:
    opts = matrix_options(a)
    doc = run_matrix(opts)
    code = _print_matrix(doc, a.fail_on)
    print(f"matrix: {opts.out / 'matrix.md'}")
    return code


def cmd_merge(a: argparse.Namespace) -> int:
    doc = merge_dirs(a.shards, a.out)
    code = _print_matrix(doc, a.fail_on)
    print(f"matrix: {a.out / 'matrix.md'}")
    return code


def cmd_reconcile(a: argparse.Namespace) -> int:
    started = time.monotonic()
    if a.evidence is not None:
        result = _reconcile_folder(a, started)
    else:
        if a.registry is None or a.flows is None:
            raise UsageError("reconcile: pass an evidence folder, or --registry and --flows")
        result = _reconcile_files(a, started)
    if a.out:
        _prepare_reconcile_out(a.out, a.evidence)
        result.out = a.out
        write_reports(a.out, result)
        _step_summary(a.out)
    if a.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        _print_result(result)
    return _exit_code(result.verdict, a.fail_on)


def _prepare_reconcile_out(out: Path, evidence: Path | None) -> None:
    if evidence is not None and out.resolve() == evidence.resolve():
        raise UsageError(f"reconcile: --out {out} is the evidence folder itself; pass another folder")
    if out.exists() and not out.is_dir():
        raise UsageError(f"reconcile: --out {out} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"reconcile: cannot create --out {out}: {exc.strerror or exc}") from None


def _reconcile_folder(a: argparse.Namespace, started: float) -> AuditResult:
    """The whole evidence folder, as `run` judged it: the same verdict, findings and fingerprints."""
    out = a.evidence
    if not out.is_dir():
        raise UsageError(f"reconcile: {out} is not a directory (pass an evidence folder, or --registry and --flows)")
    if a.registry is not None and a.registry.resolve() != (out / "registry.yaml").resolve():
        raise UsageError("reconcile: with an evidence folder, the registry is its registry.yaml")
    if a.scenario or a.phase:
        raise UsageError("reconcile: an evidence folder names its own scenario and phases (timeline.json)")
    if a.logs or a.stubs or a.no_homes:
        raise UsageError("reconcile: an evidence folder is judged whole (its logs/, stubs.jsonl and homes); "
                         "--logs, --stubs and --no-homes are for loose files")
    record = read_record(out)
    path = a.baseline or (out / BASELINE_COPY if (out / BASELINE_COPY).exists() else None)
    base = baseline.load(path) if path else None
    if path is not None and a.baseline is None:
        print(f"tenancy-audit: judged against the run's baseline {path} (pass --baseline to use another)",
              file=sys.stderr)
    policy = policies.load(a.policy) if a.policy else None  # None: the run's own (`policy.yaml` of the folder)
    return evaluate(out, record, base, seconds=time.monotonic() - started, flows=a.flows, limits=_limits(a),
                    policy=policy)


def _reconcile_files(a: argparse.Namespace, started: float) -> AuditResult:
    """A registry and a flow file (plus logs, stubs, homes): findings labelled with --scenario/--phase."""
    registry = load(a.registry)
    homes = {} if a.no_homes else {t.name: Path(t.home) for t in registry if t.home}
    rec = reconcile(registry, a.flows, homes=homes, logs=[LogSource(p, None) for p in a.logs], stub_log=a.stubs,
                    limits=_limits(a))
    found = [f.labelled(a.scenario, a.phase) for f in rec.findings]
    findings, known, fixed, warnings = found, [], [], []
    if a.baseline:
        base = baseline.load(a.baseline)
        findings, known, fixed = baseline.split(found, base)
        warnings += [base.warning] if base.warning else []
    return AuditResult(Verdict(findings, known, rec.reasons), registry.names(), a.scenario or "reconcile",
                       {"mitmproxy": mitmproxy.version.VERSION, "tenancy-audit": harness.__version__},
                       inspected={**rec.inspected, "flows": rec.flows}, fixed=fixed,
                       seconds=time.monotonic() - started,
                       snapshots={t: len(snaps) for t, snaps in rec.snapshots.items()}, warnings=warnings,
                       not_inspected=[n.to_dict() for n in rec.not_inspected])


def cmd_scan(a: argparse.Namespace) -> int:
    registry = load(a.registry)
    if a.owner is not None and a.owner not in registry.tenants:
        raise UsageError(f"--owner {a.owner!r} is not a tenant of {a.registry}")
    for p in a.paths:
        if not p.exists():
            raise UsageError(f"{p} does not exist")
    result = scan.scan_paths(a.paths, registry, a.owner, limits=_limits(a))
    reasons = [f"unreadable: {p}" for p in result.unreadable]
    reasons += [r for r in result.reasons() if ": unreadable" not in r]
    verdict = Verdict(result.findings, reasons=reasons)
    _print_findings(result.findings)
    for p in result.unreadable:
        print(f"unreadable: {p}")
    _print_not_inspected([n for n in result.not_inspected if not n.reason.startswith("unreadable")])
    if a.json_out:
        write_private(a.json_out, json.dumps({
            "verdict": verdict.status, "reasons": verdict.reasons,
            "not_inspected": [n.to_dict() for n in result.not_inspected],
            "findings": [f.to_dict() for f in result.findings]}, indent=2).encode())
    return verdict.exit_code


def cmd_selftest(a: argparse.Namespace) -> int:
    failures = 0
    for name, (_, expected) in plants.PLANTS.items():
        out = (a.out / name) if a.out else None
        topology = plants.TOPOLOGY.get(name, "reverse")
        scenario = plants.SCENARIO.get(name, "oneshot")
        result = run_audit(RunOptions(plants=[name], out=out, hermes_python=a.hermes_python, quiet=True,
                                      topology=topology, scenario=scenario, tenants=2,
                                      phases=["turns"] if scenario != "oneshot" else [],
                                      tools=plants.battery_for(name), services=plants.services_for(name)))
        code = result.verdict.exit_code
        kinds = {f.kind for f in result.verdict.findings}
        missed = [r for r in result.verdict.reasons if r.startswith(f"plant {name} ")]
        # a plant that only defeats the proof (a bypass) must end inconclusive; every other one in a leak
        want = EXIT_INCONCLUSIVE if expected <= INCONCLUSIVE_KINDS else EXIT_LEAK
        ok = code == want and expected <= kinds and not missed
        failures += not ok
        verdict = "caught" if ok else "MISSED"
        print(f"{verdict}  {name:<8} exit {code}  expected {sorted(expected)}  got {sorted(kinds)}")
    print(f"selftest: {len(plants.PLANTS) - failures} of {len(plants.PLANTS)} plants caught")
    return 0 if failures == 0 else 1


def cmd_baseline(a: argparse.Namespace) -> int:
    if a.upgrade is not None:
        dest = a.out or a.upgrade
        old = baseline.load(a.upgrade).version
        done = baseline.upgrade(a.upgrade, dest)
        print(f"wrote {dest}: {done.written} entries (version {baseline.VERSION}, from version {old})"
              + (f", {done.dropped} dropped (no direction named, or malformed)" if done.dropped else ""))
        regenerate = ("regenerate the baseline (tenancy-audit baseline --scenario S --runs N --out FILE) for an "
                      "exact one")
        if old == 1:
            print(f"tenancy-audit: an entry upgraded from version 1 keeps only its example's direction; {regenerate}",
                  file=sys.stderr)
        if done.untooled:
            print(f"tenancy-audit: {done.untooled} entries name no tool or service (written before baselines kept "
                  f"them) and are taken to have none, so a class that had one is new now; {regenerate}",
                  file=sys.stderr)
        return 0
    if a.out is None:
        raise UsageError("baseline: pass --out FILE (or --upgrade FILE)")
    try:  # before minutes of runs: the baseline can be written there
        with tempfile.TemporaryFile(dir=a.out.parent):
            pass
    except OSError as exc:
        raise UsageError(f"baseline: cannot write --out {a.out} ({exc.strerror or exc})") from None
    runs = []
    with tempfile.TemporaryDirectory(prefix="tenancy-baseline-") as tmp:
        root = a.evidence or Path(tmp)
        version = "?"
        for i in range(a.runs):
            opts = RunOptions(scenario=a.scenario, tenants=2 if a.scenario == "oneshot" else 3,
                              hermes_python=a.hermes_python, out=root / f"run-{i}", force=True, quiet=True,
                              phases=_phases(a.phases))
            result = run_audit(opts)
            version = result.versions.get("hermes-agent", "?")
            runs.append(result.verdict.findings)
            print(f"run {i + 1}/{a.runs}: {result.verdict.status} (exit {result.verdict.exit_code}), "
                  f"{len(runs[-1])} findings", file=sys.stderr)
    entries = baseline.write(a.out, runs, note=f"hermes-agent {version}, scenario {a.scenario}, {a.runs} runs")
    for e in entries:
        k, n = e["seen"], e["runs"]
        rate = cell_text({"state": "seen", "seen": k, "runs": n, "interval": list(wilson(k, n)) if n > 1 else None})
        print(f"{rate}: {e['kind']}: {e['victim'] or '-'} -> {e['seen_in'] or '-'} {e['canary'] or '-'} "
              f"({e['channel']}) {e['scenario']}/{e['phase']} [{e['fingerprint']}]")
    print(f"wrote {a.out}: {len(entries)} entries")
    return 0


def cmd_export(a: argparse.Namespace) -> int:
    if not (a.har or a.flows):
        raise UsageError("export: pass --har FILE and/or --flows FILE")
    flows_path = a.source / "flows.mitm" if a.source.is_dir() else a.source
    registry_path = a.registry or (a.source / "registry.yaml" if a.source.is_dir() else None)
    if registry_path is None:
        raise UsageError("export: a flow file needs --registry")
    if not flows_path.is_file():
        raise UsageError(f"export: {flows_path} does not exist")
    matcher = matcher_for(load(registry_path))
    flows, truncated = read_flows(flows_path)
    if truncated:
        print(f"tenancy-audit: {truncated}", file=sys.stderr)
    if a.har:
        print(f"wrote {a.har}: {export.write_har(a.har, flows, matcher)} entries")
    if a.flows:
        print(f"wrote {a.flows}: {export.write_flows(a.flows, flows, matcher)} flows")
    return 0


def cmd_cleanup(_: argparse.Namespace) -> int:
    print(f"reaped {reap_stale()} process(es)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Exit 0 clean, 1 leak (and nothing else), 2 error (one line on stderr), 3 inconclusive."""
    args = _parser().parse_args(argv)
    handler = {"run": cmd_run, "reconcile": cmd_reconcile, "scan": cmd_scan, "selftest": cmd_selftest,
               "baseline": cmd_baseline, "matrix": cmd_matrix, "merge": cmd_merge, "export": cmd_export,
               "cleanup": cmd_cleanup}[args.command]
    try:
        return handler(args)
    except ERRORS as exc:
        print(f"tenancy-audit: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except ProxyError as exc:  # nothing could be recorded: inconclusive, and never clean
        print(f"tenancy-audit: inconclusive: {exc}", file=sys.stderr)
        return EXIT_INCONCLUSIVE
    except (KeyboardInterrupt, Interrupted) as exc:
        print(f"tenancy-audit: interrupted ({exc or 'SIGINT'}); every child was reaped", file=sys.stderr)
        return EXIT_INCONCLUSIVE
    except OSError as exc:  # a file or folder that cannot be read or written: never a traceback, never "leak"
        where = f" {exc.filename}" if exc.filename else ""
        print(f"tenancy-audit: error:{where}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # a bug: one line and exit 2 (an uncaught exception would exit 1, "leak")
        if os.environ.get("TENANCY_DEBUG"):
            traceback.print_exc()
        print(f"tenancy-audit: internal error: {type(exc).__name__}: {exc} (TENANCY_DEBUG=1 shows the traceback)"
              .replace("\n", " "), file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())

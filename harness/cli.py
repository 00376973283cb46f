"""`tenancy-audit`: run, reconcile, scan, selftest, export, cleanup. Exit 0 clean, 1 leak, 2 error, 3 inconclusive."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import mitmproxy.version

from harness.capture.proxy import ProxyError
from harness.capture.stubs import FAULTS
from harness.core.files import write_private
from harness.core.findings import EXIT_ERROR, EXIT_INCONCLUSIVE, EXIT_LEAK, INCONCLUSIVE_KINDS, Finding, Verdict
from harness.core.procs import reap_stale
from harness.core.registry import RegistryError, load
from harness.detect import scan
from harness.detect.matcher import matcher_for
from harness.detect.reconcile import EvidenceError, LogSource, read_flows, reconcile
from harness.drive import plants, scenarios
from harness.drive.hermes import HermesError
from harness.report import baseline, export
from harness.report.baseline import BaselineError
from harness.report.result import AuditResult
from harness.report.writer import write_reports
from harness.run import Interrupted, RunOptions, UsageError, run_audit

ERRORS = (RegistryError, EvidenceError, HermesError, UsageError, BaselineError)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tenancy-audit", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="drive Hermes through the proxy and write an evidence folder")
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
    run.add_argument("--timeout", type=float, default=180.0, help="seconds per Hermes turn")
    run.add_argument("--phases", help="comma-separated multi-profile phases (default: all but cron; 'cron' waits "
                     "for the tickers)")
    run.add_argument("--cron-wait", type=float, default=75.0, help="seconds to wait for cron jobs to fire")
    run.add_argument("--quiet", action="store_true", help="no progress on stderr")
    run.add_argument("--redact", action="store_true",
                     help="also write redacted/ (flows, ledger, reports, registry) with every secret as <tenant:kind>")
    run.add_argument("--stub-fault", default="", choices=sorted(FAULTS), help=argparse.SUPPRESS)  # fault tests
    run.add_argument("--json", action="store_true", help="print findings.json to stdout")

    rec = sub.add_parser("reconcile", help="re-verify saved evidence (registry + flow file + homes + logs)")
    rec.add_argument("--registry", type=Path, required=True)
    rec.add_argument("--flows", type=Path, required=True)
    rec.add_argument("--logs", type=Path, nargs="*", default=[], help="logs/RPC streams (scanned for secrets)")
    rec.add_argument("--stubs", type=Path, help="stubs.jsonl: prove every upstream request passed the proxy")
    rec.add_argument("--no-homes", action="store_true", help="do not scan the tenant homes named in the registry")
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

    bl = sub.add_parser("baseline", help="run a scenario N times and write its findings as a baseline")
    bl.add_argument("--scenario", default="oneshot", choices=sorted(scenarios.SCENARIOS))
    bl.add_argument("--runs", type=int, default=3, help="runs; findings missing from some run are intermittent")
    bl.add_argument("--phases", help="comma-separated multi-profile phases (as for run)")
    bl.add_argument("--hermes-python", type=Path)
    bl.add_argument("--evidence", type=Path, help="keep the runs' evidence folders here")
    bl.add_argument("--out", type=Path, required=True, help="the baseline file to write")

    ex = sub.add_parser("export", help="redacted copies of saved flows: HAR 1.2 and/or a .mitm flow file")
    ex.add_argument("source", type=Path, help="an evidence folder (registry.yaml + flows.mitm) or a flow file")
    ex.add_argument("--registry", type=Path, help="the registry (default: registry.yaml in the evidence folder)")
    ex.add_argument("--har", type=Path, help="write a HAR 1.2 file here")
    ex.add_argument("--flows", type=Path, help="write a redacted flow file here (mitmweb -r, reconcile)")

    sub.add_parser("cleanup", help="reap processes a killed run left behind")
    return p


def _limit_options(p: argparse.ArgumentParser) -> None:
    d = scan.DEFAULT_LIMITS
    p.add_argument("--max-stream-bytes", type=int, default=d.stream_bytes, metavar="N",
                   help=f"decoded bytes read from one compressed stream (default {d.stream_bytes}); a stream "
                   "with more is listed as not inspected and the verdict is at best inconclusive")
    p.add_argument("--max-file-bytes", type=int, default=d.total_bytes, metavar="N",
                   help=f"decoded bytes read from all the compressed streams of one file (default {d.total_bytes})")
    p.add_argument("--max-depth", type=int, default=d.depth, metavar="N",
                   help=f"containers inside containers that are decoded (default {d.depth})")


def _limits(a: argparse.Namespace) -> scan.Limits:
    if min(a.max_stream_bytes, a.max_file_bytes) < 1 or a.max_depth < 0:
        raise UsageError("--max-stream-bytes and --max-file-bytes must be positive, --max-depth not negative")
    return scan.Limits(stream_bytes=a.max_stream_bytes, total_bytes=a.max_file_bytes, depth=a.max_depth)


def _print_not_inspected(entries: list[scan.NotInspected]) -> None:
    for n in entries:
        print(f"not inspected: {n.summary()}" + (" [read in part]" if n.partial else ""))


def _print_findings(findings: list[Finding]) -> None:
    for f in findings:
        print(f.summary())


def cmd_run(a: argparse.Namespace) -> int:
    opts = RunOptions(scenario=a.scenario, tenants=a.tenants or (2 if a.scenario == "oneshot" else 3),
                      topology=a.topology, plants=a.plant, baseline=a.baseline, out=a.out,
                      hermes_python=a.hermes_python, force=a.force, quiet=a.quiet, turns=a.turns, timeout=a.timeout,
                      phases=[p for p in (a.phases or "").split(",") if p], cron_wait=a.cron_wait,
                      redact=a.redact, stub_fault=a.stub_fault)
    result = run_audit(opts)
    v = result.verdict
    if a.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        _print_findings(v.findings)
        for reason in v.reasons:
            print(f"inconclusive: {reason}")
        print(f"verdict: {v.status} ({len(v.findings)} new, {len(v.known)} known, "
              f"{result.inspected.get('flows', 0)} flows)")
        print(f"evidence: {result.out}")
    return v.exit_code


def cmd_reconcile(a: argparse.Namespace) -> int:
    registry = load(a.registry)
    homes = {} if a.no_homes else {t.name: Path(t.home) for t in registry if t.home}
    rec = reconcile(registry, a.flows, homes=homes, logs=[LogSource(p, None) for p in a.logs], stub_log=a.stubs,
                    limits=_limits(a))
    verdict = Verdict(rec.findings, reasons=rec.reasons)
    skipped = [n.to_dict() for n in rec.not_inspected]
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        write_reports(a.out, AuditResult(verdict, registry.names(), "reconcile",
                                         {"mitmproxy": mitmproxy.version.VERSION},
                                         inspected={**rec.inspected, "flows": rec.flows}, not_inspected=skipped))
    if a.json:
        print(json.dumps({"verdict": verdict.status, "reasons": rec.reasons, "not_inspected": skipped,
                          "findings": [f.to_dict() for f in rec.findings]}, indent=2))
    else:
        _print_findings(rec.findings)
        _print_not_inspected(rec.not_inspected)
        for reason in rec.reasons:
            print(f"inconclusive: {reason}")
        print(f"verdict: {verdict.status} ({len(rec.findings)} findings, {rec.flows} flows)")
    return verdict.exit_code


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
        result = run_audit(RunOptions(plants=[name], out=out, hermes_python=a.hermes_python, quiet=True,
                                      topology=topology))
        code = result.verdict.exit_code
        kinds = {f.kind for f in result.verdict.findings}
        # a plant that only defeats the proof (a bypass) must end inconclusive; every other one in a leak
        want = EXIT_INCONCLUSIVE if expected <= INCONCLUSIVE_KINDS else EXIT_LEAK
        ok = code == want and expected <= kinds
        failures += not ok
        verdict = "caught" if ok else "MISSED"
        print(f"{verdict}  {name:<8} exit {code}  expected {sorted(expected)}  got {sorted(kinds)}")
    print(f"selftest: {len(plants.PLANTS) - failures} of {len(plants.PLANTS)} plants caught")
    return 0 if failures == 0 else 1


def cmd_baseline(a: argparse.Namespace) -> int:
    runs = []
    with tempfile.TemporaryDirectory(prefix="tenancy-baseline-") as tmp:
        root = a.evidence or Path(tmp)
        version = "?"
        for i in range(a.runs):
            opts = RunOptions(scenario=a.scenario, tenants=2 if a.scenario == "oneshot" else 3,
                              hermes_python=a.hermes_python, out=root / f"run-{i}", force=True, quiet=True,
                              phases=[p for p in (a.phases or "").split(",") if p])
            result = run_audit(opts)
            version = result.versions.get("hermes-agent", "?")
            runs.append(result.verdict.findings)
            print(f"run {i + 1}/{a.runs}: {result.verdict.status} (exit {result.verdict.exit_code}), "
                  f"{len(runs[-1])} findings", file=sys.stderr)
    n = baseline.write(a.out, runs, note=f"hermes-agent {version}, scenario {a.scenario}, {a.runs} runs")
    print(f"wrote {a.out}: {n} entries")
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
    args = _parser().parse_args(argv)
    handler = {"run": cmd_run, "reconcile": cmd_reconcile, "scan": cmd_scan, "selftest": cmd_selftest,
               "baseline": cmd_baseline, "export": cmd_export, "cleanup": cmd_cleanup}[args.command]
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


if __name__ == "__main__":
    sys.exit(main())

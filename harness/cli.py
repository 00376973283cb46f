"""The entry point of `tenancy-audit` (its commands and exit codes: `arguments.DESCRIPTION`).

Each command parses its arguments, calls one use case (`run.run_audit`, `matrix`, `usecases`) and prints what it
returns; `main` maps the errors to exit codes."""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from harness import arguments, usecases
from harness.capture.proxy import ProxyError
from harness.capture.stubs.base import ServiceError
from harness.core.digests import ManifestError
from harness.core.findings import EXIT_CLEAN, EXIT_ERROR, EXIT_INCONCLUSIVE, EXIT_LEAK, Verdict
from harness.core.procs import reap_stale
from harness.core.record import EvidenceError
from harness.core.registry import RegistryError
from harness.drive import plants
from harness.drive.hermes.agent import HermesError
from harness.matrix import merge_dirs, repeat, run_matrix
from harness.options import UsageError, check_options
from harness.proof import command as scorecard
from harness.report import console
from harness.report.baseline import BaselineError
from harness.report.matrix import MatrixError
from harness.report.policy import PolicyError
from harness.run import run_audit
from harness.session import Interrupted

ERRORS = (RegistryError, EvidenceError, HermesError, UsageError, BaselineError, MatrixError, ServiceError,
          PolicyError, ManifestError)
MATRIX_EXIT = {"clean": EXIT_CLEAN, "leak": EXIT_LEAK, "inconclusive": EXIT_INCONCLUSIVE}


def _exit_code(verdict: Verdict, fail_on: str) -> int:
    """The verdict's exit code, unless --fail-on says that outcome does not fail (then 0; never a false 1)."""
    return _failing(verdict.exit_code, fail_on)


def _failing(code: int, fail_on: str) -> int:
    """`code` (0, 1 or 3), or 0 when --fail-on says that outcome does not fail."""
    if fail_on == "never" or (fail_on == "leak" and code == EXIT_INCONCLUSIVE):
        return EXIT_CLEAN
    return code


def _say(msg: str) -> None:
    print(msg, file=sys.stderr)


def _show(lines: list[str]) -> None:
    for line in lines:
        print(line)


def _print_matrix(doc: dict[str, Any], fail_on: str, out: Path) -> int:
    _show([*console.matrix_lines(doc), f"matrix: {out / 'matrix.md'}"])
    return _failing(MATRIX_EXIT[doc["status"]], fail_on)


def cmd_run(a: argparse.Namespace) -> int:
    opts = arguments.run_options(a)
    if a.runs > 1:
        doc, _ = repeat(run_audit, opts, a.runs)
        _show(console.matrix_lines(doc))
        return _failing(MATRIX_EXIT[doc["status"]], a.fail_on)
    result = run_audit(opts)
    _show([json.dumps(result.to_dict(), indent=2)] if a.json else console.result_lines(result))
    usecases.step_summary(result.out)
    return _exit_code(result.verdict, a.fail_on)


def cmd_matrix(a: argparse.Namespace) -> int:
    opts = arguments.matrix_options(a)
    return _print_matrix(run_matrix(run_audit, opts), a.fail_on, opts.out)


def cmd_merge(a: argparse.Namespace) -> int:
    return _print_matrix(merge_dirs(a.shards, a.out), a.fail_on, a.out)


def cmd_reconcile(a: argparse.Namespace) -> int:
    result = usecases.reconcile_saved(usecases.ReconcileOptions(
        evidence=a.evidence, baseline=a.baseline, registry=a.registry, flows=a.flows, scenario=a.scenario,
        phase=a.phase, logs=a.logs, stubs=a.stubs, no_homes=a.no_homes, policy=a.policy, out=a.out,
        limits=arguments.limits(a), sign_key=a.sign_key), _say)
    _show([json.dumps(result.to_dict(), indent=2)] if a.json else console.result_lines(result))
    return _exit_code(result.verdict, a.fail_on)


def cmd_verify(a: argparse.Namespace) -> int:
    """Exit 1 when a file, the signature or the reconciled verdict, incidents or fingerprints differ."""
    done = usecases.verify(a.evidence, a.key)
    _show(console.verify_lines(str(a.evidence), done))
    return EXIT_LEAK if done.problems else EXIT_CLEAN


def cmd_scan(a: argparse.Namespace) -> int:
    result = usecases.scan_command(a.registry, a.paths, a.owner, arguments.limits(a), a.json_out)
    _show(console.finding_lines(result.findings) + [f"unreadable: {p}" for p in result.unreadable])
    _show(console.not_inspected_lines([n for n in result.not_inspected if not n.reason.startswith("unreadable")]))
    return usecases.scan_verdict(result).exit_code


def cmd_selftest(a: argparse.Namespace) -> int:
    failures = 0
    for p in usecases.selftest(a.hermes_python, a.out):
        failures += not p.ok
        print(f"{'caught' if p.ok else 'MISSED'}  {p.name:<8} exit {p.code}  expected {sorted(p.expected)}  "
              f"got {sorted(p.kinds)}")
    print(f"selftest: {len(plants.PLANTS) - failures} of {len(plants.PLANTS)} plants caught")
    return 0 if failures == 0 else 1


def cmd_scorecard(a: argparse.Namespace) -> int:
    return scorecard.main(a, print, _say)


def cmd_baseline(a: argparse.Namespace) -> int:
    if a.upgrade is not None:
        print(usecases.upgrade_baseline(a.upgrade, a.out or a.upgrade, _say))
        return 0
    if a.out is None:
        raise UsageError("baseline: pass --out FILE (or --upgrade FILE)")
    if a.sources:
        incidents = usecases.baseline_from(a.sources, a.out, _say)
    else:
        incidents = usecases.make_baseline(a.scenario, a.runs, arguments.phases(a.phases), a.hermes_python,
                                           a.evidence, a.out, _say)
    _show([*console.baseline_lines(incidents), f"wrote {a.out}: {len(incidents)} incident(s)"])
    return 0


def cmd_export(a: argparse.Namespace) -> int:
    usecases.export_flows(a.source, a.registry, a.har, a.flows, _say, print)
    return 0


def cmd_patch_check(a: argparse.Namespace) -> int:
    """Exit 1 when the patched install shows a crossing the unpatched one did not (the patch made a leak); with
    --series, the twin audit's verdict as `run` gives it (--fail-on)."""
    mode = arguments.patch_check_mode(a)
    opts = arguments.patch_check_options(a)
    check_options(opts)
    if mode == "series":
        opts = usecases.on_twin(a.series, opts, _say)
        if a.runs > 1:
            doc, _ = repeat(run_audit, opts, a.runs)
            _show(console.matrix_lines(doc))
            return _failing(MATRIX_EXIT[doc["status"]], a.fail_on)
        result = run_audit(opts)
        _show(console.result_lines(result))
        return _exit_code(result.verdict, a.fail_on)
    doc = usecases.patch_check(a.patch, opts, _say, on=a.on)
    _show(console.patch_check_lines(doc))
    return EXIT_LEAK if doc["new"] else EXIT_CLEAN


def cmd_mutants(a: argparse.Namespace) -> int:
    """Exit 1 when a mutant whose code ran and computed another value was not caught (with --series: on the
    twin, which is then the control too)."""
    opts = arguments.patch_check_options(a)
    check_options(opts)
    doc = usecases.mutant_run(opts, [n for n in (a.only or "").split(",") if n], _say, series=a.series)
    _show(console.mutant_lines(doc))
    return EXIT_LEAK if any(row["state"] == "missed" for row in doc["mutants"]) else EXIT_CLEAN


def cmd_cleanup(_: argparse.Namespace) -> int:
    print(f"reaped {reap_stale()} process(es)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Exit 0 clean, 1 leak (and nothing else), 2 error (one line on stderr), 3 inconclusive."""
    args = arguments.parser(usecases.version_text).parse_args(argv)
    handler = {"run": cmd_run, "reconcile": cmd_reconcile, "scan": cmd_scan, "selftest": cmd_selftest,
               "scorecard": cmd_scorecard, "baseline": cmd_baseline, "matrix": cmd_matrix, "merge": cmd_merge,
               "export": cmd_export, "patch-check": cmd_patch_check, "mutants": cmd_mutants,
               "cleanup": cmd_cleanup, "verify": cmd_verify}[args.command]
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

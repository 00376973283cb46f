"""The command line's arguments: the parser of `tenancy-audit` and the options each command's arguments make
(`RunOptions`, `MatrixOptions`, `Limits`). Malformed values are a `UsageError` (one line, exit 2)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.capture.stubs.base import MODES
from harness.capture.stubs.provider import FAULTS
from harness.core.files import BASELINE_COPY
from harness.detect.engine import stream
from harness.drive import plants
from harness.drive.doors import SCENARIOS, default_tenants
from harness.drive.phases import ALL_PHASES
from harness.drive.services import DEFAULT_SERVICES, PLATFORMS, PROVIDER_SERVICE, SERVICES, TOOL_GROUPS, UNSETTABLE
from harness.options import MatrixOptions, RunOptions, UsageError, parse_releases, parse_scenarios, parse_shard
from harness.proof import command as scorecard

FAIL_ON = ("leak", "inconclusive", "never")
PLATFORMS_HELP = (f"messaging platforms of the gateway (--scenario gateway or all), a bot per tenant on each, "
                  f"comma-separated, or all: {','.join(PLATFORMS)} (docs/platforms.md); added to --services")
DESCRIPTION = ("`tenancy-audit`: run, reconcile, verify, scan, selftest, scorecard, baseline, matrix, merge, export, "
               "patch-check, mutants, cleanup.\nExit 0 clean, 1 leak (verify: the evidence does not verify), 2 error, "
               "3 inconclusive.")


def _version_action(text: Callable[[], str]) -> type[argparse.Action]:
    """`--version`: prints `text()` (this tool, mitmproxy, and the Hermes a `run` would audit), then exits."""

    class Version(argparse.Action):
        def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
            super().__init__(option_strings, dest, nargs=0, help="print the versions of tenancy-audit, mitmproxy "
                             "and the Hermes a run would audit, then exit")

        def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
            print(text())
            parser.exit()

    return Version


def parser(version_text: Callable[[], str] = lambda: "tenancy-audit") -> argparse.ArgumentParser:
    """The parser; `version_text` is what `--version` prints (the command line's `usecases.version_text`)."""
    p = argparse.ArgumentParser(prog="tenancy-audit", description=DESCRIPTION)
    p.add_argument("--version", action=_version_action(version_text))
    sub = p.add_subparsers(dest="command", required=True)
    fail_on = argparse.ArgumentParser(add_help=False)
    fail_on.add_argument("--fail-on", choices=FAIL_ON, default="inconclusive",
                         help="what fails the command: a leak only (inconclusive exits 0), a leak or an inconclusive "
                              "run (the default: exit 1 or 3), or never (exit 0; errors still exit 2)")

    run = sub.add_parser("run", parents=[fail_on], help="drive Hermes through the proxy and write an evidence folder")
    run.add_argument("--scenario", default="oneshot", choices=sorted(SCENARIOS))
    run.add_argument("--tenants", type=int, default=None, help="number of tenants (default 2; 3 for backends)")
    run.add_argument("--topology", default="reverse", choices=["reverse", "forward"])
    run.add_argument("--plant", action="append", default=[], choices=sorted(plants.PLANTS),
                     help="deliberately break isolation (negative control); repeatable")
    run.add_argument("--baseline", type=Path, help="known findings that do not fail the run")
    run.add_argument("--out", type=Path, help="evidence folder (default evidence/<timestamp> of the "
                     "checkout; installed: $XDG_DATA_HOME/tenancy-audit/evidence/<timestamp>)")
    run.add_argument("--force", action="store_true", help="replace an existing evidence folder")
    run.add_argument("--hermes-python", type=Path, help="python of the Hermes install to audit")
    run.add_argument("--turns", type=int, default=1, help="turns per tenant")
    run.add_argument("--runs", type=int, default=1, help="run the audit N times (evidence in OUT/run-<i>) and report "
                     "per finding class how often it was seen (seen k/N; OUT/matrix.json, .md, .html)")
    run.add_argument("--timeout", type=float, default=180.0, help="seconds per Hermes turn")
    run.add_argument("--phases", help="comma-separated multi-profile phases (default: all but cron; 'cron' waits "
                     "for the tickers; 'all': every phase, cron included; 'approvals' (tui, serve), 'redaction' "
                     "(serve, gateway), 'kanban' (tui, serve) and 'webhooks' (gateway) only when named, as in "
                     "'all,approvals')")
    run.add_argument("--cron-wait", type=float, default=75.0, help="seconds after the backend starts within which "
                     "every cron job must fire (its ticker ticks at start and every 60 s)")
    run.add_argument("--tools", help="tool battery groups, comma-separated (default: all of "
                     f"{','.join(TOOL_GROUPS)}); 'none' keeps only the env probe")
    run.add_argument("--services", help="services besides each tenant's provider, comma-separated (default: "
                     f"{','.join(DEFAULT_SERVICES)}; also {','.join(s for s in SERVICES if s not in DEFAULT_SERVICES)}"
                     ", one memory provider per run); 'none' stubs the providers only")
    run.add_argument("--platforms", help=PLATFORMS_HELP)
    run.add_argument("--unset", help="settings the run's second tenant leaves unset while the launch profile sets "
                     "them, comma-separated SERVICE.NAME (tenants that differ: docs/platforms.md); launch:SERVICE.NAME "
                     "for one the launch profile leaves unset while the others set it; 'all': every one of the run's "
                     "services")
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
    sign_option(run)

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
    sign_option(rec)
    limit_options(rec)

    ver = sub.add_parser("verify", help="check an evidence folder against its manifest (every file, the signature) "
                         "and reconcile it again to the recorded verdict, incidents and fingerprints")
    ver.add_argument("evidence", type=Path, help="an evidence folder (or the --out folder of reconcile)")
    ver.add_argument("--key", type=Path, metavar="PUB", help="the ed25519 public key (PEM) the manifest must be "
                     "signed with")

    sc = sub.add_parser("scan", help="scan files/trees for canaries of the registry")
    sc.add_argument("--registry", type=Path, required=True)
    sc.add_argument("--owner", help="the tenant the paths belong to (default: secrets of every tenant)")
    sc.add_argument("--json", type=Path, dest="json_out", help="write the findings JSON here")
    limit_options(sc)
    sc.add_argument("paths", type=Path, nargs="+")

    st = sub.add_parser("selftest", help="plant every kind of leak in real Hermes and prove each is caught")
    st.add_argument("--hermes-python", type=Path)
    st.add_argument("--out", type=Path)

    scorecard.add_parser(sub)

    bl = sub.add_parser("baseline", help="run a scenario N times (or judge saved runs, --from) and write its "
                                         "incidents as a baseline (or --upgrade an older baseline)")
    bl.add_argument("--scenario", default="oneshot", choices=sorted(SCENARIOS))
    bl.add_argument("--runs", type=int, default=3, help="runs; incidents missing from some run are intermittent "
                    "(each incident, hop and spread class keeps its rate: seen of runs)")
    bl.add_argument("--from", dest="sources", type=Path, nargs="+", metavar="EVIDENCE",
                    help="evidence folders of earlier runs of one scenario (several machines, say) instead of running")
    bl.add_argument("--phases", help="comma-separated multi-profile phases (as for run)")
    bl.add_argument("--hermes-python", type=Path)
    bl.add_argument("--evidence", type=Path, help="keep the runs' evidence folders here")
    bl.add_argument("--out", type=Path, help="the baseline file to write (default with --upgrade: in place)")
    bl.add_argument("--upgrade", type=Path, metavar="FILE",
                    help="convert a version-2 (exact) or version-1 (inexact) class baseline to version 3 instead of "
                    "running")

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
    mx.add_argument("--platforms", help="messaging platforms, as for run")
    mx.add_argument("--unset", help="settings the second tenant (launch:SERVICE.NAME: the launch profile) leaves "
                    "unset in every run, as for run")
    mx.add_argument("--shard", help="I/N: run only this share of the release x scenario x run cells")
    mx.add_argument("--timeout", type=float, default=180.0, help="seconds per Hermes turn")
    mx.add_argument("--out", type=Path, required=True, help="matrix folder: matrix.json/.md/.html, evidence per run")
    mx.add_argument("--force", action="store_true", help="run into a folder that already holds a matrix")
    mx.add_argument("--quiet", action="store_true", help="no progress on stderr")
    sign_option(mx)

    mg = sub.add_parser("merge", parents=[fail_on], help="combine the matrix.json of every shard into one matrix")
    mg.add_argument("shards", type=Path, nargs="+", help="shard folders (or their matrix.json)")
    mg.add_argument("--out", type=Path, required=True, help="where matrix.json/.md/.html are written")

    ex = sub.add_parser("export", help="redacted copies of saved flows: HAR 1.2 and/or a .mitm flow file")
    ex.add_argument("source", type=Path, help="an evidence folder (registry.yaml + flows.mitm) or a flow file")
    ex.add_argument("--registry", type=Path, help="the registry (default: registry.yaml in the evidence folder)")
    ex.add_argument("--har", type=Path, help="write a HAR 1.2 file here")
    ex.add_argument("--flows", type=Path, help="write a redacted flow file here (mitmweb -r, reconcile)")

    pc = sub.add_parser("patch-check", parents=[fail_on], help="audit a Hermes install and a copy of it with PATCH "
                        "applied, side by side: which incident crossings the patch removed, which remain, which are "
                        "new; or, with --series, audit the twin: the install with a fix series applied")
    pc.add_argument("patch", type=Path, nargs="?",
                    help="a unified diff with paths under site-packages (a/PATH, b/PATH)")
    pc.add_argument("--series", type=Path, metavar="FILE",
                    help="instead of PATCH: a series file (patches one a line, in order; docs/fixes/series); the "
                         "install with every patch applied (built once, cached by the series' hash) is audited "
                         "alone, and the verdict is the exit code, as for run (--fail-on)")
    pc.add_argument("--on", type=Path, action="append", default=[], metavar="PATCH",
                    help="a fix PATCH builds on, applied to both installs first (repeat for a series): the "
                         "comparison is then PATCH's own effect on top of it")
    pc.add_argument("--scenario", default="oneshot", choices=sorted(SCENARIOS))
    pc.add_argument("--tenants", type=int, default=0, help="tenants (default: the scenario's)")
    pc.add_argument("--tools", help="tool battery groups, as for run ('none': the env probe only)")
    pc.add_argument("--services", help="services, as for run ('none': the providers only)")
    pc.add_argument("--phases", help="multi-profile phases, as for run")
    pc.add_argument("--platforms", help="messaging platforms, as for run")
    pc.add_argument("--unset", help="settings the second tenant leaves unset, as for run (SERVICE.NAME,...|all)")
    pc.add_argument("--plant", action="append", default=[], metavar="NAME",
                    help="a negative control planted in both audits, as for run (repeatable)")
    pc.add_argument("--policy", default="hermes", help="the isolation policy, as for run (default hermes)")
    pc.add_argument("--runs", type=int, default=1, help="with --series: audit the twin N times, as run --runs does")
    pc.add_argument("--hermes-python", type=Path, help="the install to patch a copy of (default: as for run)")
    pc.add_argument("--out", type=Path, help="a new or empty folder for both runs, the copy and patch-check.json "
                    "(with --series: the twin audit's evidence folder)")
    mu = sub.add_parser("mutants", help="plant each isolation regression of the mutant set in a copy of Hermes and "
                        "audit it beside the unmutated install: caught, missed or not exercised")
    mu.add_argument("--only", help="comma-separated mutant names (default: every one)")
    mu.add_argument("--scenario", default="oneshot", choices=sorted(SCENARIOS))
    mu.add_argument("--tools", help="tool battery groups, as for run ('none': the env probe only)")
    mu.add_argument("--services", help="services, as for run ('none': the providers only)")
    mu.add_argument("--series", type=Path, metavar="FILE",
                    help="mutate the twin instead: the install with a fix series applied (as for patch-check "
                         "--series; built once, cached by the series' hash), which is also the control")
    mu.add_argument("--hermes-python", type=Path, help="the install to mutate copies of (default: as for run; with "
                    "--series, the install the twin is built from)")
    mu.add_argument("--out", type=Path, help="a new or empty folder for the runs, the patches and mutants.json")
    sub.add_parser("cleanup", help="reap processes a killed run left behind")
    return p


def sign_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sign-key", type=Path, metavar="FILE", help="an ed25519 private key (PEM, unencrypted): the "
                   "manifest of the evidence folder (manifest.intoto.json) is signed with it (default: unsigned)")


def phases(text: str | None) -> list[str]:
    """`--phases a,b` as a list; `all` is every phase, cron included (the opt-in phases only when named beside it:
    `all,approvals`); none given: the default."""
    names = [p for p in (text or "").split(",") if p]
    if "all" not in names:
        return names
    return list(dict.fromkeys([*ALL_PHASES, *(n for n in names if n != "all")]))


def limit_options(p: argparse.ArgumentParser) -> None:
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


def limits(a: argparse.Namespace) -> stream.Limits:
    if min(a.max_stream_bytes, a.max_file_bytes) < 1 or a.max_depth < 0 or a.max_seconds < 0:
        raise UsageError("--max-stream-bytes and --max-file-bytes must be positive, --max-depth and --max-seconds "
                         "not negative")
    return stream.Limits(stream_bytes=a.max_stream_bytes, total_bytes=a.max_file_bytes, depth=a.max_depth,
                         seconds=a.max_seconds)


def parse_tools(value: str | None) -> list[str] | None:
    """`--tools` (and `--services`): None (every one), `none` ([]) or a comma-separated list."""
    if value is None:
        return None
    return [] if value.strip() == "none" else [g for g in value.split(",") if g]


def services_of(a: argparse.Namespace) -> list[str] | None:
    """`--services` with `--platforms` added (None: the default services, and no platform)."""
    services = parse_tools(a.services)
    if not getattr(a, "platforms", None):
        return services
    names = list(PLATFORMS) if a.platforms.strip() == "all" else [n for n in a.platforms.split(",") if n]
    unknown = [n for n in names if n not in PLATFORMS]
    if unknown:
        raise UsageError(f"unknown platform {unknown[0]!r} (choose from {', '.join(PLATFORMS)}, or all)")
    chosen = list(DEFAULT_SERVICES) if services is None else services
    return [*chosen, *(n for n in names if n not in chosen)]


def unset_of(a: argparse.Namespace) -> list[str]:
    """`--unset`: the settings (`SERVICE.NAME`) the second tenant leaves unset; `all`: every one of the run's
    services (the provider's included)."""
    if not getattr(a, "unset", None):
        return []
    if a.unset.strip() != "all":
        return [s for s in a.unset.split(",") if s]
    chosen = services_of(a)
    on = {PROVIDER_SERVICE.name, *(DEFAULT_SERVICES if chosen is None else chosen)}
    return [s for s in UNSETTABLE if s.split(".", 1)[0] in on]


def run_options(a: argparse.Namespace) -> RunOptions:
    """`run`'s options from its arguments (`run_audit` checks them: `check_options`)."""
    if a.runs < 1:
        raise UsageError("--runs must be at least 1")
    return RunOptions(scenario=a.scenario, tenants=a.tenants or default_tenants(a.scenario),
                      topology=a.topology, plants=a.plant, baseline=a.baseline, out=a.out,
                      hermes_python=a.hermes_python, force=a.force, quiet=a.quiet, turns=a.turns, timeout=a.timeout,
                      phases=phases(a.phases), cron_wait=a.cron_wait,
                      redact=a.redact, stub_fault=a.stub_fault, tools=parse_tools(a.tools), stubs=a.stubs,
                      services=services_of(a), policy=a.policy, sign_key=a.sign_key, unset=unset_of(a))


def matrix_options(a: argparse.Namespace) -> MatrixOptions:
    """`matrix`'s options from its arguments (UsageError for a malformed release, scenario or shard)."""
    return MatrixOptions(releases=parse_releases(a.hermes), scenarios=parse_scenarios(a.scenario), runs=a.runs,
                         out=a.out, tools=parse_tools(a.tools), phases=phases(a.phases),
                         services=services_of(a), unset=unset_of(a),
                         shard=parse_shard(a.shard) if a.shard else None,
                         timeout=a.timeout, force=a.force, quiet=a.quiet, sign_key=a.sign_key)


def patch_check_options(a: argparse.Namespace) -> RunOptions:
    """The audit options of `patch-check` and `mutants` (the same for every run they make)."""
    return RunOptions(scenario=a.scenario, tenants=getattr(a, "tenants", 0) or default_tenants(a.scenario),
                      out=a.out, hermes_python=a.hermes_python, quiet=True, phases=phases(getattr(a, "phases", None)),
                      tools=parse_tools(a.tools), services=services_of(a),
                      policy=getattr(a, "policy", RunOptions.policy), unset=unset_of(a),
                      plants=list(getattr(a, "plant", [])))


def patch_check_mode(a: argparse.Namespace) -> str:
    """`series` (audit the twin) or `patch` (PATCH beside the install); UsageError for a mix of the two."""
    if a.series is None:
        if a.patch is None:
            raise UsageError("patch-check: pass PATCH, or --series FILE")
        if a.runs != 1:
            raise UsageError("patch-check: --runs needs --series")
        return "patch"
    if a.patch is not None or a.on:
        raise UsageError("patch-check: --series audits the series alone; pass PATCH (with --on) or --series")
    if a.runs < 1:
        raise UsageError("--runs must be at least 1")
    return "series"

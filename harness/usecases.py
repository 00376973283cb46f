"""What each command of `tenancy-audit` does besides `run` and `matrix`, without parsing or printing: reconcile
saved evidence, scan files, the self-test, baselines, export, the versions. `harness.cli` parses the arguments,
calls one of these (or `run.run_audit`, `matrix.repeat`, `matrix.run_matrix`) and prints what it returns."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import mitmproxy.version

import harness
from harness.core import dsse
from harness.core.evidence import EvidenceFolder
from harness.core.files import FLOWS, REGISTRY, write_private
from harness.core.findings import EXIT_INCONCLUSIVE, EXIT_LEAK, INCONCLUSIVE_KINDS, Verdict
from harness.core.record import RunRecord
from harness.core.registry_file import load
from harness.detect import scan
from harness.detect.engine.matcher import matcher_for
from harness.detect.engine.stream import DEFAULT_LIMITS, Limits
from harness.detect.reconcile import LogSource, Reading, read_flows, reconcile
from harness.drive import plants
from harness.drive.doors import default_tenants
from harness.drive.hermes.patched import patched_copy, site_packages
from harness.drive.hermes.twin import changes_of, twin
from harness.judge import evaluate, release_versions, result_of, venv_warnings
from harness.matrix import run_audits
from harness.options import RunOptions, UsageError, hermes_python
from harness.proof import mutants
from harness.report import baseline, baseline_classes, export
from harness.report import policy as policies
from harness.report.attestation import Verification, verify_folder, write_manifest
from harness.report.comparison import compare
from harness.report.result import AuditResult
from harness.report.writer import write_reports
from harness.run import run_audit


def hermes_version(python: Path) -> str:
    """The hermes-agent version installed for `python`, or why there is none."""
    if not python.exists():
        return "not installed (no such file)"
    code = "from importlib.metadata import version; print(version('hermes-agent'))"
    try:
        done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({python}: {exc})"
    if done.returncode != 0:
        return f"not installed for {python}"
    return done.stdout.strip()


def version_text() -> str:
    """This tool's, mitmproxy's and the version of the Hermes a `run` would audit."""
    python = hermes_python(None)
    return (f"tenancy-audit {harness.__version__}\nmitmproxy {mitmproxy.version.VERSION}\n"
            f"hermes-agent {hermes_version(python)} ({python})")


@dataclass
class ReconcileOptions:
    """`reconcile`: an evidence folder, or a registry and a flow file (with logs, stubs, homes)."""

    evidence: Path | None = None
    baseline: Path | None = None
    registry: Path | None = None
    flows: Path | None = None
    scenario: str | None = None
    phase: str | None = None
    logs: list[Path] = field(default_factory=list)
    stubs: Path | None = None
    no_homes: bool = False
    policy: str | None = None
    out: Path | None = None
    limits: Limits = DEFAULT_LIMITS
    sign_key: Path | None = None  # the manifest of `out` is signed with it


def reconcile_saved(opts: ReconcileOptions, say: Callable[[str], None]) -> AuditResult:
    """The verdict of saved evidence, written as reports to `opts.out` if given (with their manifest, last)."""
    started = time.monotonic()
    key = dsse.signing_key(opts.sign_key) if opts.sign_key else None
    if opts.sign_key and not opts.out:
        raise UsageError("reconcile: --sign-key signs the manifest of --out; pass --out")
    if opts.evidence is not None:
        result = _reconcile_folder(opts, opts.evidence, started, say)
    elif opts.registry is None or opts.flows is None:
        raise UsageError("reconcile: pass an evidence folder, or --registry and --flows")
    else:
        result = _reconcile_files(opts, opts.registry, opts.flows, started)
    if opts.out:
        EvidenceFolder.for_reports(opts.out, opts.evidence)
        result.out = opts.out
        write_reports(opts.out, result)
        lock = RunRecord.read(opts.evidence).hermes_venv.get("lock") if opts.evidence else None
        write_manifest(opts.out, result, lock, key, reports_of=opts.evidence or opts.flows)
        step_summary(opts.out)
    return result


def _reconcile_folder(opts: ReconcileOptions, out: Path, started: float, say: Callable[[str], None]) -> AuditResult:
    """The whole evidence folder, as `run` judged it: the same verdict, findings and fingerprints."""
    if not out.is_dir():
        raise UsageError(f"reconcile: {out} is not a directory (pass an evidence folder, or --registry and --flows)")
    if opts.registry is not None and opts.registry.resolve() != (out / REGISTRY).resolve():
        raise UsageError("reconcile: with an evidence folder, the registry is its registry.yaml")
    if opts.scenario or opts.phase:
        raise UsageError("reconcile: an evidence folder names its own scenario and phases (timeline.json)")
    if opts.logs or opts.stubs or opts.no_homes:
        raise UsageError("reconcile: an evidence folder is judged whole (its logs/, stubs.jsonl and homes); "
                         "--logs, --stubs and --no-homes are for loose files")
    record = RunRecord.read(out)
    copy = EvidenceFolder(out).baseline_copy
    path = opts.baseline or (copy if copy.exists() else None)
    base = baseline.load(path) if path else None
    if path is not None and opts.baseline is None:
        say(f"tenancy-audit: judged against the run's baseline {path} (pass --baseline to use another)")
    policy = policies.load(opts.policy) if opts.policy else None  # None: the run's own (`policy.yaml` of the folder)
    return evaluate(out, record, base, seconds=time.monotonic() - started, flows=opts.flows, limits=opts.limits,
                    policy=policy)


def _reconcile_files(opts: ReconcileOptions, registry_path: Path, flows: Path, started: float) -> AuditResult:
    """A registry and a flow file (plus logs, stubs, homes): findings labelled with --scenario/--phase."""
    registry = load(registry_path)
    homes = {} if opts.no_homes else {t.name: Path(t.home) for t in registry if t.home}
    rec = reconcile(registry, flows, homes=homes, logs=[LogSource(p, None) for p in opts.logs], stub_log=opts.stubs,
                    reading=Reading(limits=opts.limits))
    return result_of(rec, Verdict([f.labelled(opts.scenario, opts.phase) for f in rec.findings], reasons=rec.reasons),
                     base=baseline.load(opts.baseline) if opts.baseline else None, tenants=registry.names(),
                     scenario=opts.scenario or "reconcile", versions=release_versions(),
                     seconds=time.monotonic() - started)


def verify(evidence: Path, key: Path | None) -> Verification:
    """`verify EVIDENCE [--key PUB]`: every file against the folder's manifest and its signature, then the folder
    reconciled again (`reconcile EVIDENCE`, which writes nothing) to the recorded verdict, incidents and
    fingerprints (`report.attestation.verify_folder`)."""
    if not evidence.is_dir():
        raise UsageError(f"verify: {evidence} is not a directory (pass an evidence folder)")
    return verify_folder(evidence, dsse.public_key(key) if key else None,
                         lambda folder: reconcile_saved(ReconcileOptions(evidence=folder), lambda _: None))


def step_summary(out: Path | None) -> None:
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


def scan_command(registry_path: Path, paths: list[Path], owner: str | None, limits: Limits,
               json_out: Path | None) -> scan.TreeScan:
    """The canaries of the registry in files and trees (`json_out`: also written there as JSON)."""
    registry = load(registry_path)
    if owner is not None and owner not in registry.tenants:
        raise UsageError(f"--owner {owner!r} is not a tenant of {registry_path}")
    for p in paths:
        if not p.exists():
            raise UsageError(f"{p} does not exist")
    result = scan.scan_paths(paths, registry, owner, limits=limits)
    if json_out:
        verdict = scan_verdict(result)
        write_private(json_out, json.dumps({
            "verdict": verdict.status, "reasons": verdict.reasons,
            "not_inspected": [n.to_dict() for n in result.not_inspected],
            "findings": [f.to_dict() for f in result.findings]}, indent=2).encode())
    return result


def scan_verdict(result: scan.TreeScan) -> Verdict:
    reasons = [f"unreadable: {p}" for p in result.unreadable]
    reasons += [r for r in result.reasons() if ": unreadable" not in r]
    return Verdict(result.findings, reasons=reasons)


@dataclass
class PlantOutcome:
    """One plant of the self-test: whether it was caught as it must be."""

    name: str
    ok: bool
    code: int
    expected: frozenset[str]
    kinds: set[str]


def selftest(python: Path | None, out: Path | None) -> Iterator[PlantOutcome]:
    """Every plant in its own audit of real Hermes, each as soon as it is judged."""
    for name, plant in plants.PLANTS.items():
        scenario = plants.SCENARIO.get(name, "oneshot")
        result = run_audit(RunOptions(plants=[name], out=(out / name) if out else None, hermes_python=python,
                                      quiet=True, topology=plants.TOPOLOGY.get(name, "reverse"), scenario=scenario,
                                      tenants=2, phases=plants.phases_for(name),
                                      tools=plants.battery_for(name), services=plants.services_for(name)))
        code = result.verdict.exit_code
        kinds = {f.kind for f in result.verdict.findings}
        missed = [r for r in result.verdict.reasons if r.startswith(f"plant {name} ")]
        # a plant that only defeats the proof (a bypass) must end inconclusive; every other one in a leak
        want = EXIT_INCONCLUSIVE if plant.expects <= INCONCLUSIVE_KINDS else EXIT_LEAK
        yield PlantOutcome(name, code == want and plant.expects <= kinds and not missed, code, plant.expects, kinds)


def _writable(out: Path) -> None:
    try:  # before minutes of runs: the baseline can be written there
        with tempfile.TemporaryFile(dir=out.parent):
            pass
    except OSError as exc:
        raise UsageError(f"baseline: cannot write --out {out} ({exc.strerror or exc})") from None


def make_baseline(scenario: str, runs: int, phases: list[str], python: Path | None, evidence: Path | None,
                  out: Path, say: Callable[[str], None]) -> list[dict[str, Any]]:
    """Run `scenario` `runs` times and write its incidents to `out` as a baseline; returns its incidents."""
    _writable(out)
    found, version, records = [], "?", []
    with tempfile.TemporaryDirectory(prefix="tenancy-baseline-") as tmp:
        opts = RunOptions(scenario=scenario, tenants=default_tenants(scenario), hermes_python=python,
                          out=evidence or Path(tmp), quiet=True, phases=phases)
        for i, result in run_audits(run_audit, opts, range(1, runs + 1)):
            assert isinstance(result, AuditResult) and result.out is not None
            version = result.versions.get("hermes-agent", "?")
            found.append(result.verdict.findings)
            records.append(RunRecord.read(result.out))
            say(f"run {i}/{runs}: {result.verdict.status} (exit {result.verdict.exit_code}), "
                f"{len(found[-1])} findings")
    return baseline.write(out, found, note=f"hermes-agent {version}, scenario {scenario}, {runs} runs",
                          made_with=_made_with(records, say))


def _made_with(records: list[RunRecord], say: Callable[[str], None]) -> dict[str, Any]:
    """What made a baseline: the Hermes release, its lock and its venv's distributions (the first run's); `say`
    each way a run's venv was not its lock or not the first run's."""
    for line in dict.fromkeys(w for r in records for w in venv_warnings(r, None)):
        say(f"tenancy-audit: {line}")
    venv = records[0].hermes_venv if records else {}
    if any(r.hermes_venv.get("installed") != venv.get("installed") for r in records):
        say("tenancy-audit: the runs audited Hermes venvs with different distributions; the baseline names the first")
    return {"hermes-agent": records[0].hermes_agent if records else None, "lock": venv.get("lock"),
            "installed": venv.get("installed") or {}}


def baseline_from(sources: list[Path], out: Path, say: Callable[[str], None]) -> list[dict[str, Any]]:
    """Judge saved evidence folders of one scenario (runs on several machines, say) and write their incidents to
    `out` as a baseline; returns its incidents."""
    _writable(out)
    found, scenarios, versions_seen, records = [], set(), set(), []
    for source in sources:
        records.append(RunRecord.read(source))
        result = evaluate(source, records[-1], None)
        scenarios.add(result.scenario)
        versions_seen.add(result.versions.get("hermes-agent", "?"))
        found.append(result.verdict.findings)
        say(f"{source}: {result.scenario}, {len(found[-1])} findings")
    if len(scenarios) > 1 or len(versions_seen) > 1:
        raise UsageError(f"baseline: --from folders of one scenario and one Hermes (got {sorted(scenarios)}, "
                         f"hermes-agent {sorted(versions_seen)})")
    return baseline.write(out, found, note=f"hermes-agent {versions_seen.pop()}, scenario {scenarios.pop()}, "
                                           f"{len(sources)} runs", made_with=_made_with(records, say))


def export_flows(source: Path, registry_path: Path | None, har: Path | None, flows_out: Path | None,
                 say: Callable[[str], None], show: Callable[[str], None]) -> None:
    """Redacted copies of saved flows: HAR 1.2 and/or a .mitm flow file (`show`: each file written)."""
    if not (har or flows_out):
        raise UsageError("export: pass --har FILE and/or --flows FILE")
    flows_path = source / FLOWS if source.is_dir() else source
    registry_path = registry_path or (source / REGISTRY if source.is_dir() else None)
    if registry_path is None:
        raise UsageError("export: a flow file needs --registry")
    if not flows_path.is_file():
        raise UsageError(f"export: {flows_path} does not exist")
    matcher = matcher_for(load(registry_path))
    flows, truncated = read_flows(flows_path)
    if truncated:
        say(f"tenancy-audit: {truncated}")
    if har:
        show(f"wrote {har}: {export.write_har(har, flows, matcher)} entries")
    if flows_out:
        show(f"wrote {flows_out}: {export.write_flows(flows_out, flows, matcher)} flows")


def upgrade_baseline(path: Path, dest: Path, say: Callable[[str], None]) -> str:
    """Convert an older baseline to the current version (`say`: what the conversion could not keep)."""
    old = baseline.load(path).version
    done = baseline.upgrade(path, dest)
    regenerate = "regenerate the baseline (tenancy-audit baseline --scenario S --runs N --out FILE) for an exact one"
    if old == 1:
        say(f"tenancy-audit: an entry upgraded from version 1 keeps only its example's direction; {regenerate}")
    if done.untooled:
        say(f"tenancy-audit: {done.untooled} entries name no tool or service (written before baselines kept them) "
            f"and are taken to have none, so a class that had one is new now; {regenerate}")
    return (f"wrote {dest}: {done.written} entries (version {baseline_classes.VERSION}, from version {old})"
            + (f", {done.dropped} dropped (no direction named, or malformed)" if done.dropped else ""))


def patch_check(patch: Path, opts: RunOptions, say: Callable[[str], None],
                on: list[Path] | None = None) -> dict[str, Any]:
    """Audit the install and a copy of it with `patch` applied (`drive.patched`), one after the other with the
    same options, and compare their incidents crossing by crossing (`report.comparison`); the result is also
    written to `patch-check.json` in the folder (`opts.out`) that holds both runs' evidence (`control/`,
    `patched/`) and the copies. With `on` (the fixes `patch` builds on), both installs are copies with those
    applied first, so the comparison is `patch`'s own effect on top of them."""
    python = hermes_python(opts.hermes_python, say)
    folder = EvidenceFolder.for_run(opts.out, opts.force)
    try:
        control = patched_copy(python, on, folder.path / "base-venv") if on else python
        copy = patched_copy(python, [*(on or []), patch], folder.path / "patched-venv")
    except UsageError:
        folder.discard()
        raise
    runs = {}
    # Folder names of one length: Hermes cuts some logged paths at a fixed length, so a tenant's workdir (under the
    # run's folder) must be as long in both runs for the two to log the same canaries.
    for name, sub, which in (("unpatched", "control", control), ("patched", "patched", copy)):
        say(f"patch-check: auditing the {name} install ({which})")
        runs[name] = run_audit(replace(opts, out=folder.path / sub, hermes_python=which, force=True, quiet=True))
    doc = {"patch": str(patch), "on": [str(p) for p in on or []], "scenario": opts.scenario,
           "verdicts": {name: r.verdict.status for name, r in runs.items()},
           **compare(runs["unpatched"].verdict.findings, runs["patched"].verdict.findings)}
    write_private(folder.path / "patch-check.json", json.dumps(doc, indent=2).encode())
    return doc


def on_twin(series: Path, opts: RunOptions, say: Callable[[str], None]) -> RunOptions:
    """`opts` auditing the twin: the install with `series` applied (`drive.hermes.twin`: built once, cached by its
    hash)."""
    return replace(opts, hermes_python=twin(hermes_python(opts.hermes_python, say), series, say))


def _traced(out: Path) -> str:
    """What a mutated line recorded in the sandbox HOME: `computed` (a value other than the original's),
    `same` (it ran, to the same value) or `never ran`."""
    lines = {line for f in out.glob(f"sandbox/*/{mutants.TRACE}") for line in f.read_text().split()}
    return "computed" if "True" in lines else "same" if lines else "never ran"


def mutant_run(opts: RunOptions, names: list[str], say: Callable[[str], None],
               series: Path | None = None) -> dict[str, Any]:
    """Audit the install (the control), then a copy of it per mutant (`proof.mutants`), each with the same
    options; a mutant is `caught` when its audit shows a crossing the control's does not, `missed` when its code
    computed another value and nothing showed, `not exercised` when its code never did, `not applicable: WHY` when
    it does not fit the install. With `series` the install is its twin (`on_twin`): the control and every mutant's
    copy are the twin's, a mutant is planted in its twin form where the series left that form's line (`form`:
    `twin`, else `shipped`), and one that does not fit says which patches of the series change its file."""
    chosen = [m for m in mutants.MUTANTS if not names or m.name in names]
    if names and len(chosen) != len(set(names)):
        raise UsageError(f"mutants: unknown mutant (choose from {', '.join(m.name for m in mutants.MUTANTS)})")
    opts = on_twin(series, opts, say) if series is not None else opts
    python = hermes_python(opts.hermes_python, say)
    site = site_packages(python.parent.parent)
    folder = EvidenceFolder.for_run(opts.out, opts.force)
    control = run_audit(replace(opts, out=folder.path / "control", hermes_python=python, force=True, quiet=True))
    say(f"mutants: control {control.verdict.status}")
    rows = []
    for number, m in enumerate(chosen, 1):
        folder_name = f"m-{number:05d}"  # as long as "control" (see patch_check); mutants.json names each run's folder
        patch = folder.path / "patches" / f"{m.name}.patch"
        try:
            form = m.form(site)
            write_private(patch, form.patch(site).encode())
        except mutants.MutantError as exc:
            why = f"{exc}" + (f" ({changes_of(series, m.file)})" if series is not None else "")
            rows.append({"name": m.name, "surface": m.surface, "bug": m.bug, "state": f"not applicable: {why}"})
            say(f"mutants: {m.name:<20} not applicable: {why}")
            continue
        copy = patched_copy(python, patch, folder.path / "venv")
        got = run_audit(replace(opts, out=folder.path / folder_name, hermes_python=copy, force=True, quiet=True))
        diff = compare(control.verdict.findings, got.verdict.findings)
        shown = sorted({**diff["new"], **diff["varied"]})
        ran = _traced(folder.path / folder_name)
        state = "caught" if shown else "missed" if ran == "computed" else "not exercised"
        rows.append({"name": m.name, "surface": m.surface, "bug": m.bug, "state": state, "trace": ran,
                     "form": "twin" if form == m.twin else "shipped", "hops": shown, "folder": folder_name})
        say(f"mutants: {m.name:<20} {state} ({ran}; {len(shown)} crossing(s) the control lacks)")
    shutil.rmtree(folder.path / "venv", ignore_errors=True)
    doc = {"scenario": opts.scenario, "series": str(series) if series else None, "control": control.verdict.status,
           "mutants": rows}
    write_private(folder.path / "mutants.json", json.dumps(doc, indent=2).encode())
    return doc

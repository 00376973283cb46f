"""The release matrix: the same audit against several Hermes releases (and N runs each), one table of which
finding class each release shows and how often; `--shard I/N` runs a share of it, `merge` joins the shares.

Each release runs from its own cached venv (`drive.hermes.install`) or an interpreter given as `VERSION=PYTHON`;
a release pip cannot install, or a scenario the release cannot drive (`drive.features`), becomes `n/a`
cells with the reason. Every run keeps its evidence folder under `DIR/<release>/<scenario>/run-<i>`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from packaging.version import Version

from harness.capture.proxy import ProxyError
from harness.core.evidence import EvidenceFolder
from harness.core.files import REGISTRY, write_private
from harness.core.places import evidence_root
from harness.core.procs import ProcessSet
from harness.core.record import EvidenceError
from harness.core.registry import RegistryError
from harness.core.registry_file import load
from harness.detect.engine.matcher import matcher_for
from harness.drive.doors import default_tenants, missing
from harness.drive.hermes import features, install
from harness.drive.hermes.agent import Hermes, HermesError, Sandbox
from harness.drive.services import PROBES, unavailable
from harness.options import MatrixOptions, RunOptions, UsageError, check_matrix_options, check_options, plan_of
from harness.report import matrix
from harness.report.matrix import NA, Cell, MatrixError, class_of, incident_of
from harness.report.matrix_pages import render_html, render_markdown
from harness.report.result import AuditResult

FILES = ("matrix.json", "matrix.md", "matrix.html")


def progress(quiet: bool, msg: str) -> None:
    if not quiet:
        print(f"[matrix] {msg}", file=sys.stderr, flush=True)


def prepare_dir(out: Path, force: bool) -> Path:
    """The matrix folder: created, writable, and without an earlier matrix unless --force."""
    out = out.absolute()
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a directory")
    if (out / "matrix.json").exists() and not force:
        raise UsageError(f"--out {out} already holds a matrix (pass --force to run it again)")
    return EvidenceFolder.create(out, created=not out.exists()).path


def write_matrix(out: Path, doc: dict[str, Any]) -> None:
    write_private(out / "matrix.json", matrix.dumps(doc).encode())
    write_private(out / "matrix.md", render_markdown(doc).encode())
    write_private(out / "matrix.html", render_html(doc).encode())


def cell_of(result: AuditResult, release: str, scenario: str, run: int, root: Path) -> Cell:
    """One run as a matrix cell: its verdict, completed turns, incidents, finding classes and the tools not
    offered."""
    found = result.verdict.findings + result.verdict.known
    classes: dict[str, dict[str, Any]] = {}
    for f in found:
        classes.setdefault(f.fingerprint(), class_of(f))
    reason = result.verdict.reasons[0] if result.verdict.reasons else ""
    if reason and result.out is not None:
        with contextlib.suppress(OSError, RegistryError):
            reason = matcher_for(load(result.out / REGISTRY)).redact_text(reason)
        reason = reason.replace(f"{result.out}/", "")  # paths relative to the cell's evidence folder
    not_offered = {s: sorted(t for t, state in row.items() if state == "not offered")
                   for s, row in result.coverage.items()}
    services_na = {s: state.removeprefix(f"{NA}: ") for row in result.services.values() for s, state in row.items()
                   if state.startswith(NA)}
    return Cell(release, scenario, run, result.verdict.status, reason[:300],
                sum(1 for e in result.timeline if e.get("ok")), classes,
                {s: tools for s, tools in not_offered.items() if tools}, services_na,
                result.out.relative_to(root).as_posix() if result.out is not None else None,
                {row.incident.id: incident_of(row) for row in result.incidents},
                "; ".join([result.versions.get("hermes-lock", "no lock"),
                           *(w for w in result.warnings if "differs from the lock" in w)]))


@dataclass
class Release:
    """A release ready to run (its python and what it offers), or why it cannot run at all."""

    version: str
    python: Path | None = None
    offered: features.Features | None = None
    reason: str = ""


def prepare_release(version: str, given: Path | None, say: Callable[[str], None]) -> Release:
    """Install (or reuse) the release and ask it what it offers. A release that does not install or does not
    run is `n/a`; a given python that does not run that release is an error (HermesError, UsageError)."""
    try:
        python = given or install.install(version, say)
        with tempfile.TemporaryDirectory(prefix="tenancy-matrix-probe-") as tmp:
            hermes = Hermes(python, Sandbox(Path(tmp)), ProcessSet(), Path(tmp) / "logs")
            try:
                found = hermes.check()
                offered = features.probe(hermes, found, PROBES)
            finally:
                hermes.procs.close()
    except HermesError as exc:
        if given is not None:
            raise
        say(str(exc))
        return Release(version, reason=str(exc))
    if Version(found) != Version(version):
        raise UsageError(f"--hermes {version}={python}: that python runs hermes-agent {found}")
    return Release(version, python, offered)


#: What runs one audit (`run.run_audit`; the use cases hand it in, so the matrix never reaches into an audit).
Audit = Callable[[RunOptions], AuditResult]


def run_audits(audit: Audit, opts: RunOptions, runs: Iterable[int], *, failed: tuple[type[Exception], ...] = ()
               ) -> Iterator[tuple[int, AuditResult | Exception]]:
    """The audit `opts` once per run number `i`, into `opts.out / f"run-{i}"` (replaced if there): `run --runs`,
    `baseline` and every cell of the matrix. Each result comes as soon as its run ends; an exception of `failed`
    ends that run only, and comes instead of its result."""
    assert opts.out is not None, "the runs need a folder"
    for i in runs:
        try:
            yield i, audit(replace(opts, out=opts.out / f"run-{i}", force=True))
        except failed as exc:
            yield i, exc


def _cells(audit: Audit, opts: MatrixOptions, rel: Release, scenario: str, runs: list[int]) -> Iterator[Cell]:
    """The cells of one release and scenario (n/a, with the reason, if the release cannot drive it)."""
    lack = (missing(rel.offered, scenario) or unavailable(rel.offered.offers, opts.services or [])
            if rel.offered else None)
    if rel.python is None or lack:
        reason = rel.reason or f"hermes-agent {rel.version} cannot drive {lack}"
        yield from (Cell(rel.version, scenario, run, NA, reason) for run in runs)
        return
    run_opts = RunOptions(scenario=scenario, tenants=default_tenants(scenario), hermes_python=rel.python,
                          out=opts.out / rel.version / scenario, quiet=True, timeout=opts.timeout, tools=opts.tools,
                          phases=list(opts.phases), services=opts.services, unset=list(opts.unset),
                          sign_key=opts.sign_key)
    for run, got in run_audits(audit, run_opts, runs, failed=(HermesError, ProxyError, EvidenceError)):
        if isinstance(got, Exception):
            yield Cell(rel.version, scenario, run, NA, f"the run failed: {got}")
        else:
            yield cell_of(got, rel.version, scenario, run, opts.out)


def run_matrix(audit: Audit, opts: MatrixOptions) -> dict[str, Any]:
    """Run this shard's cells (every cell without a shard), write matrix.json/.md/.html, return the document."""
    check_matrix_options(opts)  # every option valid before anything is installed or written
    plan = opts.plan
    keys = matrix.shard_keys(plan, *opts.shard) if opts.shard else plan.cell_keys()
    created = not opts.out.exists()
    opts = replace(opts, out=prepare_dir(opts.out, opts.force))

    def say(msg: str) -> None:
        progress(opts.quiet, msg)

    try:
        releases = {v: prepare_release(v, opts.releases[v], say) for v in dict.fromkeys(r for r, _, _ in keys)}
    except (UsageError, HermesError):
        if created:
            with contextlib.suppress(OSError):
                opts.out.rmdir()
        raise
    shard = f"{opts.shard[0]}/{opts.shard[1]}" if opts.shard else None
    cells: list[Cell] = []
    doc = matrix.document(plan, cells, shard)
    for (version, scenario), group in itertools.groupby(keys, key=lambda k: k[:2]):
        for cell in _cells(audit, opts, releases[version], scenario, [run for _, _, run in group]):
            cells.append(cell)  # the matrix is rewritten after every cell: an interrupted one is kept
            detail = f": {cell.reason}" if cell.status == NA else f", {len(cell.classes)} class(es)"
            say(f"{version} {scenario} run {cell.run}/{opts.runs}: {cell.status}{detail}")
            doc = matrix.document(plan, cells, shard)
            write_matrix(opts.out, doc)
    return doc


def merge_dirs(dirs: list[Path], out: Path) -> dict[str, Any]:
    """One matrix (and its reports) in `out` from the matrix.json of every shard folder."""
    parts = []
    for d in dirs:
        path = d / "matrix.json" if d.is_dir() else d
        try:
            parts.append((str(path), json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise MatrixError(f"merge: cannot read {path} ({getattr(exc, 'strerror', None) or type(exc).__name__})"
                              ) from None
    doc = matrix.merge(parts)
    if any(out.absolute() == (d if d.is_dir() else d.parent).absolute() for d in dirs):
        raise MatrixError(f"merge: --out {out} is one of the shards; pass another folder")
    write_matrix(prepare_dir(out, force=True), doc)
    return doc


def repeat(audit: Audit, opts: RunOptions, runs: int) -> tuple[dict[str, Any], list[AuditResult]]:
    """`run --runs N`: N audits into `out/run-<i>` and a one-release matrix of them in `out`."""
    if runs < 1:
        raise UsageError("--runs must be at least 1")
    check_options(opts)
    root = prepare_dir(opts.out or evidence_root() / datetime.now(UTC).strftime("%Y%m%dT%H%M%S-runs"), opts.force)
    results = []
    for i, result in run_audits(audit, replace(opts, out=root), range(1, runs + 1)):
        assert isinstance(result, AuditResult)
        results.append(result)
        progress(opts.quiet, f"run {i}/{runs}: {result.verdict.status}")
    release = results[0].versions.get("hermes-agent", "?")
    cells = [cell_of(r, release, opts.scenario, i, root) for i, r in enumerate(results, 1)]
    doc = matrix.document(plan_of([release], [opts.scenario], runs, opts.tools, opts.phases, opts.services,
                                  opts.unset), cells)
    write_matrix(root, doc)
    return doc, results

"""Repeat one audit as CI runs it, N times, and show whether its verdict against the baseline stays the same.

    .venv/bin/python bench/repeat.py --scenario oneshot [--baseline B] [--runs N] [--busy K] [--cores LIST]
        [--expect CODE] [--json FILE] [--keep] [--quick | --smoke]

Each run is `tenancy-audit run --scenario S --baseline B --out TMP/run-I --quiet` of this checkout
(`.venv/bin/tenancy-audit`, the environment passed on as it is), one after another (default 5 runs, --quick 2),
each in a fresh folder under a temp folder that is removed at the end unless `--keep`. The default baseline is
`baselines/S.json` when it exists. `--cores LIST` runs each audit under `taskset -c LIST`; `--busy K` starts K
processes spinning `while True: pass` (each in its own process group, on the same cores with --cores) before
the first run, and kills them after the last, proving with psutil that none is left.

After each run its `findings.json` is read (docs/contracts.md): the incidents (id, entry point, directions,
documented F-numbers, `new`) and the verdict. A run that leaves none (exit 2: an error) is recorded with the
last line it printed on stderr, and the next run starts. Then one table: per incident (by id) seen k/N and new
in how many runs; per run its exit code, verdict, seconds and new incidents; and one line saying whether every
run ended the same. Exits 0 when every run exited `--expect` (default 0), else 1; `--json FILE` writes the
same data. On SIGINT/SIGTERM every child is stopped (an audit writes its reports first), what ran so far is
printed, the temp folder is removed and the bench exits 128 + the signal's number (bench/children.py).

`--smoke` (what tests/test_benches.py runs, with `--scenario oneshot`): one run, the tool battery and the services
off (`--tools none --services none`: each tenant's turn is the environment probe, against its provider's stub, in
about 10 s); the same table. It proves that the bench still runs the CLI and reads what it writes, and repeats
nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import children
import psutil

from harness.core.procs import ProcessSet, Stdio, kill_group
from harness.drive.doors import SCENARIOS

REPO = Path(__file__).resolve().parent.parent
CLI = REPO / ".venv" / "bin" / "tenancy-audit"
#: Seconds an audit gets to write its reports and stop its children after a SIGTERM (a timeout, Ctrl-C).
GRACE = 120.0


@dataclass
class Incident:
    """One incident of one run, as findings.json lists it."""

    id: str
    entry: str
    documented: list[str]
    allowed: bool
    directions: list[str]
    new: bool


@dataclass
class Run:
    """One audit: its exit status, verdict (`error` without a findings.json), incidents and wall time."""

    run: int
    exit_code: int
    verdict: str
    seconds: float
    incidents: list[Incident] = field(default_factory=list)
    error: str = ""

    @property
    def new(self) -> list[str]:
        return [i.id for i in self.incidents if i.new]


@dataclass
class Tally:
    """One incident over every run: where it was seen and new, its F-numbers and directions in any run."""

    id: str
    entry: str
    documented: list[str]
    allowed: bool
    directions: list[str]
    seen: int = 0
    new: int = 0

    @property
    def label(self) -> str:
        return " ".join([",".join(self.documented), "allowed" if self.allowed else ""]).strip() or "-"


def read_run(run: int, out: Path, exit_code: int, seconds: float, stderr: str = "") -> Run:
    """The run whose evidence folder is `out`; without a readable findings.json, verdict `error` and the last
    line of `stderr`."""
    try:
        doc = json.loads((out / "findings.json").read_text())
    except (OSError, ValueError) as exc:
        lines = stderr.strip().splitlines()
        return Run(run, exit_code, "error", seconds, error=lines[-1] if lines else f"no findings.json ({exc})")
    incidents = [Incident(i["id"], i["entry"], list(i.get("documented", [])), bool(i.get("allowed", False)),
                          [f"{v or '-'}->{r or '-'}" for v, r in i["directions"]], bool(i["new"]))
                 for i in doc["incidents"]]
    return Run(run, exit_code, doc["verdict"], seconds, incidents)


def tally(runs: list[Run]) -> list[Tally]:
    """Every incident of any run, in the order first seen: in how many runs seen and new."""
    rows: dict[str, Tally] = {}
    for r in runs:
        for i in r.incidents:
            row = rows.setdefault(i.id, Tally(i.id, i.entry, [], True, []))
            row.documented += [d for d in i.documented if d not in row.documented]
            row.directions += [d for d in i.directions if d not in row.directions]
            row.allowed = row.allowed and i.allowed
            row.seen += 1
            row.new += i.new
    return list(rows.values())


def verdict_line(runs: list[Run], baseline: str) -> str:
    """`verdict against B: the same in N/N runs (exit C, VERDICT)`, or which runs ended how."""
    ends: dict[tuple[int, str], list[int]] = {}
    for r in runs:
        ends.setdefault((r.exit_code, r.verdict), []).append(r.run)
    head = f"verdict against {baseline}:"
    if len(ends) == 1:
        (code, verdict), = ends
        return f"{head} the same in {len(runs)}/{len(runs)} runs (exit {code}, {verdict})"
    parts = [f"exit {code} ({verdict}) in run{'s' * (len(nums) > 1)} {', '.join(map(str, nums))}"
             for (code, verdict), nums in sorted(ends.items(), key=lambda kv: -len(kv[1]))]
    return f"{head} differed: {'; '.join(parts)}"


def table(runs: list[Run], baseline: str) -> list[str]:
    """The incidents, the runs and the verdict line."""
    n = len(runs)
    rows = tally(runs)
    width = max([len("entry"), *(len(t.entry) for t in rows)])
    lines = [f"{'incident':16}  {'entry':{width}}  {'documented':10}  {'seen':>5}  {'new':>5}  directions"]
    lines += [f"{t.id:16}  {t.entry:{width}}  {t.label:10}  {f'{t.seen}/{n}':>5}  {f'{t.new}/{n}':>5}  "
              f"{', '.join(t.directions)}" for t in rows] or ["(no incident in any run)"]
    lines += ["", f"{'run':>3}  {'exit':>4}  {'verdict':12}  {'seconds':>7}  new incidents"]
    lines += [f"{r.run:3d}  {r.exit_code:4d}  {r.verdict:12}  {r.seconds:7.1f}  "
              + (", ".join(r.new) or "-") + (f"  [{r.error}]" if r.error else "") for r in runs]
    return [*lines, "", verdict_line(runs, baseline)]


def to_json(runs: list[Run], plan: dict[str, Any], status: int) -> dict[str, Any]:
    """The table's data for --json: the plan, the incidents, the runs, the verdict line."""
    return {"plan": plan, "incidents": [{**asdict(t), "runs": len(runs)} for t in tally(runs)],
            "runs": [{**asdict(r), "new": r.new} for r in runs], "summary": verdict_line(runs, plan["baseline"]),
            "same": len({(r.exit_code, r.verdict) for r in runs}) == 1, "exit_code": status}


class Survivors(Exception):
    """A busy loop outlived its SIGKILL."""


@contextmanager
def busy_loops(procs: ProcessSet, count: int, pin: list[str]) -> Iterator[None]:
    """`count` children spinning on the CPU (each its own process group) while the body runs; afterwards
    SIGKILLed, and proven gone with psutil (`Survivors` otherwise)."""
    loops = [procs.spawn([*pin, sys.executable, "-c", "while True: pass"], env=dict(os.environ))
             for _ in range(count)]
    if loops:
        print(f"busy loops: {count} started (pids {', '.join(str(p.pid) for p in loops)})", file=sys.stderr)
    try:
        yield
    finally:
        for p in loops:
            kill_group(p.pid)
            with suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        groups = {p.pid for p in loops}
        left = [p.pid for p in psutil.process_iter() if _in_groups(p, groups)]
        if left:
            raise Survivors(f"busy loop process(es) {left} survived SIGKILL")
        if loops:
            print(f"busy loops: {count} stopped; psutil finds no process left in their groups", file=sys.stderr)


def _in_groups(proc: psutil.Process, groups: set[int]) -> bool:
    try:
        return os.getpgid(proc.pid) in groups and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, OSError):
        return False


def audit(procs: ProcessSet, argv: list[str], out: Path, timeout: float) -> tuple[int, str, float]:
    """Run one audit to its end (SIGTERM at `timeout`, then GRACE); its exit status, stderr and wall time. Its
    stdout and stderr are kept beside its folder (`run-I.stdout`, `run-I.stderr`)."""
    t = time.monotonic()
    with open(out.with_suffix(".stdout"), "wb") as so, open(out.with_suffix(".stderr"), "wb+") as se:
        proc = procs.spawn([*argv, "--out", str(out)], env=dict(os.environ), stdio=Stdio(stdout=so, stderr=se))
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid, signal.SIGTERM)
            try:
                code = proc.wait(timeout=GRACE)
            except subprocess.TimeoutExpired:
                kill_group(proc.pid)
                code = proc.wait()
            se.write(f"\nrepeat.py: stopped at --timeout {timeout:g} s\n".encode())
        seconds = round(time.monotonic() - t, 2)
        se.seek(0)
        return code, se.read().decode(errors="replace"), seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    ap.add_argument("--baseline", type=Path, help="default: baselines/SCENARIO.json when it exists")
    ap.add_argument("--runs", type=int, help="audits, one after another (default 5; --quick: 2)")
    ap.add_argument("--busy", type=int, default=0, metavar="K", help="K busy loops beside the audits")
    ap.add_argument("--cores", metavar="LIST", help="run the audits (and busy loops) under taskset -c LIST")
    ap.add_argument("--expect", type=int, default=0, metavar="CODE", help="the exit code every run must have")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per audit (then SIGTERM)")
    ap.add_argument("--json", type=Path, metavar="FILE", help="also write the table's data as JSON")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder with every run's evidence")
    ap.add_argument("--quick", action="store_true", help="2 runs")
    ap.add_argument("--smoke", action="store_true", help="1 run without the tool battery and the services")
    a = ap.parse_args(argv)
    runs = a.runs or (1 if a.smoke else 2 if a.quick else 5)
    if runs < 1 or a.busy < 0:
        ap.error("--runs must be at least 1 and --busy at least 0")
    if a.cores and not shutil.which("taskset"):
        ap.error("--cores needs taskset (util-linux)")
    if not CLI.exists():
        ap.error(f"{CLI} is missing: bootstrap the checkout first (./tenancy test)")
    baseline = a.baseline or REPO / "baselines" / f"{a.scenario}.json"
    if a.baseline is None and not baseline.exists():
        baseline = None
    elif not baseline.is_file():
        ap.error(f"no baseline file {baseline}")
    pin = ["taskset", "-c", a.cores] if a.cores else []
    command = [*pin, str(CLI), "run", "--scenario", a.scenario, "--quiet"]
    if a.smoke:
        command += ["--tools", "none", "--services", "none"]
    if baseline is not None:
        command += ["--baseline", str(baseline.resolve())]
    shown = _shown(baseline)
    plan = {"scenario": a.scenario, "baseline": shown, "runs": runs, "busy": a.busy, "cores": a.cores,
            "expect": a.expect, "command": [*command, "--out", "TMP/run-I"]}
    return children.run(lambda procs: repeat(procs, a, plan, command, pin), grace=GRACE)


def repeat(procs: ProcessSet, a: argparse.Namespace, plan: dict[str, Any], command: list[str],
           pin: list[str]) -> int:
    """The runs of `plan`, then the table (also when a signal stops them: what ran so far)."""
    done: list[Run] = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-repeat-"))
    print(f"repeat: {' '.join(plan['command'])}, {plan['runs']} runs, {a.busy} busy loop(s)", file=sys.stderr)
    try:
        with busy_loops(procs, a.busy, pin):
            for i in range(1, plan["runs"] + 1):
                out = tmp / f"run-{i}"
                code, stderr, seconds = audit(procs, command, out, a.timeout)
                done.append(read_run(i, out, code, seconds, stderr))
                r = done[-1]
                print(f"run {i}/{plan['runs']}: exit {code}, {r.verdict}, {len(r.new)} new incident(s), "
                      f"{seconds:.1f} s" + (f" [{r.error}]" if r.error else ""), file=sys.stderr, flush=True)
    except children.Interrupted:
        if done:
            print("\n".join([f"(stopped after {len(done)} of {plan['runs']} runs)", *table(done, plan["baseline"])]))
        raise
    except Survivors as exc:
        print(f"repeat.py: {exc}", file=sys.stderr)
        return 2
    finally:
        procs.close(GRACE)  # an interrupted audit writes its reports before its folder goes
        if a.keep:
            print(f"evidence kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    status = 0 if all(r.exit_code == a.expect for r in done) else 1
    print("\n".join(table(done, plan["baseline"])))
    if a.json:
        a.json.write_text(json.dumps(to_json(done, plan, status), indent=2) + "\n")
    return status


def _shown(baseline: Path | None) -> str:
    """The baseline as the table names it: relative to the checkout when inside it."""
    if baseline is None:
        return "no baseline"
    path = baseline.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


if __name__ == "__main__":
    sys.exit(main())

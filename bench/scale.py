"""Cost as the work grows: tui audits of more and more tenants, and of longer and longer conversations, each in a
fresh worker process, with what each part of the audit spent.

    .venv/bin/python bench/scale.py [--tenants 2,4,8,16] [--turns 1,4,16] [--svg FILE] [--smoke]

Every audit is `run.run_audit` (scenario tui, the default battery, services and phases) in a worker of its own
(`python bench/scale.py --worker TENANTS TURNS OUT`), so that each process's peak memory is that audit's. First one
audit per tenant count (one turn each), then one per `--turns` count of 2 tenants (each turn resends the tenant's
whole conversation so far: the conversation grows). Per audit:

- wall time, and CPU time: the harness (its own process: the drivers, the stubs, reconcile, the reports; of it
  `judge.evaluate`, reconcile and the verdict, and the reports, each timed by wrapping what `run_audit` calls),
  mitmdump (the proxy and the addon, read from /proc just before the audit stops it) and Hermes (every other
  child: Hermes' processes and their tools; the children's CPU time the kernel accounts to the worker once each
  was waited for, less mitmdump's);
- the peak memory (VmHWM) of the harness and of mitmdump;
- the flows and the bytes the proxy inspected (the ledger's request and response bytes), and the findings.

Then the audit's own cost (harness and mitmdump: everything but Hermes) over the work, drawn into `--svg FILE` (a
hand-written SVG, `scale_svg.py`: the harness venv has no plotting library). The machine is shared: read the ratios
between rows, not the seconds.

`--smoke` (what tests/test_benches.py runs): one audit of 2 tenants without the tool battery and the services,
the same table; its figures prove that the bench still drives an audit and reads every part's cost.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import children
import psutil
import scale_svg

from harness import options, run
from harness.capture import proxy
from harness.core.procs import ProcessSet

ROW = "{tenants:>7} {turns:>5} {wall:>7.1f} {harness_cpu:>8.2f} {judge_cpu:>8.2f} {reports_cpu:>8.2f} " \
      "{mitmdump_cpu:>8.2f} {hermes_cpu:>7.1f} {harness_mib:>8.0f} {mitmdump_mib:>8.0f} {flows:>6} {mb:>6.1f} " \
      "{findings:>8} {audit_ms:>7.0f}"
HEAD = (f"{'tenants':>7} {'turns':>5} {'wall s':>7} {'harness':>8} {'of it:':>8} {'reports':>8} {'mitmdump':>8} "
        f"{'Hermes':>7} {'harness':>8} {'mitmdump':>8} {'flows':>6} {'MB':>6} {'findings':>8} {'audit':>7}\n"
        f"{'':>7} {'':>5} {'':>7} {'CPU s':>8} {'judge':>8} {'CPU s':>8} {'CPU s':>8} {'CPU s':>7} "
        f"{'peak MiB':>8} {'peak MiB':>8} {'':>6} {'':>6} {'':>8} {'ms/MB':>7}")


def _peak_mib(pid: int) -> float:
    """A process's peak resident memory (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def worker(tenants: int, turns: int, out: Path, smoke: bool) -> dict[str, Any]:
    """One audit in this process: what it cost each part (see the module's docstring)."""
    seen: dict[str, float] = {}
    stop = proxy.Proxy.stop

    def stopping(self: proxy.Proxy, *args: Any, **kwargs: Any) -> int | None:
        if self.proc is not None and self.proc.poll() is None:  # mitmdump and its scan workers, before they exit
            tree = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
            seen.update(mitmdump_cpu=sum(map(_cpu, tree)), mitmdump_mib=_peak_mib(self.proc.pid))
        return stop(self, *args, **kwargs)

    def cpu_of(fn: Any, key: str) -> Any:  # the harness's CPU time in a step (the stubs and drivers are done by then)
        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                seen[key] = seen.get(key, 0.0) + time.process_time() - began
        return timed

    proxy.Proxy.stop = stopping  # type: ignore[method-assign]
    run.evaluate, run.write_reports = cpu_of(run.evaluate, "judge_cpu"), cpu_of(run.write_reports, "reports_cpu")
    began, mine, kids = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF), \
        resource.getrusage(resource.RUSAGE_CHILDREN)
    extra: dict[str, Any] = {"tools": [], "services": []} if smoke else {}
    result = run.run_audit(options.RunOptions(scenario="tui", tenants=tenants, turns=turns, out=out, quiet=True,
                                              **extra))
    wall = time.perf_counter() - began
    mine2, kids2 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.verdict.status not in ("clean", "leak"):
        raise RuntimeError(f"the audit of {tenants} tenants was {result.verdict.status} (evidence in {out})")
    lines = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    children_cpu = (kids2.ru_utime + kids2.ru_stime) - (kids.ru_utime + kids.ru_stime)
    return {"tenants": tenants, "turns": turns, "wall": wall,
            "harness_cpu": (mine2.ru_utime + mine2.ru_stime) - (mine.ru_utime + mine.ru_stime),
            "mitmdump_cpu": seen["mitmdump_cpu"], "hermes_cpu": children_cpu - seen["mitmdump_cpu"],
            "judge_cpu": seen["judge_cpu"], "reports_cpu": seen["reports_cpu"],
            "findings": len(result.verdict.findings) + len(result.verdict.known) + len(result.verdict.allowed),
            "harness_mib": mine2.ru_maxrss / 1024, "mitmdump_mib": seen["mitmdump_mib"], "flows": len(lines),
            "mb": sum((e["request_bytes"] or 0) + (e["response_bytes"] or 0) for e in lines) / 1e6,
            "verdict": result.verdict.status}


def audit(procs: ProcessSet, tenants: int, turns: int, root: Path, smoke: bool) -> dict[str, Any]:
    """One audit in a fresh worker: its figures (and the audit's own cost per MB the proxy inspected)."""
    argv = [sys.executable, __file__, "--worker", str(tenants), str(turns), str(root / f"audit-{tenants}-{turns}")]
    code, out, err = procs.run([*argv, *(["--smoke"] if smoke else [])], env=dict(os.environ), cwd=None,
                               timeout=3600)
    if code != 0:
        raise RuntimeError(f"the audit of {tenants} tenants, {turns} turns failed (exit {code}): {err[-2000:]}")
    row = json.loads(out.strip().splitlines()[-1])
    row["audit_ms"] = 1000 * (row["harness_cpu"] + row["mitmdump_cpu"]) / max(row["mb"], 1e-9)
    print(ROW.format(**row), flush=True)
    return row


def growth(rows: list[dict[str, Any]], by: str) -> str:
    """The audit's own CPU (harness and mitmdump) and the bytes inspected at each point, over the first point's."""
    first = rows[0]
    own = first["harness_cpu"] + first["mitmdump_cpu"]
    parts = [f"{r[by]} {by}: x{(r['harness_cpu'] + r['mitmdump_cpu']) / own:.2f} CPU, x{r['mb'] / first['mb']:.2f} MB, "
             f"x{r['flows'] / first['flows']:.2f} flows" for r in rows[1:]]
    return f"against {first[by]} {by}: " + "; ".join(parts) if parts else "one point only"


def bench(a: argparse.Namespace, procs: ProcessSet) -> int:
    began = time.perf_counter()
    counts = [2] if a.smoke else [int(x) for x in a.tenants.split(",")]
    turns = [] if a.smoke else [int(x) for x in a.turns.split(",") if int(x) != 1]
    print(f"{os.cpu_count()} CPUs, load " + " ".join(f"{x:.1f}" for x in os.getloadavg())
          + ("; smoke: no tool battery, no services" if a.smoke else ""))
    print(HEAD)
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        by_tenants = [audit(procs, n, 1, Path(tmp), a.smoke) for n in counts]
        by_turns = [by_tenants[0], *(audit(procs, counts[0], t, Path(tmp), a.smoke) for t in turns)]
        print(f"\nthe audit's own cost (harness and mitmdump CPU), {growth(by_tenants, 'tenants')}")
        print(f"the audit's own cost at {counts[0]} tenants, {growth(by_turns, 'turns')}")
        svg = a.svg or Path(tmp) / "scale.svg"
        svg.write_text(scale_svg.plot(by_tenants, by_turns))
        print(f"plot: {svg.stat().st_size} bytes" + (f" in {svg}" if a.svg else ""))
    print(f"wall time {time.perf_counter() - began:.0f} s; load " + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tenants", default="2,4,8,16", help="tenant counts, one turn each (default 2,4,8,16)")
    ap.add_argument("--turns", default="1,4,16", help="turn counts of the first tenant count (default 1,4,16)")
    ap.add_argument("--svg", type=Path, help="draw the audit's own cost into this SVG file")
    ap.add_argument("--smoke", action="store_true", help="one audit of 2 tenants without the battery and services")
    ap.add_argument("--worker", nargs=3, metavar=("TENANTS", "TURNS", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        tenants, turns, out = a.worker
        print(json.dumps(worker(int(tenants), int(turns), Path(out), a.smoke)))
        return 0
    return children.run(lambda procs: bench(a, procs))


if __name__ == "__main__":
    sys.exit(main())

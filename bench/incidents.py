"""Reconcile an evidence folder with and without building its incidents, side by side.

    .venv/bin/python bench/incidents.py EVIDENCE [--quick | --smoke] [--rounds N]

After one untimed warm-up (the matcher is built once per registry and cached), each round judges the folder
twice, in alternating order: A is `judge.evaluate` (what `tenancy-audit reconcile` does before it writes the
reports), B the same and then its incidents (`detect.incidents.build` and the F-number links: what every
report reads). Inside B the incident building is also timed on its own, which is the figure to watch: its
median share of A's median must stay under 5 %. The median of each round's B / A is printed too; on a shared
machine its noise can exceed the building itself. `--quick`: 2 rounds (default 5). `--smoke` (what
tests/test_benches.py runs, on the recorded one-shot evidence of tests/data/scenarios): 1 round, the same figures,
too few rounds to read.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from harness.core.record import RunRecord
from harness.judge import evaluate


def _reconcile(out: Path, record: RunRecord) -> float:
    """A: the folder's verdict, findings and fingerprints, from its files."""
    started = time.perf_counter()
    evaluate(out, record, None)
    return time.perf_counter() - started


def _with_incidents(out: Path, record: RunRecord) -> tuple[float, float, int, int]:
    """B: A, then its incidents; (B's seconds, the building's seconds, findings, incidents)."""
    started = time.perf_counter()
    result = evaluate(out, record, None)
    built = time.perf_counter()
    incidents = result.incidents
    done = time.perf_counter()
    return done - started, done - built, len(result.verdict.findings), len(incidents)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("evidence", type=Path, help="an evidence folder of `tenancy-audit run`")
    ap.add_argument("--quick", action="store_true", help="2 rounds")
    ap.add_argument("--smoke", action="store_true", help="1 round")
    ap.add_argument("--rounds", type=int, help="rounds (default 5; --quick 2, --smoke 1)")
    a = ap.parse_args(argv)
    rounds = a.rounds or (1 if a.smoke else 2 if a.quick else 5)
    record = RunRecord.read(a.evidence)
    _reconcile(a.evidence, record)  # warm-up: builds and caches the registry's matcher
    plain: list[float] = []
    full: list[float] = []
    building: list[float] = []
    counts = (0, 0)
    for n in range(rounds):
        for job in ("A", "B") if n % 2 == 0 else ("B", "A"):
            if job == "A":
                plain.append(_reconcile(a.evidence, record))
            else:
                seconds, build, *found = _with_incidents(a.evidence, record)
                full.append(seconds)
                building.append(build)
                counts = (found[0], found[1])
        print(f"round {n + 1}/{rounds}: A {plain[-1]:.3f} s, B {full[-1]:.3f} s (incidents {building[-1]:.3f} s)",
              file=sys.stderr)
    a_med, b_med, build_med = (statistics.median(x) for x in (plain, full, building))
    print(f"{a.evidence}: {counts[0]} findings, {counts[1]} incidents, {rounds} rounds (medians)")
    print(f"A reconcile                 {a_med:8.3f} s")
    paired = statistics.median(b / a for a, b in zip(plain, full, strict=True)) - 1
    print(f"B reconcile + incidents     {b_med:8.3f} s   (per round B / A: {paired:+.1%})")
    print(f"building the incidents      {build_med:8.3f} s   ({build_med / a_med:.2%} of A)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""bench/scan.py --ref: this tree's scanner against a git ref's on the same corpus and registry, side by side (a
worker per tree, bench/ab.py)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import ab
from scan_fresh import fresh, mbps

from harness.core.procs import ProcessSet

#: `--ref`: every job both trees run in a round (label: job, its arguments); see bench/ab.py.
REF_JOBS: dict[str, tuple[str, dict[str, Any]]] = {
    "Matcher build": ("scan_build", {}),
    "Matcher.find": ("scan_find", {"prefilter": True}),
    "Matcher.find without the prefilter": ("scan_find", {"prefilter": False}),
    "scan_tree": ("scan_tree", {}),
}


def compare(procs: ProcessSet, ref: str, regfile: Path, corpus: Path, total: int, rounds: int,
            fresh_runs: int) -> None:
    """This tree's scanner against `ref`'s on the same corpus and registry, side by side: a worker per tree;
    each round runs every job in both, one right after the other, in an order flipped every round. Then
    `scan_tree` in `fresh_runs` fresh processes per tree, alternating: MB/s and peak RSS."""
    with ab.ref_tree(ref) as tree:
        sides = (ab.Worker(procs, ab.REPO, "new"), ab.Worker(procs, tree, ref))
        for side in sides:
            side.call("scan_load", corpus=str(corpus), registry=str(regfile))
        seconds: dict[str, tuple[list[float], list[float]]] = {label: ([], []) for label in REF_JOBS}
        found: dict[str, list[int]] = {}
        for r in range(rounds):
            for label, (job, kwargs) in REF_JOBS.items():
                for i in (0, 1) if r % 2 == 0 else (1, 0):
                    reply = sides[i].call(job, **kwargs)
                    seconds[label][i].append(reply["seconds"])
                    found.setdefault(label, [0, 0])[i] = reply.get("hits", reply.get("findings", 0))
        for side in sides:
            side.close()
        runs = fresh(procs, [("new", ab.REPO), (ref, tree)], regfile, corpus, fresh_runs)
    print(f"\nside by side with {ref} ({rounds} rounds; a find pass repeated for {ab.MIN_SECONDS} s, timed per pass)")
    print(f"{'job':36} {'new ms':>9} {'old ms':>9}  {'new/old':>7}  [lowest, highest]  found new/old")
    for label, (new, old) in seconds.items():
        ratios = [n / o for n, o in zip(new, old, strict=True)]
        print(f"{label:36} {statistics.median(new) * 1e3:9.2f} {statistics.median(old) * 1e3:9.2f}  "
              f"{statistics.median(ratios):6.2f}x  [{min(ratios):.2f}, {max(ratios):.2f}]  "
              f"{found[label][0]}/{found[label][1]}" + ("" if found[label][0] == found[label][1] else "  DIFFERENT"))
    print(f"\nscan_tree in a fresh process per run (the fastest of {fresh_runs} each, alternating; the matcher is "
          "built first, its automata count in the peak RSS)")
    print(f"{'tree':12} {'MB/s':>8} {'peak RSS MiB':>13} {'findings':>9}")
    for name, r in runs.items():
        print(f"{name:12} {mbps(total, r['seconds']):8.1f} {r['rss_mib']:13.0f} {r['found']:9.0f}")
    print(f"new/{ref} MB/s: {runs[ref]['seconds'] / runs['new']['seconds']:.2f}x")

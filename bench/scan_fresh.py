"""bench/scan.py's scans in a fresh process (bench/ab.py's `scan_fresh` in a new worker each run): `scan_tree`
over the corpus and `scan_file` over a sparse file, with the worker's peak RSS (the matcher's automata included)."""

from __future__ import annotations

from pathlib import Path

import ab
from scan_corpus import make_sparse

from harness.core.procs import ProcessSet
from harness.core.registry import Registry


def mbps(nbytes: int, seconds: float) -> float:
    return nbytes / 1e6 / seconds


#: Runs of `scan_fresh` (a fresh process each) per tree: the fastest is reported, and the highest peak RSS.
FRESH_RUNS = 3


def fresh(procs: ProcessSet, trees: list[tuple[str, Path]], registry: Path, target: Path,
          runs: int = FRESH_RUNS) -> dict[str, dict[str, float]]:
    """`scan_fresh` on `target`, each run in a new worker, the trees in turn (order flipped every run): per
    tree, the fastest run's seconds, the highest peak RSS and what was found."""
    best: dict[str, dict[str, float]] = {}
    for r in range(runs):
        for name, tree in trees if r % 2 == 0 else trees[::-1]:
            worker = ab.Worker(procs, tree, name)
            try:
                reply = worker.call("scan_fresh", target=str(target), registry=str(registry))
            finally:
                worker.close()
            b = best.setdefault(name, {"seconds": float("inf"), "rss_mib": 0.0, "found": reply["found"]})
            b["seconds"] = min(b["seconds"], reply["seconds"])
            b["rss_mib"] = max(b["rss_mib"], reply["rss_mib"])
    return best


def sparse_case(procs: ProcessSet, reg: Registry, registry: Path, work: Path, gib: float) -> bool:
    """`scan_file` over a `gib` GiB sparse file with a key near its end, in a fresh process of this tree:
    MB/s and peak RSS. Whether the key was found."""
    path = work / "sparse.bin"
    make_sparse(path, gib, next(iter(reg)).key)
    try:
        r = fresh(procs, [("new", ab.REPO)], registry, path, runs=1)["new"]
    finally:
        path.unlink()
    ok = r["found"] == 1
    print(f"\nscan_file over a {gib:g} GiB sparse file (the key 1 MiB before its end), a fresh process:")
    print(f"  {mbps(int(gib * (1 << 30)), r['seconds']):.1f} MB/s, peak RSS {r['rss_mib']:.0f} MiB, "
          + ("the key found" if ok else f"KEY NOT FOUND ({r['found']} hits)"))
    return ok

"""Benchmark the scanner against the naive loop and ripgrep on one generated corpus, in one run.

    python bench/scan.py [--quick | --smoke] [--mib 256] [--tenants 64] [--naive-mib 8] [--keep DIR]
        [--ref REF [--rounds N]] [--sparse-gib 4]

64 tenants x 12 canaries x every encoding form (the matcher's patterns) over a corpus of realistic files:
SQLite databases (messages + FTS5, as Hermes's state.db), JSONL logs, gzip-rotated logs and binary blobs,
with a few hundred canaries planted in assorted encodings. Prints MB/s of

- `Matcher.find` over every file's bytes (the one-pass automaton; files read beforehand),
- the naive loop (`for pattern in patterns: data.find(pattern)` repeatedly) over the first `--naive-mib`
  MiB of the same corpus (it is too slow for all of it; the rate is what is compared),
- `rg -F -a -f patterns` over the corpus directory (files from the page cache; default threads and -j1),
- `scan_tree` (the whole scanner: streams decompressed, SQLite cells read logically), in a fresh process per
  run (bench/ab.py's `scan_fresh`, the fastest of 3) with its peak RSS (the matcher's automata included),

and the ratios side by side; then build and scan time versus tenants (8, 64, 512) and versus corpus size; then
`scan_file` over a sparse file of `--sparse-gib` GiB (default 4, 0 skips it; nothing is written but a key
1 MiB before its end, so it costs no disk), in a fresh process: MB/s and peak RSS; the key must be found.
`--quick`: a 32 MiB corpus, the naive loop on 1 MiB, 8 and 64 tenants. `--smoke` (what tests/test_benches.py
runs, also with `--ref HEAD`) takes seconds: a 4 MiB corpus of 8 tenants, the naive loop on 1 MiB, one fresh
process per tree, one round, 8 tenants in the second table and a 0.25 GiB sparse file. It proves that every part
of the bench still runs against this harness (the sparse file's key must be found); its rates are not worth
reading (one run; a corpus that small is mostly the matcher's fixed costs).

`--ref REF` (a regression check) prints instead this tree's scanner against REF's on the same corpus and
registry, side by side: REF in a temp `git worktree`, one worker per tree (bench/ab.py), each round every job
in both right after each other (order flipped every round): Matcher build, `Matcher.find` with and without
the prefilter, `scan_tree`; the median new/old time ratio and the lowest and highest round. Then `scan_tree`
in a fresh process per run, 3 runs per tree alternating: each tree's best MB/s and peak RSS; and the sparse
file with this tree only (a tree from before streaming reads a file whole: 4 GiB of memory). Every child (rg,
the workers) is stopped on SIGTERM/SIGINT (bench/children.py).

The parts: `scan_corpus.py` makes the registry, the corpus and the sparse file, `scan_fresh.py` runs a scan in a
fresh process, `scan_ref.py` is `--ref`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import ab
import children
from scan_corpus import MiB, make_corpus, make_registry, patterns_of
from scan_fresh import FRESH_RUNS, fresh, mbps, sparse_case
from scan_ref import compare

from harness.core.procs import ProcessSet
from harness.detect.engine.matcher import Matcher

#: The corpus's seed with `--smoke` (1 otherwise): at 4 MiB its files are of every kind (JSONL, gzip-rotated,
#: SQLite, binary), which seed 1 gives only from about 16 MiB on.
SMOKE_SEED = 6

def bench_matcher(matcher: Matcher, blobs: list[bytes]) -> tuple[float, int]:
    t = time.perf_counter()
    hits = sum(len(matcher.find(b)) for b in blobs)
    return time.perf_counter() - t, hits


def bench_naive(patterns: list[bytes], data: bytes) -> tuple[float, int]:
    t = time.perf_counter()
    hits = 0
    for p in patterns:
        pos = data.find(p)
        while pos >= 0:
            hits += 1
            pos = data.find(p, pos + 1)
    return time.perf_counter() - t, hits


def bench_rg(procs: ProcessSet, patterns: list[bytes], corpus: Path,
             threads: int | None) -> tuple[float, float, int] | None:
    """(seconds, of which start-up (compiling the patterns: the least of 3 runs on an empty file), matches);
    every `rg` a child in `procs`."""
    rg = shutil.which("rg")
    if rg is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        pat, empty = Path(tmp) / "patterns", Path(tmp) / "empty"
        pat.write_bytes(b"\n".join(patterns) + b"\n")
        empty.write_bytes(b"")
        cmd = [rg, "-F", "-a", "--no-ignore", "--hidden", "--count-matches", "-f", str(pat)]
        if threads:
            cmd += ["-j", str(threads)]
        startup = float("inf")
        env = dict(os.environ)
        for _ in range(3):  # the least of three: start-up is noisy
            t = time.perf_counter()
            procs.run([*cmd, str(empty)], env=env, cwd=None, timeout=60)
            startup = min(startup, time.perf_counter() - t)
        t = time.perf_counter()
        code, out, err = procs.run([*cmd, str(corpus)], env=env, cwd=None, timeout=600)
        elapsed = time.perf_counter() - t
    if code not in (0, 1):
        raise RuntimeError(f"rg failed ({code}): {err[:300]}")
    hits = sum(int(line.rsplit(":", 1)[1]) for line in out.splitlines() if line)
    return elapsed, startup, hits


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="32 MiB, the naive loop on 1 MiB, 8 and 64 tenants")
    ap.add_argument("--smoke", action="store_true", help="seconds: 4 MiB, 8 tenants, one run of each part")
    ap.add_argument("--mib", type=int, help="corpus size in MiB (default 256, --quick 32)")
    ap.add_argument("--tenants", type=int, help="tenants of the registry (default 64, --smoke 8)")
    ap.add_argument("--naive-mib", type=int, help="MiB of the corpus the naive loop scans (default 8, --quick 1)")
    ap.add_argument("--keep", type=Path, help="generate the corpus here and keep it")
    ap.add_argument("--ref", help="instead of the tables: this tree's scanner against that git ref's, side by side")
    ap.add_argument("--rounds", type=int, help="--ref: rounds (default 9, --quick 7, --smoke 1)")
    ap.add_argument("--sparse-gib", type=float, help="size of the sparse-file case in GiB (default 4, --smoke 0.25; "
                    "0: skip it)")
    a = ap.parse_args(argv)
    return children.run(lambda procs: bench(a, procs))


def bench(a: argparse.Namespace, procs: ProcessSet) -> int:
    mib = a.mib or (4 if a.smoke else 32 if a.quick else 256)
    naive_mib = a.naive_mib or (1 if a.quick or a.smoke else 8)
    tenants = a.tenants or (8 if a.smoke else 64)
    sparse_gib = (0.25 if a.smoke else 4) if a.sparse_gib is None else a.sparse_gib
    runs = 1 if a.smoke else FRESH_RUNS
    work = Path(tempfile.mkdtemp(prefix="bench-scan-"))
    try:
        reg = make_registry(tenants, work)
        patterns = patterns_of(reg)
        corpus = a.keep or work / "corpus"
        t = time.perf_counter()
        files = make_corpus(corpus, mib, reg, seed=SMOKE_SEED if a.smoke else 1)
        blobs = [p.read_bytes() for p in files]
        total = sum(map(len, blobs))
        kinds = {p.parent.name for p in files}
        print(
            f"corpus: {len(files)} files ({', '.join(sorted(kinds))}), {total / MiB:.1f} MiB, "
            f"generated in {time.perf_counter() - t:.1f}s"
        )
        canaries = sum(len(t.all_canaries()) for t in reg)
        print(
            f"registry: {tenants} tenants x {canaries // tenants} canaries = {canaries}, "
            f"{len(patterns)} encoded patterns"
        )
        regfile = work / "registry.yaml"
        reg.save(regfile)
        if a.ref:
            compare(procs, a.ref, regfile, corpus, total, a.rounds or (1 if a.smoke else 7 if a.quick else 9), runs)
            return 0 if not sparse_gib or sparse_case(procs, reg, regfile, work, sparse_gib) else 1

        t = time.perf_counter()
        matcher = Matcher.for_registry(reg)
        build = time.perf_counter() - t
        ours, our_hits = bench_matcher(matcher, blobs)
        unfiltered, unfiltered_hits = bench_matcher(Matcher.for_registry(reg, prefilter=False), blobs)
        share = min(1.0, naive_mib * MiB / total)  # the same share of every file: every file type
        naive_data = b"".join(b[: int(len(b) * share)] for b in blobs)
        naive, naive_hits = bench_naive(patterns, naive_data)
        _, slice_hits = bench_matcher(matcher, [naive_data])
        rg_multi = bench_rg(procs, patterns, corpus, None)
        rg_one = bench_rg(procs, patterns, corpus, 1)
        tree = fresh(procs, [("new", ab.REPO)], regfile, corpus, runs)["new"]

        ours_rate = mbps(total, ours)
        rows = [
            ("Matcher.find (1 thread)", ours_rate, f"{our_hits} hits, build {build:.2f}s"),
            ("  the same without the marker prefilter", mbps(total, unfiltered), f"{unfiltered_hits} hits"),
            (
                f"naive data.find loop ({naive_mib} MiB)",
                mbps(len(naive_data), naive),
                f"{naive_hits} hits (Matcher.find on the same slice: {slice_hits})",
            ),
        ]
        for label, res in ((f"rg -F -a ({os.cpu_count()} threads)", rg_multi), ("rg -F -a -j1", rg_one)):
            if res is not None:
                elapsed, startup, matches = res
                rows.append(
                    (
                        label,
                        mbps(total, elapsed - startup),
                        f"{matches} matches; {elapsed:.2f}s incl. {startup:.2f}s start-up (excluded)",
                    )
                )
        rows.append(
            (
                "scan_tree (streams + SQLite cells)",
                mbps(total, tree["seconds"]),
                f"{tree['found']:.0f} secret findings (owner None); peak RSS {tree['rss_mib']:.0f} MiB "
                f"(a fresh process, the fastest of {runs})",
            )
        )
        print(f"\n{'scanner':44} {'MB/s':>9} {'ours is':>9}  notes")
        for label, rate, note in rows:
            print(f"{label:44} {rate:9.1f} {ours_rate / rate:8.2f}x  {note}")
        if rg_multi is None:
            print("ripgrep not installed (apt-get install -y ripgrep)")
        print(f"\nsample check: naive found {naive_hits} pattern occurrences, Matcher.find {slice_hits} canaries")

        print("\ntenants  patterns  build s  find MB/s (whole corpus)  without the prefilter")
        for n in (8,) if a.smoke else (8, 64) if a.quick else (8, 64, 512):
            r = make_registry(n, work / f"r{n}")
            t = time.perf_counter()
            m = Matcher.for_registry(r)
            b = time.perf_counter() - t
            s, _ = bench_matcher(m, blobs)
            u, _ = bench_matcher(Matcher.for_registry(r, prefilter=False), blobs)
            print(f"{n:7d} {len(m._patterns):9d} {b:8.2f} {mbps(total, s):10.1f} {mbps(total, u):21.1f}")

        print("\ncorpus MiB  find s  MB/s")
        joined = b"".join(blobs)
        for frac in (8, 4, 2, 1):
            part = joined[: len(joined) // frac]
            s, _ = bench_matcher(matcher, [part])
            print(f"{len(part) / MiB:10.1f} {s:7.2f} {mbps(len(part), s):6.1f}")
        if sparse_gib and not sparse_case(procs, reg, regfile, work, sparse_gib):
            return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

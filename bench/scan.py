"""Benchmark the scanner against the naive loop and ripgrep on one generated corpus, in one run.

    python bench/scan.py [--quick] [--mib 256] [--tenants 64] [--naive-mib 8] [--keep DIR] [--ref REF [--rounds N]]
        [--sparse-gib 4]

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
`--quick`: a 32 MiB corpus, the naive loop on 1 MiB, 8 and 64 tenants.

`--ref REF` (a regression check) prints instead this tree's scanner against REF's on the same corpus and
registry, side by side: REF in a temp `git worktree`, one worker per tree (bench/ab.py), each round every job
in both right after each other (order flipped every round): Matcher build, `Matcher.find` with and without
the prefilter, `scan_tree`; the median new/old time ratio and the lowest and highest round. Then `scan_tree`
in a fresh process per run, 3 runs per tree alternating: each tree's best MB/s and peak RSS; and the sparse
file with this tree only (a tree from before streaming reads a file whole: 4 GiB of memory). Every child (rg,
the workers) is stopped on SIGTERM/SIGINT (bench/children.py).
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import os
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ab
import children

from harness.core.procs import ProcessSet
from harness.core.registry import Registry, mint
from harness.detect.engine.matcher import Matcher, encodings_of

MiB = 1 << 20
EXTRA_KINDS = ("session_id", "gateway_token", "upload_note")  # 9 minted + 3 = 12 canaries per tenant
_VOCAB = (
    "the agent called tool terminal with arguments and returned output while reading file config yaml "
    "memory session gateway cron prompt user assistant system provider model stream token usage error "
    "retry backoff websocket frame request response header body json schema"
)
WORDS = tuple(_VOCAB.split())


def make_registry(n: int, root: Path) -> Registry:
    names = [f"t{i:03d}" for i in range(n)]
    reg = mint(names, root / "work", {name: {"listen": 20000 + i} for i, name in enumerate(names)})
    for t in reg:
        tag = t.key.rsplit("-", 1)[1]
        for kind in EXTRA_KINDS:
            t.canaries[kind] = f"{kind.replace('_', '-')}-{t.name}-{tag}"
    reg.validate()  # once (add_canary re-validates the whole registry on every call)
    return reg


def patterns_of(reg: Registry) -> list[bytes]:
    out: dict[bytes, None] = {}
    for t in reg:
        for value in t.all_canaries().values():
            for forms in encodings_of(value).values():
                out.update(dict.fromkeys(forms))
    return list(out)


def _log_line(rnd: random.Random, i: int) -> str:
    text = " ".join(rnd.choices(WORDS, k=rnd.randint(5, 40)))
    return json.dumps(
        {
            "ts": 1714550400 + i,
            "level": rnd.choice(["INFO", "DEBUG", "WARNING"]),
            "role": rnd.choice(["user", "assistant", "tool"]),
            "content": text,
        }
    )


def _plant(rnd: random.Random, reg: Registry) -> str:
    t = rnd.choice(list(reg))
    value = rnd.choice(list(t.all_canaries().values()))
    enc = rnd.choice(["plain", "json", "base64", "hex", "url"])
    if enc == "base64":
        return base64.b64encode(value.encode()).decode()
    if enc == "hex":
        return value.encode().hex()
    if enc == "url":
        return "".join(f"%{b:02X}" for b in value.encode())
    if enc == "json":
        return "".join(f"\\u{ord(c):04x}" for c in value)
    return value


def _jsonl(rnd: random.Random, size: int, reg: Registry, plants: int) -> bytes:
    pool = [_log_line(rnd, i) for i in range(2000)]
    lines, total = [], 0
    while total < size:
        line = rnd.choice(pool)
        lines.append(line)
        total += len(line) + 1
    for _ in range(plants):
        i = rnd.randrange(len(lines))
        lines[i] = json.dumps({"ts": i, "level": "INFO", "content": f"leak {_plant(rnd, reg)}"})
    return ("\n".join(lines) + "\n").encode()


def _sqlite(path: Path, rnd: random.Random, size: int, reg: Registry, plants: int) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = OFF")
    conn.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, session TEXT, role TEXT, content TEXT)")
    conn.execute("CREATE VIRTUAL TABLE messages_fts USING fts5(content, content='messages')")
    pool = [" ".join(rnd.choices(WORDS, k=rnd.randint(10, 400))) for _ in range(500)]
    rows, total = [], 0
    while total < size // 2:  # the FTS index roughly doubles it
        text = rnd.choice(pool)
        rows.append(("s1", rnd.choice(["user", "assistant"]), text))
        total += len(text) + 40
    for _ in range(plants):
        i = rnd.randrange(len(rows))
        rows[i] = (rows[i][0], rows[i][1], rows[i][2] + " " + _plant(rnd, reg))
    conn.executemany("INSERT INTO messages (session, role, content) VALUES (?, ?, ?)", rows)
    conn.execute("INSERT INTO messages_fts (messages_fts) VALUES ('rebuild')")
    conn.commit()
    conn.close()


def make_corpus(root: Path, mib: int, reg: Registry, seed: int = 1) -> list[Path]:
    """About `mib` MiB: 40% JSONL logs, 30% SQLite, 10% gzip-rotated logs, 20% binary."""
    rnd = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    total = mib * MiB
    file_size = max(MiB, min(16 * MiB, total // 16))
    made = 0
    i = 0
    while made < total:
        share = rnd.random()
        size = min(file_size, total - made)
        if share < 0.4:
            path = root / "logs" / f"agent-{i}.jsonl"
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(_jsonl(rnd, size, reg, plants=8))
        elif share < 0.7:
            path = root / "db" / f"state-{i}.db"
            path.parent.mkdir(exist_ok=True)
            _sqlite(path, rnd, size, reg, plants=8)
        elif share < 0.8:
            path = root / "logs" / f"agent-{i}.log.1.gz"
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(gzip.compress(_jsonl(rnd, size * 4, reg, plants=8), compresslevel=1))
        else:
            path = root / "bin" / f"blob-{i}.bin"
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(rnd.randbytes(size))
        made += path.stat().st_size
        i += 1
    return sorted(p for p in root.rglob("*") if p.is_file())


def _mbps(nbytes: int, seconds: float) -> float:
    return nbytes / 1e6 / seconds


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


def make_sparse(path: Path, gib: int, key: str) -> None:
    """`gib` GiB that are a hole on disk, with `key` written 1 MiB before the end."""
    with path.open("wb") as fh:
        fh.truncate(gib << 30)
        fh.seek((gib << 30) - MiB)
        fh.write(f"export OPENAI_API_KEY={key}\n".encode())


def sparse_case(procs: ProcessSet, reg: Registry, registry: Path, work: Path, gib: int) -> bool:
    """`scan_file` over a `gib` GiB sparse file with a key near its end, in a fresh process of this tree:
    MB/s and peak RSS. Whether the key was found."""
    path = work / "sparse.bin"
    make_sparse(path, gib, next(iter(reg)).key)
    try:
        r = fresh(procs, [("new", ab.REPO)], registry, path, runs=1)["new"]
    finally:
        path.unlink()
    ok = r["found"] == 1
    print(f"\nscan_file over a {gib} GiB sparse file (the key 1 MiB before its end), a fresh process:")
    print(f"  {_mbps(gib << 30, r['seconds']):.1f} MB/s, peak RSS {r['rss_mib']:.0f} MiB, "
          + ("the key found" if ok else f"KEY NOT FOUND ({r['found']} hits)"))
    return ok


#: `--ref`: every job both trees run in a round (label: job, its arguments); see bench/ab.py.
REF_JOBS: dict[str, tuple[str, dict[str, Any]]] = {
    "Matcher build": ("scan_build", {}),
    "Matcher.find": ("scan_find", {"prefilter": True}),
    "Matcher.find without the prefilter": ("scan_find", {"prefilter": False}),
    "scan_tree": ("scan_tree", {}),
}


def compare(procs: ProcessSet, ref: str, regfile: Path, corpus: Path, total: int, rounds: int) -> None:
    """This tree's scanner against `ref`'s on the same corpus and registry, side by side: a worker per tree;
    each round runs every job in both, one right after the other, in an order flipped every round. Then
    `scan_tree` in fresh processes, alternating: MB/s and peak RSS."""
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
        runs = fresh(procs, [("new", ab.REPO), (ref, tree)], regfile, corpus)
    print(f"\nside by side with {ref} ({rounds} rounds; a find pass repeated for {ab.MIN_SECONDS} s, timed per pass)")
    print(f"{'job':36} {'new ms':>9} {'old ms':>9}  {'new/old':>7}  [lowest, highest]  found new/old")
    for label, (new, old) in seconds.items():
        ratios = [n / o for n, o in zip(new, old, strict=True)]
        print(f"{label:36} {statistics.median(new) * 1e3:9.2f} {statistics.median(old) * 1e3:9.2f}  "
              f"{statistics.median(ratios):6.2f}x  [{min(ratios):.2f}, {max(ratios):.2f}]  "
              f"{found[label][0]}/{found[label][1]}" + ("" if found[label][0] == found[label][1] else "  DIFFERENT"))
    print(f"\nscan_tree in a fresh process per run (the fastest of {FRESH_RUNS} each, alternating; the matcher is "
          "built first, its automata count in the peak RSS)")
    print(f"{'tree':12} {'MB/s':>8} {'peak RSS MiB':>13} {'findings':>9}")
    for name, r in runs.items():
        print(f"{name:12} {_mbps(total, r['seconds']):8.1f} {r['rss_mib']:13.0f} {r['found']:9.0f}")
    print(f"new/{ref} MB/s: {runs[ref]['seconds'] / runs['new']['seconds']:.2f}x")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="32 MiB, the naive loop on 1 MiB, 8 and 64 tenants")
    ap.add_argument("--mib", type=int, help="corpus size in MiB (default 256, --quick 32)")
    ap.add_argument("--tenants", type=int, default=64)
    ap.add_argument("--naive-mib", type=int, help="MiB of the corpus the naive loop scans (default 8, --quick 1)")
    ap.add_argument("--keep", type=Path, help="generate the corpus here and keep it")
    ap.add_argument("--ref", help="instead of the tables: this tree's scanner against that git ref's, side by side")
    ap.add_argument("--rounds", type=int, help="--ref: rounds (default 9, --quick 7)")
    ap.add_argument("--sparse-gib", type=int, default=4, help="size of the sparse-file case in GiB (0: skip it)")
    a = ap.parse_args(argv)
    return children.run(lambda procs: bench(a, procs))


def bench(a: argparse.Namespace, procs: ProcessSet) -> int:
    mib = a.mib or (32 if a.quick else 256)
    naive_mib = a.naive_mib or (1 if a.quick else 8)
    work = Path(tempfile.mkdtemp(prefix="bench-scan-"))
    try:
        reg = make_registry(a.tenants, work)
        patterns = patterns_of(reg)
        corpus = a.keep or work / "corpus"
        t = time.perf_counter()
        files = make_corpus(corpus, mib, reg)
        blobs = [p.read_bytes() for p in files]
        total = sum(map(len, blobs))
        kinds = {p.parent.name for p in files}
        print(
            f"corpus: {len(files)} files ({', '.join(sorted(kinds))}), {total / MiB:.1f} MiB, "
            f"generated in {time.perf_counter() - t:.1f}s"
        )
        canaries = sum(len(t.all_canaries()) for t in reg)
        print(
            f"registry: {a.tenants} tenants x {canaries // a.tenants} canaries = {canaries}, "
            f"{len(patterns)} encoded patterns"
        )
        regfile = work / "registry.yaml"
        reg.save(regfile)
        if a.ref:
            compare(procs, a.ref, regfile, corpus, total, a.rounds or (7 if a.quick else 9))
            return 0 if not a.sparse_gib or sparse_case(procs, reg, regfile, work, a.sparse_gib) else 1

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
        tree = fresh(procs, [("new", ab.REPO)], regfile, corpus)["new"]

        ours_rate = _mbps(total, ours)
        rows = [
            ("Matcher.find (1 thread)", ours_rate, f"{our_hits} hits, build {build:.2f}s"),
            ("  the same without the marker prefilter", _mbps(total, unfiltered), f"{unfiltered_hits} hits"),
            (
                f"naive data.find loop ({naive_mib} MiB)",
                _mbps(len(naive_data), naive),
                f"{naive_hits} hits (Matcher.find on the same slice: {slice_hits})",
            ),
        ]
        for label, res in ((f"rg -F -a ({os.cpu_count()} threads)", rg_multi), ("rg -F -a -j1", rg_one)):
            if res is not None:
                elapsed, startup, matches = res
                rows.append(
                    (
                        label,
                        _mbps(total, elapsed - startup),
                        f"{matches} matches; {elapsed:.2f}s incl. {startup:.2f}s start-up (excluded)",
                    )
                )
        rows.append(
            (
                "scan_tree (streams + SQLite cells)",
                _mbps(total, tree["seconds"]),
                f"{tree['found']:.0f} secret findings (owner None); peak RSS {tree['rss_mib']:.0f} MiB "
                f"(a fresh process, the fastest of {FRESH_RUNS})",
            )
        )
        print(f"\n{'scanner':44} {'MB/s':>9} {'ours is':>9}  notes")
        for label, rate, note in rows:
            print(f"{label:44} {rate:9.1f} {ours_rate / rate:8.2f}x  {note}")
        if rg_multi is None:
            print("ripgrep not installed (apt-get install -y ripgrep)")
        print(f"\nsample check: naive found {naive_hits} pattern occurrences, Matcher.find {slice_hits} canaries")

        print("\ntenants  patterns  build s  find MB/s (whole corpus)  without the prefilter")
        for n in (8, 64) if a.quick else (8, 64, 512):
            r = make_registry(n, work / f"r{n}")
            t = time.perf_counter()
            m = Matcher.for_registry(r)
            b = time.perf_counter() - t
            s, _ = bench_matcher(m, blobs)
            u, _ = bench_matcher(Matcher.for_registry(r, prefilter=False), blobs)
            print(f"{n:7d} {len(m._patterns):9d} {b:8.2f} {_mbps(total, s):10.1f} {_mbps(total, u):21.1f}")

        print("\ncorpus MiB  find s  MB/s")
        joined = b"".join(blobs)
        for frac in (8, 4, 2, 1):
            part = joined[: len(joined) // frac]
            s, _ = bench_matcher(matcher, [part])
            print(f"{len(part) / MiB:10.1f} {s:7.2f} {_mbps(len(part), s):6.1f}")
        if a.sparse_gib and not sparse_case(procs, reg, regfile, work, a.sparse_gib):
            return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark the scanner against the naive loop and ripgrep on one generated corpus, in one run.

    python bench/scan.py [--mib 256] [--tenants 64] [--naive-mib 8] [--keep DIR] [--quick] [--ref DIR]
        [--sparse-gib 4] [--rounds 3]

64 tenants x 12 canaries x every encoding form (the matcher's patterns) over a corpus of realistic files:
SQLite databases (messages + FTS5, as Hermes's state.db), JSONL logs, gzip-rotated logs and binary blobs,
with a few hundred canaries planted in assorted encodings. Prints MB/s of

- `Matcher.find` over every file's bytes (the one-pass automaton; files read beforehand),
- the naive loop (`for pattern in patterns: data.find(pattern)` repeatedly) over the first `--naive-mib`
  MiB of the same corpus (it is too slow for all of it; the rate is what is compared),
- `rg -F -a -f patterns` over the corpus directory (files from the page cache; default threads and -j1),
- `scan_tree` (the whole scanner: streams decompressed, SQLite cells read logically),

and the ratios side by side; then build and scan time versus tenants (8, 64, 512) and versus corpus size.

`scan_tree` and the sparse file are also measured in child processes, so each reports its own peak RSS
(`ru_maxrss`: the matcher's automata plus whatever the scan holds): `scan_tree` over the corpus, and
`scan_file` over a sparse file of `--sparse-gib` GiB (nothing written but a key near its end, so it costs
no disk) that must be found. `--ref DIR` runs the same child with the `harness` of another checkout (e.g.
`git archive <commit> | tar -x -C DIR`) on the same corpus and registry, alternating `--rounds` times, and
prints the best MB/s of each and their ratio. `--quick`: 64 MiB, no naive loop, ripgrep or sweeps.
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
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from harness.core.registry import Registry, mint
from harness.detect.matcher import Matcher, encodings_of
from harness.detect.scan import scan_tree

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


def bench_rg(patterns: list[bytes], corpus: Path, threads: int | None) -> tuple[float, float, int] | None:
    """(seconds, of which start-up (compiling the patterns: the least of 3 runs on an empty file), matches)."""
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
        for _ in range(3):  # the least of three: start-up is noisy
            t = time.perf_counter()
            subprocess.run([*cmd, str(empty)], capture_output=True, check=False)
            startup = min(startup, time.perf_counter() - t)
        t = time.perf_counter()
        proc = subprocess.run([*cmd, str(corpus)], capture_output=True, check=False)
        elapsed = time.perf_counter() - t
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"rg failed: {proc.stderr.decode(errors='replace')[:300]}")
    hits = sum(int(line.rsplit(b":", 1)[1]) for line in proc.stdout.splitlines() if line)
    return elapsed, startup, hits


#: Run in a child process with `sys.path[0]` = a checkout: scan a tree (or one file) with a prebuilt matcher,
#: print one JSON line (seconds, findings, peak RSS in MiB). The same code drives this tree and `--ref`.
_CHILD = textwrap.dedent("""
    import json, resource, sys, time
    from pathlib import Path
    from harness.core.registry import load
    from harness.detect.matcher import Matcher
    from harness.detect import scan
    reg = load(Path(sys.argv[1]))
    t = time.perf_counter()
    matcher = Matcher.for_registry(reg)
    build = time.perf_counter() - t
    target = Path(sys.argv[2])
    t = time.perf_counter()
    if target.is_dir():
        found = len(scan.scan_tree(target, reg, None, matcher=matcher).findings)
    else:
        found = len(scan.scan_file(target, matcher))
    seconds = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "build": build, "found": found, "rss": rss}))
""")


def run_child(checkout: Path, registry: Path, target: Path) -> dict[str, float]:
    proc = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(checkout)!r})\n" + _CHILD,
                           str(registry), str(target)], capture_output=True, text=True, check=False, cwd=checkout)
    if proc.returncode:
        raise RuntimeError(f"child in {checkout} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def make_sparse(path: Path, gib: int, key: str) -> None:
    """`gib` GiB of zeros on disk as a hole, with `key` written 1 MiB before the end."""
    with path.open("wb") as fh:
        fh.truncate(gib << 30)
        fh.seek((gib << 30) - MiB)
        fh.write(f"export OPENAI_API_KEY={key}\n".encode())


def bench_children(a: argparse.Namespace, reg: Registry, corpus: Path, total: int, work: Path) -> None:
    """scan_tree and the sparse file in child processes (peak RSS), this tree and `--ref` side by side."""
    registry = work / "registry.yaml"
    reg.save(registry)
    here = Path(__file__).resolve().parents[1]
    trees = [("this tree", here)] + ([("--ref", a.ref.resolve())] if a.ref else [])
    best: dict[str, dict[str, float]] = {}
    for _ in range(a.rounds):
        for label, checkout in trees:
            r = run_child(checkout, registry, corpus)
            if label not in best or r["seconds"] < best[label]["seconds"]:
                best[label] = r
    print(f"\nscan_tree in a child process (best of {a.rounds}, matcher built beforehand)")
    print(f"{'checkout':12} {'MB/s':>8} {'peak RSS MiB':>13} {'findings':>9}  build s")
    for label, _ in trees:
        r = best[label]
        print(f"{label:12} {_mbps(total, r['seconds']):8.1f} {r['rss']:13.0f} {r['found']:9d}  {r['build']:.2f}")
    if a.ref:
        ratio = best["--ref"]["seconds"] / best["this tree"]["seconds"]
        print(f"this tree / --ref: {ratio:.2f}x the MB/s")
    if a.sparse_gib:
        sparse = work / "sparse.bin"
        make_sparse(sparse, a.sparse_gib, next(iter(reg)).key)
        print(f"\nscan_file over a {a.sparse_gib} GiB sparse file (key 1 MiB before the end)")
        print(f"{'checkout':12} {'MB/s':>8} {'peak RSS MiB':>13} {'findings':>9}")
        for label, checkout in trees:
            r = run_child(checkout, registry, sparse)
            print(f"{label:12} {_mbps(a.sparse_gib << 30, r['seconds']):8.1f} {r['rss']:13.0f} {r['found']:9d}")
        sparse.unlink()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="corpus size in MiB (default 256)")
    ap.add_argument("--tenants", type=int, default=64)
    ap.add_argument("--naive-mib", type=int, default=8, help="MiB of the corpus the naive loop scans")
    ap.add_argument("--keep", type=Path, help="generate the corpus here and keep it")
    ap.add_argument("--quick", action="store_true", help="64 MiB, no naive loop, ripgrep or sweeps")
    ap.add_argument("--ref", type=Path, help="another checkout whose scan_tree runs side by side (child processes)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating child runs per checkout (best is kept)")
    ap.add_argument("--sparse-gib", type=int, default=4, help="size of the sparse-file case (0: skip it)")
    a = ap.parse_args(argv)
    if a.quick:
        a.mib = min(a.mib, 64)

    work = Path(tempfile.mkdtemp(prefix="bench-scan-"))
    try:
        reg = make_registry(a.tenants, work)
        patterns = patterns_of(reg)
        corpus = a.keep or work / "corpus"
        t = time.perf_counter()
        files = make_corpus(corpus, a.mib, reg)
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

        t = time.perf_counter()
        matcher = Matcher.for_registry(reg)
        build = time.perf_counter() - t
        ours, our_hits = bench_matcher(matcher, blobs)
        unfiltered, unfiltered_hits = bench_matcher(Matcher.for_registry(reg, prefilter=False), blobs)
        share = min(1.0, (1 if a.quick else a.naive_mib) * MiB / total)  # the same share of every file
        naive_data = b"".join(b[: int(len(b) * share)] for b in blobs)
        naive, naive_hits = bench_naive(patterns, naive_data)
        _, slice_hits = bench_matcher(matcher, [naive_data])
        rg_multi = None if a.quick else bench_rg(patterns, corpus, None)
        rg_one = None if a.quick else bench_rg(patterns, corpus, 1)
        t = time.perf_counter()
        tree = scan_tree(corpus, reg, None)
        full = time.perf_counter() - t

        ours_rate = _mbps(total, ours)
        rows = [
            ("Matcher.find (1 thread)", ours_rate, f"{our_hits} hits, build {build:.2f}s"),
            ("  the same without the marker prefilter", _mbps(total, unfiltered), f"{unfiltered_hits} hits"),
            (
                f"naive data.find loop ({a.naive_mib} MiB)",
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
                _mbps(total, full),
                f"{len(tree.findings)} secret findings (owner None), {len(tree.unreadable)} unreadable",
            )
        )
        print(f"\n{'scanner':44} {'MB/s':>9} {'ours is':>9}  notes")
        for label, rate, note in rows:
            print(f"{label:44} {rate:9.1f} {ours_rate / rate:8.2f}x  {note}")
        if rg_multi is None and not a.quick:
            print("ripgrep not installed (apt-get install -y ripgrep)")
        print(f"\nsample check: naive found {naive_hits} pattern occurrences, Matcher.find {slice_hits} canaries")

        del blobs, naive_data  # the children's RSS is their own; this process's is not measured
        bench_children(a, reg, corpus, total, work)
        if a.quick:
            return 0
        blobs = [p.read_bytes() for p in files]
        print("\ntenants  patterns  build s  find MB/s (whole corpus)  without the prefilter")
        for n in (8, 64, 512):
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
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

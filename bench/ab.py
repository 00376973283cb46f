"""Side by side with a git ref: the ref in a temp `git worktree`, and workers that run jobs with either tree.

    with ref_tree("ac814e6") as tree:                      # removed afterwards (`git worktree remove`)
        new, old = Worker(procs, REPO, "new"), Worker(procs, tree, "ac814e6")
        new.call("scan_find", prefilter=True)             # -> {"seconds": ..., "hits": ...}

A worker is this file run as `python bench/ab.py TREE` with `PYTHONPATH=TREE`, a child in the bench's
ProcessSet. It answers each JSON line `{"job": name, ...}` on its stdin with one JSON line, running the job
of that name below with TREE's harness. The jobs read the tree's layout from its files (layered
`harness/core`, `harness/detect`, or the flat modules of ac814e6 and before), never by trying an import: the
venv's editable install hands any `harness.*` that the ref lacks over from this checkout. Each reply is
checked: every loaded `harness` module must come from TREE.

This file imports nothing from `harness` at module level, so that an old tree's worker can load it.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.core.procs import ProcessSet

REPO = Path(__file__).resolve().parent.parent
#: A find job repeats its pass until this much time has gone by (a single pass over a small corpus takes
#: milliseconds, less than the time over which this machine's CPU speed wanders).
MIN_SECONDS = 0.2


@contextmanager
def ref_tree(ref: str) -> Iterator[Path]:
    """`ref` checked out with `git worktree add --detach` into a temp folder; removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="bench-ref-") as tmp:
        tree = Path(tmp) / ref.replace("/", "-")
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(tree), ref],
                       check=True, capture_output=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                           check=False, capture_output=True)


class Worker:
    """`bench/ab.py TREE` as a child in `procs`; `call` runs one job there and returns its reply."""

    def __init__(self, procs: ProcessSet, tree: Path, name: str) -> None:
        from harness.core.procs import Stdio  # this checkout's; the worker imports the tree's harness

        self.name = name
        self.proc = procs.spawn([sys.executable, __file__, str(tree)], env={**os.environ, "PYTHONPATH": str(tree)},
                                stdio=Stdio(stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))

    def call(self, job: str, **kwargs: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"job": job, **kwargs}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.name} exited ({self.proc.wait()}) during {job}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"worker {self.name}, {job}: {reply['error']}")
        return reply

    def close(self) -> None:
        """End the worker (its stdin closed) and wait for it."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


# -- the worker's side -----------------------------------------------------------------------------------------

TREE = Path(sys.argv[1]).resolve() if __name__ == "__main__" else REPO
STATE: dict[str, Any] = {}


def module(layered: str, flat: str) -> ModuleType:
    """`harness.<layered>` in a layered tree, `harness.<flat>` in a tree before the layering."""
    import harness

    package = Path(harness.__file__).parent
    return importlib.import_module(f"harness.{layered if (package / layered.split('.')[0]).is_dir() else flat}")


def load_registry(path: str) -> Any:
    """The registry in the YAML file `path`: `core.registry_file.load`, or `load` of the registry's own module in
    a tree from before the file format had a module of its own."""
    import harness

    own = (Path(harness.__file__).parent / "core" / "registry_file.py").is_file()
    return module("core.registry_file" if own else "core.registry", "registry").load(path)


def engine(name: str, layered: str, flat: str) -> ModuleType:
    """The scanning engine's module `name` (`harness.detect.engine.<name>`), or where a tree from before the
    engine package kept it (`layered`, `flat`: as `module` takes them)."""
    try:
        return importlib.import_module(f"harness.detect.engine.{name}")
    except ModuleNotFoundError:
        return module(layered, flat)


def streaming() -> ModuleType:
    """The module holding `scan_file`: `detect.engine.stream`, `detect.stream`, or the scanner's module in a
    tree before the split."""
    try:
        return engine("stream", "detect.stream", "detect.stream")
    except ModuleNotFoundError:
        return module("detect.scan", "scan")


def scan_load(corpus: str, registry: str) -> dict[str, Any]:
    """Load the registry and the corpus's bytes; build both matchers and warm scan_tree's matcher cache."""
    reg = load_registry(registry)
    matcher = engine("matcher", "detect.matcher", "matcher").Matcher
    files = sorted(p for p in Path(corpus).rglob("*") if p.is_file())
    STATE.update(registry=reg, corpus=corpus, blobs=[p.read_bytes() for p in files],
                 matchers={True: matcher.for_registry(reg), False: matcher.for_registry(reg, prefilter=False)})
    module("detect.scan", "scan").scan_tree(corpus, reg, None)
    return {"bytes": sum(map(len, STATE["blobs"]))}


def scan_build() -> dict[str, Any]:
    matcher = engine("matcher", "detect.matcher", "matcher").Matcher
    t = time.perf_counter()
    matcher.for_registry(STATE["registry"])
    return {"seconds": time.perf_counter() - t}


def scan_find(prefilter: bool) -> dict[str, Any]:
    """Seconds per pass of `Matcher.find` over every file's bytes (passes repeated for MIN_SECONDS)."""
    matcher, blobs = STATE["matchers"][prefilter], STATE["blobs"]
    passes, hits = 0, 0
    t = time.perf_counter()
    while passes == 0 or time.perf_counter() - t < MIN_SECONDS:
        hits = sum(len(matcher.find(b)) for b in blobs)
        passes += 1
    return {"seconds": (time.perf_counter() - t) / passes, "hits": hits}


def scan_tree() -> dict[str, Any]:
    t = time.perf_counter()
    tree = module("detect.scan", "scan").scan_tree(STATE["corpus"], STATE["registry"], None)
    return {"seconds": time.perf_counter() - t, "findings": len(tree.findings)}


def scan_fresh(target: str, registry: str) -> dict[str, Any]:
    """The first job of a fresh worker: build the registry's matcher, then scan `target` (a folder with
    `scan_tree`, owner None; a file with `scan_file`). Seconds of the scan, what it found, and the process's
    peak RSS in MiB (the interpreter, the matcher's automata and whatever the scan held)."""
    reg = load_registry(registry)
    scan = module("detect.scan", "scan")
    matcher = engine("matcher", "detect.matcher", "matcher").Matcher.for_registry(reg)
    t = time.perf_counter()
    if Path(target).is_dir():
        found = len(scan.scan_tree(target, reg, None, matcher=matcher).findings)
    else:
        found = len(streaming().scan_file(Path(target), matcher))
    seconds = time.perf_counter() - t
    return {"seconds": seconds, "found": found, "rss_mib": peak_rss_mib()}


def peak_rss_mib() -> float:
    """This process's peak RSS: `VmHWM`, not `ru_maxrss`, which on Linux also counts what the parent held
    when it forked this worker (the bench holds the whole corpus)."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) / 1024 for line in fh if line.startswith("VmHWM:"))


def audit(tenants: int, out: str, hermes: str) -> dict[str, Any]:
    """One `run_audit` (scenario oneshot, reverse topology) as bench/audit.py's `audit` runs it, with the
    Hermes at `hermes` (a ref's tree has no .hermes-venv of its own); the battery and services off where the
    tree has them (a tree from before them drives the env probe only anyway)."""
    run = importlib.import_module("harness.run")
    known = {f.name for f in dataclasses.fields(run.RunOptions)}
    extra = {k: [] for k in ("tools", "services") if k in known}
    t = time.perf_counter()
    result = run.run_audit(run.RunOptions(tenants=tenants, out=Path(out), quiet=True, hermes_python=Path(hermes),
                                          **extra))
    seconds = time.perf_counter() - t
    if isinstance(result, tuple):  # (code, out) before the layering
        return {"seconds": seconds, "status": {0: "clean", 1: "leak"}.get(result[0], f"exit {result[0]}")}
    return {"seconds": seconds, "status": result.verdict.status}


JOBS: dict[str, Callable[..., dict[str, Any]]] = {
    "scan_load": scan_load, "scan_build": scan_build, "scan_find": scan_find, "scan_tree": scan_tree,
    "scan_fresh": scan_fresh, "audit": audit}


def serve() -> None:
    """Answer job lines on stdin; anything else a job prints goes to stderr."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reply = JOBS[request.pop("job")](**request)
            mixed = sorted(name for name, mod in sys.modules.items() if name.split(".")[0] == "harness"
                           and not Path(getattr(mod, "__file__", None) or "").resolve().is_relative_to(TREE))
            if mixed:
                reply = {"error": f"harness modules from outside {TREE}: {mixed}"}
        except Exception:
            reply = {"error": traceback.format_exc()}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    serve()

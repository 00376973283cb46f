"""Benchmark the one-shot audit against the same Hermes runs without proxy and reconciler, interleaved.

    .venv/bin/python bench/audit.py [--quick] [--rounds N] [--tenants 2,4,8] [--ref REF]

For each tenant count, every round runs both, in an order alternating by round, doing the same Hermes work:
every tenant's one-shot turn answered with the environment probe only (no tool battery, no service besides
the provider; the battery's extra turns and stubs would have no counterpart in the bare run):

- `audit`: `harness.run.run_audit` (scenario oneshot, reverse topology, `tools=[]`, `services=[]`): its
  `AuditSession` mints, starts the stubs and mitmdump with the addon on listeners bound up front, and while it
  comes up: Hermes check, homes, the tenants' one-shot turns (concurrently); then proxy stop, reconcile (flows,
  homes, logs), reports;
- `bare`: the same `AuditSession` without mitmdump (mint, stubs), homes pointing straight at the stubs, and
  the same `Hermes.oneshot` turns, run concurrently the same way; no proxy, no reconcile, no reports.

After one untimed audit and bare run (the first of each is cold: the CA, the page cache), prints the wall
time ratio audit/bare per round (median) and where the audit's time goes: each step of
`run_audit` is timed by wrapping the function it calls (nothing in the harness is changed). Steps named
`beside:` overlap others (mitmdump comes up while Hermes is checked and the turns start); `reconcile:` ones
are parts of the reconcile.

`--ref REF` (a regression check) runs instead this tree's audit against REF's, side by side: REF in a temp
`git worktree`, one worker per tree (bench/ab.py) and a second worker of this tree (the A/A control), each
round one audit in each, right after each other in an order rotated every round, with the same Hermes,
after one untimed audit in each (its first mitmdump creates the tree's CA); prints the audit's wall time in
each, new/old and the control new/new2 (the median of the rounds, and the lowest and highest). Every child
is stopped on SIGTERM/SIGINT (bench/children.py).

`--quick`: 2 tenants, 2 rounds. `--smoke` (what the test suite runs, tests/test_benches.py): one round of 2
tenants without the untimed warm-up, so one audit and one bare run of real Hermes (about 20 s). It measures
nothing worth reading (one cold round); it proves that the bench still drives the harness: the audit ends clean or
leak, the bare run's turns succeed, every step timed above is still called, and the table is printed.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ab
import children

from harness import judge, options, run
from harness import session as sessions
from harness.capture import proxy
from harness.core.evidence import EvidenceFolder
from harness.core.procs import ProcessSet
from harness.core.protocol import PROMPT
from harness.detect import reconcile, scan
from harness.drive import doors
from harness.drive.hermes.agent import Hermes, write_home
from harness.session import AuditSession

STEPS: dict[str, float] = defaultdict(float)
#: How often each step was called during the audit being timed.
CALLS: Counter[str] = Counter()


@contextmanager
def timed_steps() -> Iterator[None]:
    """Wrap the functions `run_audit` calls so each step's wall time adds up in STEPS; an audit that calls one of
    them no more (the harness moved it) is an error, not a step silently left out."""
    patches: list[tuple[Any, str, Any]] = [
        (Hermes, "check", "hermes check"),
        (proxy.Proxy, "spawn", "mitmdump spawn"),
        (proxy.Proxy, "wait_ready", "beside: mitmdump coming up"),
        (proxy.Proxy, "stop", "mitmdump stop"),
        (run, "write_homes", "write homes"),
        (judge, "reconcile", "reconcile"),
        (scan, "scan_tree", "reconcile: scan_tree"),
        (reconcile, "read_flows", "reconcile: read flows"),
        (run, "write_reports", "reports"),
        (EvidenceFolder, "seal", "seal"),
        (sessions, "reap_stale", "reap stale"),
    ]
    saved = []
    for owner, name, label in patches:
        original = getattr(owner, name)
        saved.append((owner, name, original))
        setattr(owner, name, _timer(original, label))
    driver = doors.SCENARIOS["oneshot"]
    doors.SCENARIOS["oneshot"] = _timer(driver, "hermes turns")
    CALLS.clear()
    try:
        yield
    finally:
        doors.SCENARIOS["oneshot"] = driver
        for owner, name, original in saved:
            setattr(owner, name, original)
    uncalled = [label for label in [*(label for *_, label in patches), "hermes turns"] if not CALLS[label]]
    if uncalled:
        raise RuntimeError(f"the audit no longer calls what bench/audit.py times as {uncalled}: update timed_steps")


def _timer(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        CALLS[label] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            STEPS[label] += time.perf_counter() - t

    return wrapped


def audit(tenants: int, root: Path) -> float:
    t = time.perf_counter()
    try:
        verdict = run.run_audit(options.RunOptions(tenants=tenants, out=root / "audit", quiet=True, tools=[],
                                               services=[])).verdict
    except sessions.Interrupted as exc:  # run_audit's own handlers took the signal and stopped its children
        raise children.Interrupted(signal.Signals[str(exc)]) from None
    seconds = time.perf_counter() - t
    check_verdict(verdict.status, tenants, root / "audit")
    return seconds


def check_verdict(status: str, tenants: int, out: Path) -> None:
    """A leak is a verdict (Hermes' own findings), not a failed audit; an inconclusive audit did not do the
    work the bare run did, so its time would compare unlike with like."""
    if status not in ("clean", "leak"):
        raise RuntimeError(f"audit of {tenants} tenants was {status} (evidence in {out})")


def bare(tenants: int, root: Path, procs: ProcessSet) -> float:
    """The same Hermes one-shot turns, straight at the stubs (Hermes in `procs`, closed at the end)."""
    t = time.perf_counter()
    names = sessions.tenant_names(tenants)
    with AuditSession(root / "bare", names, procs=procs) as session:  # no proxy: the stubs only
        registry = session.mint()
        stubs = session.start_stubs()
        for tenant in registry:
            write_home(tenant, session.sandbox.home_of(tenant.name), f"{stubs[tenant.name].url}/v1",
                       launch=tenant.name == session.sandbox.launch)
        hermes = Hermes(options.hermes_python(None), session.sandbox, procs, root / "bare" / "logs")
        with ThreadPoolExecutor(max_workers=tenants) as pool:
            results = list(pool.map(lambda n: hermes.oneshot(n, PROMPT), names))
        procs.close()
    seconds = time.perf_counter() - t
    failed = [r for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"bare run of {failed[0].tenant} failed: {failed[0].detail}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 tenants only, 2 rounds")
    ap.add_argument("--smoke", action="store_true", help="one cold round of 2 tenants: does the bench still run")
    ap.add_argument("--rounds", type=int, help="rounds per tenant count (default 4, --quick 2; --ref: 5, --quick 3)")
    ap.add_argument("--tenants", default="2,4,8", help="tenant counts (default 2,4,8)")
    ap.add_argument("--ref", help="instead: this tree's audit against that git ref's, side by side")
    a = ap.parse_args(argv)
    return children.run(lambda procs: compare(a, procs) if a.ref else bench(a, procs))


def compare(a: argparse.Namespace, procs: ProcessSet) -> int:
    """This tree's audit against `a.ref`'s, side by side, with an A/A control: a worker per tree and a second
    worker of this tree; each round one audit in each, in an order rotated every round. new/new is what the
    method reads when nothing differs: a new/old inside its spread is no change."""
    rounds = a.rounds or (3 if a.quick else 5)
    counts = [2] if a.quick else [int(x) for x in a.tenants.split(",")]
    hermes = str(options.hermes_python(None))
    print(f"{'tenants':>7} {'round':>5} {'new s':>7} {'new2 s':>7} {'old s':>7} {'new/old':>8} {'new/new2':>9}"
          f"   (old = {a.ref})")
    summary = []
    with ab.ref_tree(a.ref) as tree:
        sides = (ab.Worker(procs, ab.REPO, "new"), ab.Worker(procs, ab.REPO, "new2"), ab.Worker(procs, tree, a.ref))
        with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp:  # untimed (see above)
            for i, side in enumerate(sides):
                side.call("audit", tenants=2, out=str(Path(tmp) / f"warm-{i}"), hermes=hermes)
        for n in counts:
            got: tuple[list[float], ...] = ([], [], [])
            for r in range(rounds):
                with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp:
                    for i in (r % 3, (r + 1) % 3, (r + 2) % 3):
                        out = Path(tmp) / f"audit-{i}"
                        reply = sides[i].call("audit", tenants=n, out=str(out), hermes=hermes)
                        check_verdict(reply["status"], n, out)
                        got[i].append(reply["seconds"])
                new, new2, old = (g[-1] for g in got)
                print(f"{n:7d} {r:5d} {new:7.2f} {new2:7.2f} {old:7.2f} {new / old:7.2f}x {new / new2:8.2f}x",
                      flush=True)
            summary.append(f"  {n} tenants: new/old {_spread(got[0], got[2])}, A/A new/new2 {_spread(got[0], got[1])} "
                           f"(new {statistics.median(got[0]):.2f} s, old {statistics.median(got[2]):.2f} s)")
        procs.close()
    print(f"median of per-round ratios [lowest, highest] ({rounds} rounds):")
    print("\n".join(summary))
    return 0


def _spread(xs: list[float], ys: list[float]) -> str:
    ratios = [x / y for x, y in zip(xs, ys, strict=True)]
    return f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]"


def bench(a: argparse.Namespace, procs: ProcessSet) -> int:
    rounds = 1 if a.smoke else a.rounds or (2 if a.quick else 4)
    counts = [2] if a.quick or a.smoke else [int(x) for x in a.tenants.split(",")]
    if not a.smoke:
        with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp:  # untimed: the first of each is cold
            audit(counts[0], Path(tmp) / "warm")
            bare(counts[0], Path(tmp) / "warm-bare", procs)
    print(f"{'tenants':>7} {'round':>5} {'audit s':>8} {'bare s':>7} {'audit/bare':>10}")
    summary = []
    for n in counts:
        ratios, audits, bares = [], [], []
        STEPS.clear()
        for r in range(rounds):
            with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp:
                got = {}
                for name in ("audit", "bare")[:: 1 if r % 2 == 0 else -1]:
                    if name == "audit":
                        with timed_steps():
                            got[name] = audit(n, Path(tmp))
                    else:
                        got[name] = bare(n, Path(tmp), procs)
            audits.append(got["audit"])
            bares.append(got["bare"])
            ratios.append(got["audit"] / got["bare"])
            print(f"{n:7d} {r:5d} {got['audit']:8.2f} {got['bare']:7.2f} {ratios[-1]:9.2f}x", flush=True)
        total = sum(audits)
        print(f"  where the audit's time goes ({n} tenants, sum of {rounds} rounds, share of audit wall time):")
        for label, secs in sorted(STEPS.items(), key=lambda kv: -kv[1]):
            print(f"    {label:24} {secs / rounds:6.2f} s/run {secs / total:6.1%}")
        other = total - sum(v for k, v in STEPS.items() if not k.startswith(("reconcile:", "beside:")))
        print(f"    {'(rest: mint, stubs, ...)':24} {other / rounds:6.2f} s/run {other / total:6.1%}")
        summary.append(f"  {n} tenants: audit/bare {statistics.median(ratios):.2f}x "
                       f"(audit {statistics.median(audits):.1f} s, bare {statistics.median(bares):.1f} s)")
    print("median of per-round ratios:")
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

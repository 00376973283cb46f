"""Soak: kill `tenancy-audit run` mid-run N times (SIGINT, SIGTERM, SIGKILL in turn) and count survivors.

    TENANCY_HERMES_PYTHON=.hermes-venv/bin/python .venv/bin/python bench/soak_kill.py [--kills 20 | --smoke]

Each run is killed once its ledger has lines (Hermes turns in flight); after a SIGKILL, `tenancy-audit
cleanup` reaps. Survivors are counted by an independent psutil sweep (the run's TENANCY_RUN marker or
its process groups, from its pid file). tests/e2e/test_faults.py runs the same with 3 kills. On SIGTERM/SIGINT
the soak stops the run in flight (SIGTERM: it stops its own children) and whatever of it is left.

`--smoke` (what tests/test_benches.py runs): one kill, SIGKILL (the case that needs `tenancy-audit cleanup`), of an
audit without the tool battery and the services (it reaches its turns sooner); the same lines. It proves that the
soak still starts, kills and sweeps a real run, and soaks nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import children
import psutil

from harness.core.procs import RUN_MARKER, ProcessSet, Stdio, find_run_processes, run_of
from harness.options import hermes_python

CLI = [sys.executable, "-m", "harness.cli"]
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)
#: `--smoke`: what the killed audit leaves out.
SMOKE_ARGS = ("--tools", "none", "--services", "none")


def _sweep(run_id: str, groups: list[int]) -> list[int]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and (
                    os.getpgid(proc.pid) in groups or proc.environ().get(RUN_MARKER) == run_id):
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def finish(proc: subprocess.Popen[bytes]) -> None:
    """The run `proc` ended (SIGTERM first if it still runs) and nothing of it left: what its pid file still
    names (it was SIGKILLed, or could not stop everything) is killed."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if (run := run_of(proc.pid)) is not None:
        for victim in find_run_processes(*run):
            with contextlib.suppress(psutil.Error):
                victim.kill()


def one_kill(procs: ProcessSet, root: Path, n: int, sig: signal.Signals,
             extra: tuple[str, ...] = ()) -> tuple[int, int, float]:
    """(processes of the run at the kill, survivors after teardown/cleanup, seconds from kill to none left);
    `extra`: more options of the run."""
    out = root / f"run-{n}"
    argv = [*CLI, "run", "--quiet", "--out", str(out), "--hermes-python", str(hermes_python(None)), *extra]
    proc = procs.spawn(argv, env=dict(os.environ), stdio=Stdio(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        return kill_run(procs, proc, out, n, sig)
    finally:
        finish(proc)


def kill_run(procs: ProcessSet, proc: subprocess.Popen[bytes], out: Path, n: int,
             sig: signal.Signals) -> tuple[int, int, float]:
    """Once the run has turns in flight, `sig` to it (`tenancy-audit cleanup` after a SIGKILL); see one_kill."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        ledger = out / "ledger.jsonl"
        if ledger.exists() and len(ledger.read_bytes().splitlines()) >= 3 and (run := run_of(proc.pid)):
            break
        time.sleep(0.05)
    else:
        raise SystemExit(f"run {n} ended or stalled before it could be killed")
    run_id, groups = run
    at_kill = len(_sweep(run_id, groups))
    killed = time.monotonic()
    proc.send_signal(sig)
    proc.wait(timeout=120)
    if sig == signal.SIGKILL:
        code, _, err = procs.run([*CLI, "cleanup"], env=dict(os.environ), cwd=None, timeout=120)
        if code != 0:
            raise RuntimeError(f"tenancy-audit cleanup exited {code}: {err[-300:]}")
    survivors = _sweep(run_id, groups)
    return at_kill, len(survivors), time.monotonic() - killed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--smoke", action="store_true", help="one SIGKILL of an audit without battery and services")
    args = ap.parse_args()
    return children.run(lambda procs: soak(procs, 1 if args.smoke else args.kills, args.smoke), grace=60)


def soak(procs: ProcessSet, kills: int, smoke: bool = False) -> int:
    total = 0
    signals = (signal.SIGKILL,) if smoke else SIGNALS
    with tempfile.TemporaryDirectory(prefix="tenancy-soak-") as tmp:
        for n in range(kills):
            sig = signals[n % len(signals)]
            at_kill, left, seconds = one_kill(procs, Path(tmp), n, sig, SMOKE_ARGS if smoke else ())
            total += left
            print(f"kill {n + 1:>2} {sig.name:<7} processes at kill {at_kill:>2}  survivors {left}  "
                  f"all gone after {seconds:4.1f}s", flush=True)
    print(f"soak: {kills} kills, {total} survivors")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())

"""The addon's scan workers in `bench/proxy.py`: started before the clock runs, and placed on the CPUs of the
client and the stub, so that the CPU the proxies share holds their event loops only (the side-by-side method
needs that: with both loaded at once, the scheduler splits that CPU evenly between the two loops)."""

from __future__ import annotations

import time

import psutil

WORKER = "harness.capture.worker"


def workers_of(pid: int) -> list[psutil.Process]:
    """The scan workers a mitmdump (`pid`) has started."""
    try:
        children = psutil.Process(pid).children()
    except psutil.Error:
        return []
    out = []
    for child in children:
        try:
            if WORKER in child.cmdline():
                out.append(child)
        except psutil.Error:
            continue
    return out


def place(pids: list[int], count: int, cpus: set[int] | None, timeout: float = 30.0) -> list[psutil.Process]:
    """Wait until every mitmdump of `pids` has `count` scan workers, then put them on `cpus` (if given)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [workers_of(pid) for pid in pids]
        if all(len(ws) >= count for ws in found):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the scan workers did not start: {[len(ws) for ws in found]} of {count} each")
        time.sleep(0.1)
    workers = [w for ws in found for w in ws]
    if cpus:
        for worker in workers:
            worker.cpu_affinity(sorted(cpus))
    return workers


def cpu_seconds(procs: list[psutil.Process]) -> float:
    """The CPU time (user + system) the processes have used so far."""
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total

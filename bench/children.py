"""A bench's children, stopped on SIGTERM/SIGINT the way `harness.run` stops its own.

    def main(procs: ProcessSet) -> int: ...      # every child started with procs.spawn / procs.run
    sys.exit(children.run(main))

Every child goes into one `ProcessSet`: its own process group, the run marker, a pid file that `tenancy-audit
cleanup` reaps if the bench itself is SIGKILLed. On SIGTERM or SIGINT every child is terminated at once and
`Interrupted` unwinds the bench through every `finally` (temp folders go too); then the set is closed (SIGTERM,
SIGKILL after `grace`) and the bench exits with 128 + the signal's number. A second signal is ignored so that
the teardown always finishes.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from harness.core.procs import ProcessSet

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(BaseException):
    """SIGTERM/SIGINT reached the bench (a BaseException: no `except Exception` stops the unwinding)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def guarded(grace: float = 10.0) -> Iterator[ProcessSet]:
    """A ProcessSet closed on leaving; SIGTERM/SIGINT terminate its children and raise `Interrupted`."""
    procs = ProcessSet()
    held: list[int] = []

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        if not held:
            held.append(signum)
            procs.terminate()
            raise Interrupted(signum)

    def hold(signum: int, _frame: FrameType | None) -> None:
        held.append(signum)

    old = {s: signal.signal(s, interrupt) for s in SIGNALS}
    try:
        yield procs
    finally:
        for s in SIGNALS:  # the teardown is not interrupted; a signal during it is raised once it is done
            signal.signal(s, hold)
        survivors = procs.close(grace)
        for s, handler in old.items():
            signal.signal(s, handler)
        if survivors:
            print(f"{Path(sys.argv[0]).name}: {len(survivors)} child process(es) survived teardown: "
                  f"{[p.pid for p in survivors]}", file=sys.stderr)
    if held:  # the body ended normally (or swallowed `Interrupted`), but a signal came
        raise Interrupted(held[0])


def run(main: Callable[[ProcessSet], int], grace: float = 10.0) -> int:
    """`main(procs)` inside `guarded`; its status, or 128 + the signal's number if a signal ended it."""
    try:
        with guarded(grace) as procs:
            return main(procs)
    except Interrupted as exc:
        print(f"{Path(sys.argv[0]).name}: stopped by {exc}; every child was stopped", file=sys.stderr)
        return 128 + exc.signum

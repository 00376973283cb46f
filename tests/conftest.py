"""Shared test configuration: the tenancy pytest plugin is loaded through its entry point."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from harness.detect.engine import stream

#: The modules that take longest (real Hermes; the first two wait most of their time for Hermes' cron ticker), in
#: the order the workers start them: a worker left alone with one of them at the end of the run would hold the
#: suite up while the other idles. The other end-to-end modules follow in their order, then the unit tests, many
#: and short, which fill in. Their times: docs/performance.md.
LONGEST_FIRST = ("test_backend_serve.py", "test_messaging_phase.py", "test_oneshot.py", "test_service_plants.py",
                 "test_faults.py", "test_backends.py")


def _start_rank(item: pytest.Item) -> tuple[int, int]:
    name = item.path.name
    if name in LONGEST_FIRST:
        return 0, LONGEST_FIRST.index(name)
    return (1 if item.path.parent.name == "e2e" else 2), 0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order the modules longest first (the workers take whole modules in this order: `--dist loadfile
    --no-loadscope-reorder`); a module's tests keep their order."""
    items.sort(key=_start_rank)


@pytest.fixture
def deny_open(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """`deny_open(name)`: the scanner's open of any file called `name` fails with EACCES (the tests run as
    root, who reads a mode-0000 file)."""

    def deny(name: str) -> None:
        real = stream._open

        def refuse(path: Path) -> int:
            if path.name == name:
                raise PermissionError(13, "Permission denied", str(path))
            return real(path)

        monkeypatch.setattr(stream, "_open", refuse)

    return deny

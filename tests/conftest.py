"""Shared test configuration: the tenancy pytest plugin is loaded through its entry point."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from harness.detect.engine import stream


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

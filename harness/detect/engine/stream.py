"""The scan's entry points: every canary of every tenant in a buffer (`scan_bytes`) or a file (`scan_file`),
and in every layer inside it (`harness.detect.engine.walk`), reported as `ScanHit`s (`harness.detect.engine.hits`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

from harness.detect.engine.hits import DEFAULT_LIMITS, Limits, NotInspected, ScanHit
from harness.detect.engine.matcher import Matcher
from harness.detect.engine.progress import bytes_reopen
from harness.detect.engine.walk import WINDOW, LayerWalk


def scan_bytes(
    data: bytes | bytearray | memoryview,
    matcher: Matcher,
    *,
    limits: Limits = DEFAULT_LIMITS,
    not_inspected: list[NotInspected] | None = None,
    headerless: bool = True,
    exclude: str | None = None,
    recipient: str | None = None,
) -> list[ScanHit]:
    """Every canary in `data` and in the layers it contains (`harness.detect.engine.walk`). `headerless`:
    also try the formats without a magic number at offset 0 (a file's bytes; not an HTTP body, whose
    content-encoding is in its headers). `exclude`: a tenant whose canaries are not reported (a flow's own);
    `recipient` (`exclude` when not given): whose own canaries cut short are not reported as another's (`cuts`)."""
    data = bytes(data)
    scan = LayerWalk(matcher, limits, exclude, recipient)
    scan.stream((data,), (), bytes_reopen(data), top=headerless)
    return scan.result(not_inspected, "bytes")


def scan_file(
    path: Path | str,
    matcher: Matcher,
    *,
    limits: Limits = DEFAULT_LIMITS,
    not_inspected: list[NotInspected] | None = None,
    label: str | None = None,
    recipient: str | None = None,
) -> list[ScanHit]:
    """Scan one regular file as a stream; a SQLite database is also read logically together with its
    -wal/-journal. Raises OSError when the file cannot be opened or is not a regular file. `recipient`: whose own
    canaries cut short are not reported as another's (`cuts`: the file's owner)."""
    path = Path(path)
    fd = _open(path)
    scan = LayerWalk(matcher, limits, recipient=recipient)

    def again(offset: int) -> Iterator[bytes]:
        return _file_chunks(os.dup(fd), offset)

    try:
        scan.stream(_file_chunks(os.dup(fd), 0), (), again, top=True, sqlite_path=path)
    finally:
        os.close(fd)
    return scan.result(not_inspected, str(path) if label is None else label)


def _open(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"not a regular file: {path}")
    return fd


def _file_chunks(fd: int, offset: int) -> Iterator[bytes]:
    """The file's bytes from `offset`, WINDOW at a time (owns and closes `fd`)."""
    try:
        while True:
            chunk = os.pread(fd, WINDOW, offset)
            if not chunk:
                return
            offset += len(chunk)
            yield chunk
    finally:
        os.close(fd)

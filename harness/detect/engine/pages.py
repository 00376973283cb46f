"""Where a SQLite database's raw bytes (or its write-ahead log's) are cut: the page grid, and the bytes that end a
cell's first part (its overflow page's number follows). `harness.detect.engine.walk` leaves a raw hit of a path
that such a cut may have shortened to the database's cells.
"""

from __future__ import annotations

SQLITE_MAGIC = b"SQLite format 3\x00"
#: A write-ahead log: its header, then frames of a header and one page each.
WAL_MAGIC, WAL_HEADER, WAL_FRAME_HEADER = (b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83"), 32, 24


def cut_extension(following: bytes, extensions: list[bytes] | None, reach: int) -> bool:
    """Whether a longer path may start in the bytes `following` a hit and be cut where a database cell's first
    part ends (its overflow page's number follows): plain text (`extensions` given) shows none or some of one of
    them, then a byte that is not text; another encoding shows such a byte within `reach` bytes."""
    if extensions is None:
        return any(_cuts(b) for b in following[:reach])
    for ext in extensions:
        n = 0
        while n < len(ext) and n < len(following) and following[n] == ext[n]:
            n += 1
        if n < len(ext) and n < len(following) and _cuts(following[n]):
            return True
    return False


def _cuts(byte: int) -> bool:
    """A byte no text holds (a control character but tab and line breaks): a record's structure, not its text."""
    return byte < 0x20 and byte not in b"\t\n\r"


def page_grid(header: bytes) -> tuple[int, int] | None:
    """Where a SQLite database's pages (or its WAL's frames) start: (first, stride); None for other data."""
    if header.startswith(SQLITE_MAGIC):
        size = int.from_bytes(header[16:18], "big")
        size = 65536 if size == 1 else size
        return (0, size) if size >= 512 else None
    if header[:4] in WAL_MAGIC and len(header) >= 32:
        size = int.from_bytes(header[8:12], "big")
        return (WAL_HEADER, size + WAL_FRAME_HEADER) if size >= 512 else None
    return None

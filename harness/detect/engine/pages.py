"""Where a SQLite database's raw bytes (or its write-ahead log's) are cut: the page grid, and the bytes that end a
cell's first part (its overflow page's number follows). `harness.detect.engine.walk` leaves a raw hit of a path
that such a cut may have shortened to the database's cells. And where its pages hold what may be in no cell
(`free_spans`): the text runs of a deleted row are looked for there.
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


#: The b-tree page types (interior index, interior table, leaf index, leaf table) and their header's length.
_BTREE = {2: 12, 5: 12, 10: 8, 13: 8}


def free_spans(window: bytes, base: int, grid: tuple[int, int]) -> list[tuple[int, int]]:
    """Where a database's (or a WAL's) raw window, its first byte at absolute offset `base`, holds what may be in no
    cell: in each page, a b-tree page's unallocated space and freeblocks (where a deleted row's bytes stay until
    they are reused), any other page whole (a freelist trunk page, an overflow page); a page cut by the window's
    edge whole too. (start, end) in the window."""
    first, stride = grid
    size = stride - (WAL_FRAME_HEADER if first == WAL_HEADER else 0)
    n = max(0, -(-(base - first) // stride))
    page = first + n * stride - base + stride - size
    spans = [(0, min(page, len(window)))]
    while page < len(window):
        if page + size > len(window):
            spans.append((page, len(window)))
            break
        head = page + (100 if first == 0 and n == 0 else 0)
        length = _BTREE.get(window[head])
        if length is None:
            spans.append((page, page + size))
        else:
            cells = int.from_bytes(window[head + 3 : head + 5], "big")
            content = int.from_bytes(window[head + 5 : head + 7], "big") or 65536
            spans.append((head + length + 2 * cells, page + min(content, size)))
            block, hops = int.from_bytes(window[head + 1 : head + 3], "big"), 0
            while 0 < block < size - 4 and hops < size // 4:  # the freeblock chain (a bad one ends: hops)
                end = int.from_bytes(window[page + block + 2 : page + block + 4], "big")
                spans.append((page + block + 4, page + min(block + end, size)))
                block, hops = int.from_bytes(window[page + block : page + block + 2], "big"), hops + 1
        n += 1
        page += stride
    return [(a, b) for a, b in spans if b > a]

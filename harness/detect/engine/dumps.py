"""Hex dumps: the bytes `xxd`, `hexdump -C`, `hexdump`, `od -tx1` (with `-An` or offsets) or `xxd -p` show, one line
of hex groups after another, read back as the bytes they dump (their offsets and ASCII columns dropped), so a value
the dump cuts across lines is whole again.

A dump line: an offset (hex or octal digits, `:` after it in `xxd`; none in `od -An` and `xxd -p`), groups of 2, 4
or 8 hex digits, one space apart (two in the middle of a `hexdump -C` line), then an ASCII column (two spaces
before it in `xxd`, `|...|` in `hexdump -C`). Groups of 4 or 8 digits with no `:` after the offset (`hexdump`,
`od -x`, `od -tx4`) are little-endian words, as those tools print them; `xxd` prints its groups in byte order. A
line of `*` (repeated lines left out) is skipped.

`starts` looks at the lines that may start a dump (`signs.DUMP_HEAD`: an offset's first three zeros, where a dump
starts; or a space, `od -An`, whose row shows 8 bytes or more); `decode` reads the dump's lines up to the first that
is no dump line.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import stringzilla

from harness.detect.engine.progress import Progress

#: A row of a dump without offsets as the marks of base64 characters (`containers.b64_marks`: 1 for a hex digit or
#: any other letter, 0 for a space): eight groups of two (`od -An -tx1`) or six of four (`od -An -x`).
_ROWS = (b"\x00\x01\x01" * 8, b"\x00\x01\x01\x01\x01" * 6)
#: How far into a line its row is looked for.
MAX_ROW = 96
_OFFSET = re.compile(rb"([0-9a-fA-F]{4,16})(:?)")
_GROUPS = re.compile(rb"(?: [0-9a-fA-F]{2,8}(?=[ |]|\Z))+")
_WIDE_GROUPS = re.compile(rb"(?:  ?[0-9a-fA-F]{2,8}(?=[ |]|\Z))+")
_PLAIN = re.compile(rb"(?:[0-9a-fA-F]{2})+")
#: Longest dump line read (a line longer is no dump's).
MAX_LINE = 4096
#: Lines a dump's start is looked for before a row.
LOOKBACK_LINES = 64


def line_bytes(line: bytes) -> bytes | None:
    """The bytes a dump line shows, or None if it is none (`b""` for a `*` line)."""
    line = line.rstrip(b"\r")
    if line == b"*":
        return b""
    if _PLAIN.fullmatch(line) is not None:  # `xxd -p`
        return bytes.fromhex(line.decode())
    bar = line.find(b"  |")  # `hexdump -C`'s ASCII column
    if bar >= 0 and line.endswith(b"|"):
        line = line[:bar]
    offset = _OFFSET.match(line)
    colon = offset is not None and offset.group(2) == b":"
    body = line[offset.end() :] if offset is not None else line
    groups = (_WIDE_GROUPS if bar >= 0 else _GROUPS).match(body)
    if groups is None or (offset is None and not line.startswith(b" ")):
        return None
    rest = body[groups.end() :]
    if rest and not rest.startswith(b"  "):  # `xxd`'s ASCII column: two spaces after the groups
        return None
    words = groups.group().split()
    width = len(words[0])
    if width % 2 or any(len(w) != width for w in words[:-1]) or len(words[-1]) % 2 or len(words[-1]) > width:
        return None
    data = [bytes.fromhex(w.decode()) for w in words]
    if width > 2 and not colon:
        data = [w[::-1] for w in data]
    return b"".join(data)


def starts(window: bytes, marks: bytes, heads: list[tuple[int, int]],
           min_bytes: int) -> tuple[list[tuple[int, int]], list[int]]:
    """(first byte, end of the line that shows it) of every dump in a text window whose lines show at least
    `min_bytes` bytes, from its first line; and where a row is on a line an escaped line break of a JSON string
    makes (a dump in a tool's output). `marks`: the window's base64 marks; `heads`: where a dump's line may start
    (`signs.DUMP_HEAD`: a line break, real or escaped, then an offset's zeros or a space)."""
    found: dict[int, int] = {}
    stray = []
    dump_end = -1
    lines = [(0, False)] if window.startswith((b"000", b" ")) else []
    lines += [(brk + 1, False) if window[brk] == 0x0A else (brk + 2, True) for brk, _ in heads]
    for line, escaped in lines:
        if line < dump_end or (window[line] == 0x20 and not any(marks.startswith(row, line) for row in _ROWS)):
            continue
        if escaped:
            if any(stringzilla.find(marks, row, line, line + MAX_ROW) >= 0 for row in _ROWS):
                stray.append(line)
            continue
        first, last, shown = _extent(window, line)
        if first is not None:
            dump_end = last
            if shown >= min_bytes:
                found.setdefault(first, last)
    return sorted(found.items()), stray


def _extent(window: bytes, line_start: int) -> tuple[int | None, int, int]:
    """The first and the end of the dump the line at `line_start` belongs to, and how many bytes its lines show
    (None: the line is no dump's)."""
    def line_at(start: int) -> tuple[int, bytes | None]:
        end = window.find(b"\n", start, start + MAX_LINE)
        end = len(window) if end < 0 else end
        return end, line_bytes(window[start:end])

    end, shown = line_at(line_start)
    if shown is None:
        return None, line_start, 0
    first, total = line_start, len(shown)
    for _ in range(LOOKBACK_LINES):
        if first < 2:
            break
        before = window.rfind(b"\n", 0, first - 1) + 1
        line = line_bytes(window[before : first - 1])
        if line is None:
            break
        first, total = before, total + len(line)
    while end < len(window):
        nxt, line = line_at(end + 1)
        if line is None:
            break
        end, total = nxt, total + len(line)
    return first, end, total


def decode(steps: Iterator[memoryview], progress: Progress) -> Iterator[bytes]:
    """The bytes a dump shows, from its first line to the last line that is a dump line (its line break
    included)."""
    carry = b""
    for step in steps:
        data = carry + bytes(step)
        pos = 0
        while (nl := data.find(b"\n", pos)) >= 0:
            shown = line_bytes(data[pos:nl])
            if shown is None:
                progress.consumed += pos
                progress.eof = True
                return
            if shown:
                yield shown
            pos = nl + 1
        progress.consumed += pos
        carry = data[pos:]
        if len(carry) > MAX_LINE:
            progress.eof = True
            return
    shown = line_bytes(carry) if carry else None
    if shown:
        yield shown
        progress.consumed += len(carry)
    progress.eof = True

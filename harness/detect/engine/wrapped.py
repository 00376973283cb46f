"""Base64 blocks wrapped at any column: lines of base64 characters of one width, with real line breaks (LF or CRLF)
or JSON-escaped ones (`\\n`, `\\r\\n`, escaped again inside a JSON string holding JSON), as MIME bodies, PEM,
`base64` and JSON encoders of long values write them (`blocks`). `codecs` decodes such a block across its breaks.
"""

from __future__ import annotations

import re

import ahocorasick_rs

from harness.detect.engine import codecs

B64_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_")
#: A line break followed by a base64 character: inside a wrapped block, if a line of them comes before.
#: One automaton per kind of break (each small enough for the SIMD searcher), or a regex (`_breaks`).
_BREAK_AUTOMATA = [
    ahocorasick_rs.BytesAhoCorasick([brk + bytes([c]) for c in sorted(B64_CHARS)],
                                    matchkind=ahocorasick_rs.MatchKind.LeftmostFirst)
    for brk in (b"\n", b"\\n")
]
#: Characters a wrapped block's line must have before a break (shorter lines are not taken for base64).
MIN_LINE = 16
_B64_CLASS = rb"[A-Za-z0-9+/_-]"
_DENSE = 256  # breaks in a window's first 64 KiB above which the regex is used (logs, prose)
_LINE_TAIL = re.compile(rb"%s{%d}|%s{%d}\r" % (_B64_CLASS, MIN_LINE, _B64_CLASS, MIN_LINE - 1))
_WRAPPED_LINE = re.compile(rb"\n(?:(?<=%s{16}\n)|(?<=%s{16}\r\n))%s" % (_B64_CLASS, _B64_CLASS, _B64_CLASS))
#: How far back the start of a wrapped block's line is looked for.
LINE_LOOKBACK = 4096
_BREAK_BEFORE = re.compile(rb"(?:\r?\n|\\+r\\+n|\\+n)$")
_BLOCK_OPENERS = frozenset(b"\n\"' \t:,=(>")
#: What `blocks` calls a hex dump whose line breaks are escapes of a JSON string.
ESCAPED = "escaped"
#: A line of hex digits only, to its break (a block of them is a plain hex dump).
_HEX_LINE = re.compile(rb"[0-9a-fA-F]+\r?\Z")


def blocks(window: bytes) -> list[tuple[int, str, int]]:
    """(first character, codec, end of its first break) of every base64 block in `window` that holds a line break
    (a break after a line of at least MIN_LINE base64 characters, followed by one); a block of hex digits only
    (`xxd -p`) is a dump too (`dumps`), or with escaped breaks a JSON string to decode first (`ESCAPED`)."""
    starts = []
    block_end = -1
    for pos, end in _breaks(window):
        if pos <= block_end:
            continue
        line = _line(window, pos)
        if line is None:
            continue
        first = _block_start(window, *line)
        starts.append((first, "base64", end))
        if _HEX_LINE.match(window, first, pos):  # escaped breaks: the JSON string's, decoded first
            starts.append((first, "hexdump" if window[pos] == 0x0A else ESCAPED, end))
        m = codecs.B64_BLOCK.match(window, pos)
        block_end = m.end() if m else pos
    return starts


def _breaks(window: bytes) -> list[tuple[int, int]]:
    """(start, end) of the line breaks that may be inside a base64 block, in order. Real line breaks: the
    automaton, unless a probe of the window's first 64 KiB finds them dense (logs and prose, where most
    lines start with a letter or a digit): there a regex checks the line before every break in C."""
    # No `b"\\n" in window` first: CPython searches for a two-byte string at 1.4 ns a byte, the automaton
    # (a rare first byte) at 0.015.
    out = [(s, e) for _, s, e in _BREAK_AUTOMATA[1].find_matches_as_indexes(window)]
    lf = _BREAK_AUTOMATA[0]
    if len(lf.find_matches_as_indexes(memoryview(window)[: 1 << 16])) > _DENSE:
        out += [(m.start(), m.end()) for m in _WRAPPED_LINE.finditer(window)]
    else:  # the line before each break is checked in C too; `_line_start` sees only the lines that pass
        out += [(s, e) for _, s, e in lf.find_matches_as_indexes(window)
                if s >= MIN_LINE and _LINE_TAIL.match(window, s - MIN_LINE, s)]
    return sorted(out)


def _line(window: bytes, brk: int) -> tuple[int, int] | None:
    """Where the line ending at the break `brk` starts, and its length, if it is MIN_LINE to LINE_LOOKBACK
    base64 characters (`brk` is the break's LF or the backslash of its `\\n`; a CR or `\\r` before it is
    skipped)."""
    end = brk
    while end > 0 and window[end - 1] in b"\r\\":  # the CR of CRLF, or backslashes of a nested `\\n`
        end -= 1
    if end > 1 and window[end - 1] == ord("r") and window[end - 2] == ord("\\"):  # an escaped `\\r\\n`
        end -= 1
        while end > 0 and window[end - 1] == ord("\\"):
            end -= 1
    start, lo = end, max(0, end - LINE_LOOKBACK)
    while start > lo and window[start - 1] in B64_CHARS:
        start -= 1
    if start == lo and lo > 0:
        return None  # longer than any wrapped line: not a line of a wrapped block
    if start and window[start - 1] == 0x5C and window[start] in b"nr":
        start += 1  # the letter of an escaped break (`\\n`) before the line: the line starts after it
    return (start, end - start) if end - start >= MIN_LINE else None


def _block_start(window: bytes, line_start: int, width: int) -> int:
    """The block's first character: walk back over the lines before `line_start` while each is a whole
    line of `width` base64 characters, as an encoder wraps them (the one before an empty line, a shorter
    or longer line, or text, is not part of the block)."""
    while True:
        m = _BREAK_BEFORE.search(window, max(0, line_start - 8), line_start)
        if m is None:
            return line_start
        start = m.start()
        while start > 0 and window[start - 1] in B64_CHARS:
            start -= 1
        if start > 0 and window[start - 1] == ord("\\"):
            start += 1  # the letter of an escaped break (`\\n`) before the line: the line starts after it
        elif start > 0 and window[start - 1] not in _BLOCK_OPENERS:
            return line_start  # the line starts in the middle of text
        if m.start() - start != width:
            return line_start  # an empty line, or one of another width: not the block's
        line_start = start

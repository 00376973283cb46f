"""Where a decodable layer may start in a window of bytes: the containers the scanner looks inside.

- compression by magic bytes: gzip members (`1f 8b 08`: rotated `*.gz` logs, concatenated members),
  zlib streams (`78 01|5e|9c|da`), zip entries (raw deflate), xz, bz2 and zstd frames; and at the start of
  a file, the formats without a magic number: raw deflate, brotli, lzma (`.lzma`) and a chunked body;
- base64 blocks the matcher's patterns cannot see through: blocks wrapped at any column (real line
  breaks, LF or CRLF, or JSON-escaped ones, `\\n`, inside a JSON string or a JSON string holding JSON)
  and blocks that hold a compressed stream (`H4sI...` is gzip); a block's first line may start anywhere;
- HTTP chunked transfer-encoding after a `Transfer-Encoding: chunked` header.

A start found here is only a candidate: `harness.detect.stream` decodes it with `harness.detect.codecs`,
and a candidate that decodes to nothing costs nothing more.
"""

from __future__ import annotations

import re
import struct

import ahocorasick_rs

from harness.detect import codecs

#: Decoded stream starts, by magic number. The base64 forms of compressed streams start a base64 block.
_MAGICS = (
    (b"\x1f\x8b\x08", "gzip"),
    *((m, "zlib") for m in (b"\x78\x01", b"\x78\x5e", b"\x78\x9c", b"\x78\xda")),
    (b"PK\x03\x04", "zip"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"BZh", "bz2"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    *((m, "base64") for m in (b"H4sI", b"/Td6WFo", b"QlpoO", b"QlpoM", b"QlpoN", b"KLUv/")),
    *((m, "chunked") for m in (b"chunked", b"Chunked", b"CHUNKED")),  # a Transfer-Encoding header's value
)
# Leftmost-first, not overlapping, is what lets ahocorasick-rs use its SIMD searcher: 10-25x faster on text
# (no two magic numbers overlap, so no start is lost).
_MAGIC_AUTOMATON = ahocorasick_rs.BytesAhoCorasick([m for m, _ in _MAGICS],
                                                   matchkind=ahocorasick_rs.MatchKind.LeftmostFirst)
_B64_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_")
#: A line break followed by a base64 character: inside a wrapped block, if a line of them comes before.
#: One automaton per kind of break (each small enough for the SIMD searcher), or a regex (`_breaks`).
_BREAK_AUTOMATA = [
    ahocorasick_rs.BytesAhoCorasick([brk + bytes([c]) for c in sorted(_B64_CHARS)],
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
_CHUNKED_HEADER = re.compile(rb"(?i)transfer-encoding:[ \t]*chunked[ \t]*\r\n(?:[^\r\n]+\r\n)*\r\n")
_CHUNK_LINE = re.compile(rb"[0-9a-fA-F]{1,8}[ \t]*(?:;[^\r\n]*)?\r\n")
_BZ2_BLOCK = (b"1AY&SY", b"\x17rE8P\x90")


def layer_starts(window: bytes, *, top: bool) -> list[tuple[int, str, int]]:
    """(offset, codec, end of what shows it) of every layer that may start in `window`, in offset order.
    The window whose bytes show a start (its magic number, a block's first line break) decodes it. `top`:
    the window is the first of a file, where the formats without a magic number are tried at offset 0."""
    starts = []
    for idx, pos, end in _MAGIC_AUTOMATON.find_matches_as_indexes(window):
        name = _MAGICS[idx][1]
        if name == "gzip":
            if pos + 3 < len(window) and not window[pos + 3] & 0xE0:  # reserved FLG bits clear
                starts.append((pos, "gzip", end))
        elif name == "zip":
            if pos + 30 <= len(window):  # zip local file header: method, name and extra lengths
                (method,) = struct.unpack_from("<H", window, pos + 8)
                nlen, xlen = struct.unpack_from("<HH", window, pos + 26)
                if method == 8:
                    starts.append((pos + 30 + nlen + xlen, "deflate", end))
        elif name == "bz2":
            if window[pos + 4 : pos + 10] in _BZ2_BLOCK and window[pos + 3 : pos + 4] in b"123456789":
                starts.append((pos, "bz2", end))
        elif name == "base64":
            if (pos == 0 or window[pos - 1] not in _B64_CHARS) and len(window) - pos > MIN_LINE:
                starts.append((pos, "base64", end))
        elif name == "chunked":
            header = _CHUNKED_HEADER.search(window, max(0, pos - 64), pos + 8192)
            if header is not None and header.start() <= pos:
                starts.append((header.end(), "chunked", end))
        else:
            starts.append((pos, name, end))
    # A wrapped block is text: not looked for in a window with no line break (memchr: most SQLite cells)
    # or in binary data (NUL bytes in its first 4 KiB: raw SQLite pages, compressed or random bytes,
    # whose text is scanned where it is decoded, as a cell or a stream).
    if b"\n" in window and window.count(0, 0, 4096) < 4:
        starts += _wrapped_blocks(window)
    if top and not any(pos == 0 for pos, _, _ in starts):
        starts += [(0, codec, 1) for codec in _headerless(window)]
    return sorted(set(starts))


def _wrapped_blocks(window: bytes) -> list[tuple[int, str, int]]:
    """Every base64 block in `window` that holds a line break (a break after a line of at least MIN_LINE
    base64 characters, followed by one): (its first character, "base64", the end of its first break)."""
    starts = []
    block_end = -1
    for pos, end in _breaks(window):
        if pos <= block_end:
            continue
        line_start = _line_start(window, pos)
        if line_start is None:
            continue
        starts.append((_block_start(window, line_start), "base64", end))
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


def _line_start(window: bytes, brk: int) -> int | None:
    """Where the line ending at the break `brk` starts, if it is MIN_LINE to LINE_LOOKBACK base64
    characters (`brk` is the break's LF or the backslash of its `\\n`; a CR or `\\r` before it is skipped)."""
    end = brk
    while end > 0 and window[end - 1] in b"\r\\":  # the CR of CRLF, or backslashes of a nested `\\n`
        end -= 1
    if end > 1 and window[end - 1] == ord("r") and window[end - 2] == ord("\\"):  # an escaped `\\r\\n`
        end -= 1
        while end > 0 and window[end - 1] == ord("\\"):
            end -= 1
    start, lo = end, max(0, end - LINE_LOOKBACK)
    while start > lo and window[start - 1] in _B64_CHARS:
        start -= 1
    if start == lo and lo > 0:
        return None  # longer than any wrapped line: not a line of a wrapped block
    return start if end - start >= MIN_LINE else None


def _block_start(window: bytes, line_start: int) -> int:
    """The block's first character: walk back over the lines before `line_start` while each is a whole
    line of base64 characters (the one before an empty line, or text, is not part of the block)."""
    while True:
        m = _BREAK_BEFORE.search(window, max(0, line_start - 8), line_start)
        if m is None:
            return line_start
        start = m.start()
        while start > 0 and window[start - 1] in _B64_CHARS:
            start -= 1
        if start > 0 and window[start - 1] == ord("\\"):
            start += 1  # the letter of an escaped break (`\\n`) before the line: the line starts after it
        elif start > 0 and window[start - 1] not in _BLOCK_OPENERS:
            return line_start  # the line starts in the middle of text
        if start >= m.start():
            return line_start  # an empty line
        line_start = start


def _headerless(window: bytes) -> list[str]:
    """Formats with no magic number, tried at the start of a file: a file holding nothing else."""
    out = ["deflate", "br"]
    if window.startswith(b"\x5d\x00\x00"):
        out.append("lzma")
    if _CHUNK_LINE.match(window):
        out.append("chunked")
    return out

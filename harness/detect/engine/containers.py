"""Where a decodable layer may start in a window of bytes: the layers the scanner looks inside.

- compression by magic bytes: gzip members (`1f 8b 08`: rotated `*.gz` logs, concatenated members),
  zlib streams (`78 01|5e|9c|da`), zip entries (raw deflate), xz, bz2 and zstd frames; and at the start of
  a stream (a file, a decoded layer, a SQLite cell), the formats without a magic number: raw deflate,
  brotli, lzma (`.lzma`) and a chunked body (`BARE`);
- base64 blocks: wrapped at any column (real line breaks, LF or CRLF, or JSON-escaped ones, `\\n`, inside a
  JSON string or a JSON string holding JSON), blocks that hold a compressed stream (`H4sI...` is gzip) and
  any run of base64 characters long enough to hold a canary;
- runs of hex digits and percent-encoded runs long enough to hold a canary, and JSON strings that hold
  escaped binary data (`\\u001f\\u008b`) or escaped line breaks (`\\r\\n`);
- HTTP chunked transfer-encoding after a `Transfer-Encoding: chunked` header.

A start found here is only a candidate: `harness.detect.engine.walk` decodes it with `harness.detect.engine.codecs`,
and a candidate that decodes to nothing costs nothing more. Each start says what shows it (`Start.sign`):
a magic number or a header (`MAGIC`), a run of an encoding's characters (`RUN`), or nothing but its place at
the start of a stream (`BARE`).
"""

from __future__ import annotations

import functools
import re
import struct
from typing import NamedTuple

import ahocorasick_rs
import stringzilla

from harness.detect.engine import codecs

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
    (b"\\u00", "json"), (b"\\r\\n", "json"),  # in a JSON string: an escape of a byte, an escaped line break
    (b"\x00ustar\x00", "tar"), (b"\x00ustar  \x00", "tar"),  # a tar header's magic (POSIX, GNU), 257 bytes in
)
# Leftmost-first, not overlapping, is what lets ahocorasick-rs use its SIMD searcher: 10-25x faster on text
# (no two magic numbers overlap, so no start is lost). A tar header holds NUL bytes: its magic is looked for
# in binary windows only (in text it made the search 1.7x slower).
_MAGIC_NAMES = [[name for _, name in _MAGICS if binary or name != "tar"] for binary in (False, True)]
_MAGIC_AUTOMATA = [ahocorasick_rs.BytesAhoCorasick([m for m, name in _MAGICS if binary or name != "tar"],
                                                   matchkind=ahocorasick_rs.MatchKind.LeftmostFirst)
                   for binary in (False, True)]
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


MAGIC, RUN, BARE = "magic", "run", "bare"


class Start(NamedTuple):
    """A candidate layer: its first byte in the window, its codec, the end of the bytes that show it (the
    window they end in decodes it) and what shows it (`MAGIC`, `RUN` or `BARE`)."""

    pos: int
    codec: str
    seen: int
    sign: str


def layer_starts(window: bytes, *, top: bool, min_bytes: int) -> list[Start]:
    """Every layer that may start in `window`, in the order to decode them: by offset, and at one offset a
    layer that keeps the bytes it does not decode first (`codecs.KEEPING`: what starts inside it starts in
    its output too). `top`: the window starts a stream, where the formats without a magic number are tried.
    `min_bytes`: the fewest bytes a run must decode to (no layer shorter than a canary can hold one)."""
    # Runs are text: not looked for in binary data (NUL bytes in its first 4 KiB: raw SQLite pages, archives,
    # compressed or random bytes, whose text is scanned where it is decoded, as a cell, a member or a stream);
    # a wrapped block not in a window with no line break, real or escaped, either (memchr: most SQLite cells).
    text = window.count(0, 0, 4096) < 4
    starts, escapes = _magic_starts(window, text)
    if escapes:
        starts += _json_strings(window, escapes)
    if text:
        if b"\n" in window or (b"\\" in window and b"\\n" in window):
            starts += _wrapped_blocks(window)
        if len(window) >= min_bytes:
            starts += _runs(window, min_bytes)
            if b"%" in window:
                starts += _url_runs(window, min_bytes)
    if top and not (starts and any(s.pos == 0 and s.codec not in codecs.TEXT for s in starts)):  # no magic number
        starts += [Start(0, codec, 1, BARE) for codec in _headerless(window)]
    if len(starts) < 2:
        return starts
    first: dict[tuple[int, str], Start] = {}
    for s in sorted(starts, key=lambda s: (s.sign != MAGIC, s.seen)):  # one start per offset and codec
        first.setdefault((s.pos, s.codec), s)
    return sorted(first.values(), key=lambda s: (s.pos, s.codec not in codecs.KEEPING, s.codec))


#: Joins values that `may_start` looks at together: no layer, run or string holds it.
SEPARATOR = b"\x01"
def island_starts(window: bytes, min_bytes: int) -> list[Start]:
    """The runs (base64, hex, percent-encoded) and wrapped base64 blocks of a binary window, which `layer_starts`
    looks for in text only: for a database's raw pages, where a deleted row's text is no value any more, so no
    cell's stream holds it. A run stops at the first byte that is none of its characters, a NUL byte too."""
    starts = _runs(window, min_bytes) + _wrapped_blocks(window)
    return starts + _url_runs(window, min_bytes) if b"%" in window else starts


def may_start(values: list[bytes], min_bytes: int) -> bool:
    """False if no layer can start in any of `values` (text without a NUL byte), each a stream of its own,
    told by one pass over them joined by SEPARATOR: `layer_starts` finds nothing there, no value's first bytes
    may start a format without a magic number, and no CR may end a chunk-size line."""
    joined = SEPARATOR.join(values)
    if b"\r" in joined or layer_starts(joined, top=False, min_bytes=min_bytes):
        return True
    return bool(b"".join(v[:32] for v in values).translate(None, _TEXT))


def _magic_starts(window: bytes, text: bool) -> tuple[list[Start], list[tuple[int, int]]]:
    """The starts a magic number or a header shows, and (start, end) of each JSON escape the same pass found
    (`_json_strings` checks them). `text`: no NUL byte in the window's start (no tar header either)."""
    starts, escapes = [], []
    names = _MAGIC_NAMES[not text]
    for idx, pos, end in _MAGIC_AUTOMATA[not text].find_matches_as_indexes(window):
        name = names[idx]
        if name == "gzip":
            if pos + 3 < len(window) and not window[pos + 3] & 0xE0:  # reserved FLG bits clear
                starts.append(Start(pos, "gzip", end, MAGIC))
        elif name == "zip":
            if pos + 30 <= len(window):  # zip local file header: method, name and extra lengths
                (method,) = struct.unpack_from("<H", window, pos + 8)
                nlen, xlen = struct.unpack_from("<HH", window, pos + 26)
                if method == 8:
                    starts.append(Start(pos + 30 + nlen + xlen, "deflate", end, MAGIC))
                elif method == 0:  # stored: the member's bytes are a stream of their own
                    starts.append(Start(pos, "zip", end, MAGIC))
        elif name == "bz2":
            if window[pos + 4 : pos + 10] in _BZ2_BLOCK and window[pos + 3 : pos + 4] in b"123456789":
                starts.append(Start(pos, "bz2", end, MAGIC))
        elif name == "base64":
            if (pos == 0 or window[pos - 1] not in _B64_CHARS) and len(window) - pos > MIN_LINE:
                starts.append(Start(pos, "base64", end, MAGIC))
        elif name == "chunked":
            header = _CHUNKED_HEADER.search(window, max(0, pos - 64), pos + 8192)
            if header is not None and header.start() <= pos:
                starts.append(Start(header.end(), "chunked", end, MAGIC))
        elif name == "json":
            escapes.append((pos, end))
        elif name == "tar":
            if pos >= 256:  # the NUL before the magic ends the header's link name
                starts.append(Start(pos - 256, "tar", end, MAGIC))
        else:
            starts.append(Start(pos, name, end, MAGIC))
    return starts, escapes


#: What follows `\u00` in an escape of a byte that is no printable ASCII character (binary data); `\r\n`
#: needs nothing.
_BYTE_ESCAPE = re.compile(rb"[01][0-9a-fA-F]|7[fF]|[89a-fA-F][0-9a-fA-F]")


def _json_strings(window: bytes, escapes: list[tuple[int, int]]) -> list[Start]:
    """The JSON strings holding an escape of binary data or an escaped CRLF (`escapes`: where `\\u00` and
    `\\r\\n` are), each from just after its opening quote (looked for up to LINE_LOOKBACK bytes back; else
    from the escape's first backslash). One start per string."""
    starts = []
    string_end = -1
    for pos, end in escapes:
        if pos < string_end or (window[pos + 1] == ord("u") and not _BYTE_ESCAPE.match(window, end)):
            continue
        first = pos
        while first > 0 and window[first - 1] == 0x5C:  # backslashes escaping it again (a JSON string in JSON)
            first -= 1
        quote = _opening_quote(window, first)
        starts.append(Start(first if quote < 0 else quote + 1, "json", end, RUN))
        close = codecs.closing_quote(window, end)
        string_end = len(window) if close < 0 else close
    return starts


def _opening_quote(window: bytes, pos: int) -> int:
    """The last quote before `pos` (up to LINE_LOOKBACK bytes back) that no backslash escapes, or -1."""
    lo = max(0, pos - LINE_LOOKBACK)
    quote = window.rfind(b'"', lo, pos)
    while quote >= 0:
        first = quote
        while first > lo and window[first - 1] == 0x5C:
            first -= 1
        if (quote - first) % 2 == 0:
            return quote
        quote = window.rfind(b'"', lo, first)
    return -1


#: Each byte as 1 if it is a base64 character (standard or URL-safe), else 0.
_B64_MAP = bytes(c in _B64_CHARS for c in range(256))


def _runs(window: bytes, min_bytes: int) -> list[Start]:
    """The runs of base64 characters that decode to `min_bytes` or more, and the runs of hex digits inside
    them that do, from their first character (StringZilla's `translate`, SIMD, the same bytes as
    `bytes.translate` in a twentieth of its time on 256 KiB; then `bytes.find`)."""
    length, probe, hex_run = _run_probes(min_bytes)
    if len(window) < length:
        return []
    marks = stringzilla.translate(window, _B64_MAP)
    pos = marks.find(probe)
    if pos < 0:
        return []
    starts = []
    while pos >= 0:
        end = marks.find(b"\x00", pos + length)
        end = len(window) if end < 0 else end
        starts.append(Start(pos, "base64", pos + length, RUN))
        starts += [Start(m.start(), "hex", m.start() + 2 * min_bytes, RUN) for m in hex_run.finditer(window, pos, end)]
        pos = marks.find(probe, end)
    return starts


@functools.lru_cache(maxsize=16)
def _run_probes(min_bytes: int) -> tuple[int, bytes, re.Pattern[bytes]]:
    """For runs that decode to `min_bytes`: the base64 characters they hold, the string of 1s `_B64_MAP`
    makes of them, and a regex for the hex digits they hold."""
    length = -(-min_bytes * 4 // 3)
    return length, b"\x01" * length, re.compile(rb"[0-9a-fA-F]{%d,}" % (2 * min_bytes))


_HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")
_URL_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~!*'()+/-")


def _url_runs(window: bytes, min_bytes: int) -> list[Start]:
    """The percent-encoded runs (holding an escape) that decode to `min_bytes` or more, from their first
    character (looked for up to LINE_LOOKBACK bytes before their first escape)."""
    starts = []
    pos = window.find(b"%")
    while pos >= 0:
        if pos + 2 < len(window) and window[pos + 1] in _HEX_DIGITS and window[pos + 2] in _HEX_DIGITS:
            first, lo = pos, max(0, pos - LINE_LOOKBACK)
            while first > lo and window[first - 1] in _URL_CHARS:
                first -= 1
            end = codecs.URL_RUN.match(window, first).end()  # type: ignore[union-attr]  # `*` matches anywhere
            if end - first - 2 * window.count(b"%", first, end) >= min_bytes:
                starts.append(Start(first, "url", pos + 3, RUN))
            pos = max(pos + 1, end)
        pos = window.find(b"%", pos + 1)
    return starts


def _wrapped_blocks(window: bytes) -> list[Start]:
    """Every base64 block in `window` that holds a line break (a break after a line of at least MIN_LINE
    base64 characters, followed by one), from its first character; seen at the end of its first break."""
    starts = []
    block_end = -1
    for pos, end in _breaks(window):
        if pos <= block_end:
            continue
        line = _line(window, pos)
        if line is None:
            continue
        starts.append(Start(_block_start(window, *line), "base64", end, MAGIC))
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
    while start > lo and window[start - 1] in _B64_CHARS:
        start -= 1
    if start == lo and lo > 0:
        return None  # longer than any wrapped line: not a line of a wrapped block
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
        while start > 0 and window[start - 1] in _B64_CHARS:
            start -= 1
        if start > 0 and window[start - 1] == ord("\\"):
            start += 1  # the letter of an escaped break (`\\n`) before the line: the line starts after it
        elif start > 0 and window[start - 1] not in _BLOCK_OPENERS:
            return line_start  # the line starts in the middle of text
        if m.start() - start != width:
            return line_start  # an empty line, or one of another width: not the block's
        line_start = start


#: Printable ASCII, tab and line breaks.
_TEXT = bytes(range(0x20, 0x7F)) + b"\t\n\r"


def _headerless(window: bytes) -> list[str]:
    """Formats with no magic number, tried at the start of a stream: a stream holding nothing else. Raw
    deflate and brotli only where the first 32 bytes are not all text: their headers, and the bits that
    follow, make a byte that is no printable character within a few bytes."""
    out = ["deflate", "br"] if window[:32].translate(None, _TEXT) else []
    if window.startswith(b"\x5d\x00\x00"):
        out.append("lzma")
    if window and window[0] in _HEX_DIGITS and _CHUNK_LINE.match(window):
        out.append("chunked")
    return out

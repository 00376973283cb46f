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

from harness.detect.engine import codecs, dumps, mail, markup, signs, utf16, wrapped
from harness.detect.engine.wrapped import LINE_LOOKBACK

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
    (b"\\\\r\\\\n", "json"),  # ... escaped again (a JSON string holding JSON)
    (b"\x00ustar\x00", "tar"), (b"\x00ustar  \x00", "tar"),  # a tar header's magic (POSIX, GNU), 257 bytes in
)
# Leftmost-first, not overlapping, is what lets ahocorasick-rs use its SIMD searcher: 10-25x faster on text
# (no two magic numbers overlap, so no start is lost). A tar header holds NUL bytes: its magic is looked for
# in binary windows only (in text it made the search 1.7x slower). The signs of the text framings are looked for
# in text only (`signs`: in a compressed stream's bytes they are chance).
_MAGIC_NAMES = [[name for _, name in _MAGICS if binary or name != "tar"] for binary in (False, True)]
_MAGIC_AUTOMATA = [ahocorasick_rs.BytesAhoCorasick([m for m, name in _MAGICS if binary or name != "tar"],
                                                   matchkind=ahocorasick_rs.MatchKind.LeftmostFirst)
                   for binary in (False, True)]
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


def layer_starts(window: bytes, *, top: bool, min_bytes: int, paged: bool = False,
                 text_signs: signs.Signs | None = None) -> list[Start]:
    """Every layer that may start in `window`, in the order to decode them: by offset, and at one offset a
    layer that keeps the bytes it does not decode first (`codecs.KEEPING`: what starts inside it starts in
    its output too). `top`: the window starts a stream, where the formats without a magic number are tried.
    `min_bytes`: the fewest bytes a run must decode to (no layer shorter than a canary can hold one). `paged`:
    a database's raw pages, whose text the database is read for (no UTF-16 run is looked for there).
    `text_signs`: `signs.find` of the window, when the caller has it already."""
    # Runs are text: not looked for in binary data (NUL bytes in its first 4 KiB: raw SQLite pages, archives,
    # compressed or random bytes, whose text is scanned where it is decoded, as a cell, a member or a stream);
    # a wrapped block not in a window with no line break, real or escaped, either (memchr: most SQLite cells).
    text = window.count(0, 0, 4096) < 4
    starts, escapes = _magic_starts(window, text)
    stray: list[int] = []  # a framing's lines made by a JSON string's escaped line breaks
    if text:
        found = signs.find(window) if text_signs is None else text_signs
        if found[signs.QP] or found[signs.WORD] or found[signs.REFERENCE]:
            starts += _framings(window, found, min_bytes)
        escapes += [(pos + 1, end) for pos, end in found[signs.QP_ESCAPED]  # the JSON string, decoded first
                    if mail.escaped_soft_break(window, pos)]
        if b"\n" in window or (b"\\" in window and b"\\n" in window):
            for pos, codec, seen in wrapped.blocks(window):
                if codec == wrapped.ESCAPED:
                    stray.append(pos)
                else:
                    starts.append(Start(pos, codec, seen, MAGIC))
        if len(window) >= min_bytes:
            marks = b64_marks(window)
            starts += _runs(window, marks, min_bytes)
            if b"%" in window:
                starts += _url_runs(window, min_bytes)
            if found[signs.DUMP_HEAD] or window.startswith((b"000", b" ")):
                dumped, rows = dumps.starts(window, marks, found[signs.DUMP_HEAD], min_bytes)
                starts += [Start(first, "hexdump", seen, RUN) for first, seen in dumped]
                stray += rows
    if escapes:
        starts += _json_strings(window, sorted(escapes))
    if not paged and 0 in window:
        starts += [Start(pos, codec, seen, RUN) for pos, codec, seen in utf16.starts(window, min_bytes)]
    if stray:
        starts += escaped_strings(window, sorted(stray))
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
    starts = _runs(window, b64_marks(window), min_bytes) + [Start(pos, codec, seen, MAGIC)
                                                           for pos, codec, seen in wrapped.blocks(window)
                                         if codec != wrapped.ESCAPED]
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
            if (pos == 0 or window[pos - 1] not in wrapped.B64_CHARS) and len(window) - pos > wrapped.MIN_LINE:
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


def _framings(window: bytes, found: signs.Signs, min_bytes: int) -> list[Start]:
    """The starts the signs of the text framings show: quoted-printable (a soft line break, on a line of text, not
    the end of an encoded word), encoded words, runs of character references."""
    starts = []
    for pos, end in found[signs.QP]:
        first = mail.qp_start(window, pos)
        if first is not None and not mail.word_ends(window, pos):
            starts.append(Start(first, "qp", end, MAGIC))
    starts += [Start(pos, "rfc2047", end, MAGIC) for pos, end in found[signs.WORD] if mail.WORD.match(window, pos)]
    references = [pos for pos, _ in found[signs.REFERENCE]]
    return starts + [Start(first, "html", seen, RUN) for first, seen in markup.starts(window, references, min_bytes)]


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


def escaped_strings(window: bytes, positions: list[int]) -> list[Start]:
    """The JSON string around each of `positions` (in order) that holds escaped line breaks (`\\n`): the lines of
    a framing written in a JSON string, as a tool's output is (a dump, quoted-printable, line-delimited records),
    which the framing's decoder reads once the string is decoded. Each from just after its opening quote (looked
    for up to LINE_LOOKBACK bytes back; else just after the escaped break before the position)."""
    starts = []
    string_end = -1
    for pos in positions:
        if pos < string_end:
            continue
        line = window.rfind(b"\n", max(0, pos - LINE_LOOKBACK), pos) + 1  # a JSON string holds no real break
        brk = window.rfind(b"\\n", line, pos)
        if brk < 0:  # on the string's first line, maybe
            brk = window.find(b"\\n", pos, pos + LINE_LOOKBACK)
            if brk < 0 or b"\n" in window[pos:brk]:
                continue
        quote = _opening_quote(window, pos)
        if quote >= line:
            first = quote + 1
        elif brk < pos:
            first = brk + 2
        else:
            continue
        starts.append(Start(first, "json", pos + 1, RUN))
        close = codecs.closing_quote(window, pos)
        string_end = len(window) if close < 0 else close
    return starts


#: Each byte as 1 if it is a base64 character (standard or URL-safe), else 0.
_B64_MAP = bytes(c in wrapped.B64_CHARS for c in range(256))


def b64_marks(window: bytes) -> bytes:
    """Each byte of `window` as 1 if it is a base64 character (a hex digit too), else 0 (StringZilla's `translate`,
    SIMD, the same bytes as `bytes.translate` in a twentieth of its time on 256 KiB)."""
    return stringzilla.translate(window, _B64_MAP)


def _runs(window: bytes, marks: bytes, min_bytes: int) -> list[Start]:
    """The runs of base64 characters that decode to `min_bytes` or more, and the runs of hex digits inside
    them that do, from their first character (`marks`: `b64_marks`, searched with `bytes.find`)."""
    length, probe, hex_run = _run_probes(min_bytes)
    if len(window) < length:
        return []
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

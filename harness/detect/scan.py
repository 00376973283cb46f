"""The scanner: every canary of every tenant in files, trees, names, compressed streams, SQLite and text.

Built on `harness.detect.matcher.Matcher` (one automaton, every encoding, one pass) and the streaming
decoders of `harness.detect.codecs`. Everything is read as a stream, in windows of `WINDOW` bytes that
overlap by the longest encoded pattern, so memory stays bounded whatever the size of a file or of what it
inflates to. In each window the scanner finds the canaries, then the containers that start there, and
scans what each decodes to as a stream of its own ("layers", to `Limits.depth`):

- compression by magic bytes: gzip members (`1f 8b 08`: rotated `*.gz` logs, concatenated members),
  zlib streams (`78 01|5e|9c|da`), zip entries (raw deflate), xz, bz2 and zstd frames; and at the start of
  a file, the formats without a magic number: raw deflate, brotli, lzma (`.lzma`) and a chunked body;
- base64 blocks the matcher's patterns cannot see through: blocks wrapped at any column (real line
  breaks, LF or CRLF, or JSON-escaped ones, `\\n`, inside a JSON string or a JSON string holding JSON)
  and blocks that hold a compressed stream (`H4sI...` is gzip); a block's first line may start anywhere;
- HTTP chunked transfer-encoding after a `Transfer-Encoding: chunked` header;
- SQLite files (`SQLite format 3\\0`): the raw bytes, and every value of every column of every table
  (FTS shadow tables and `sqlite_master` included) read with `sqlite3` from a private copy of the database
  and its `-wal`/`-journal`, so a canary that straddles an overflow page or lives only in the WAL is found.

A decoded layer counts against `Limits` (`stream_bytes` per stream, `total_bytes` per file, `depth`). A
limit that stops reading, and any file not read (unreadable, a FIFO, a socket, a symlink not followed) is
a `NotInspected` entry; one that left part of a file unread (`partial`) makes an audit inconclusive.
A corrupt or truncated stream still has its decodable prefix scanned.

Reporting scheme (`ScanHit`):
- `container` is None for the raw bytes, else the layers joined by `/`: `gzip`, `zlib`, `deflate`, `xz`,
  `lzma`, `bz2`, `zstd`, `br`, `base64`, `chunked`, `sqlite:<table>.<column>#<rowid>`, e.g.
  `sqlite:messages.content#3/gzip` for a gzip blob in a cell, `base64/gzip` for a gzip in a base64 block.
- `offset` is the canary's byte offset inside the innermost layer (decoded bytes, or the cell value as
  UTF-8 / blob bytes); `layers` also records where each layer starts in its parent (None for a cell).
- `encoding` is the matcher's encoding prefixed by every decoded layer, a trailing `plain` dropped:
  `plain`, `base64`, `gzip` (plain text in a gzip stream), `gzip/base64`, `base64/gzip`, `zlib/utf16le`.
  SQLite is a container, not an encoding: a plain canary in a cell has encoding `plain`.
- `location(label)`: `path@OFFSET` for the raw bytes, `path@AT:gzip@OFFSET` in a stream that starts at AT,
  `path:sqlite:messages.content#3@OFFSET` in a cell.
- A base64 block or chunked body is also scanned as raw bytes; a canary its raw bytes already show (an
  unwrapped base64 form) is reported there, once, not again in the decoded layer.

Names: `scan_tree` scans every path below the root (directories, files, symlinks and their targets) as
text; a canary in a name is a `file_leak` at `PATH:name@OFFSET` (encoding `name`, `name/url`, ...).

Which canaries count: with an `owner`, every canary of every other tenant; with no owner, the secrets
(`is_secret_kind`) of every tenant. Evidence, locations and paths are always redacted with the matcher of
the whole registry.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import stat
import struct
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ahocorasick_rs

from harness.core.findings import Finding
from harness.core.registry import Registry, is_secret_kind
from harness.detect import codecs
from harness.detect.matcher import Hit, Matcher, matcher_for

#: Bytes read per window (each window also holds the last `Matcher.longest` bytes of the one before).
WINDOW = 4 << 20
SQLITE_MAGIC = b"SQLite format 3\x00"
#: Layers that re-encode bytes which are scanned raw too (a canary their raw bytes show is reported there).
TRANSFORMS = frozenset({"base64", "chunked"})
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

Layer = tuple[str, int | None]  # (name, where it starts in its parent; None for a SQLite cell)
Reopen = Callable[[int], Iterator[bytes]]  # the stream's bytes again, from an offset


@dataclass(frozen=True)
class Limits:
    """What the scanner reads at most. Each limit it reaches is reported (`NotInspected`), never silent."""

    stream_bytes: int = 256 << 20  # decoded bytes read from one compressed stream
    total_bytes: int = 1 << 30  # decoded bytes read from all the compressed streams of one file
    depth: int = 4  # containers inside containers: a gzip in a base64 block in a SQLite cell ...


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class NotInspected:
    """A file, or a layer of one, that was not read to its end: where, why, how many bytes were read, and
    whether part of it went unread (`partial`: a secret could be there, so the audit is inconclusive)."""

    path: str
    reason: str
    bytes_read: int = 0
    partial: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "reason": self.reason, "bytes_read": self.bytes_read, "partial": self.partial}

    def summary(self) -> str:
        return f"{self.path}: {self.reason} ({self.bytes_read} bytes read)"


@dataclass(frozen=True)
class ScanHit:
    """One canary occurrence, with the containers it was found in."""

    hit: Hit
    layers: tuple[Layer, ...] = ()
    evidence: str = ""

    @property
    def tenant(self) -> str:
        return self.hit.tenant

    @property
    def kind(self) -> str:
        return self.hit.kind

    @property
    def offset(self) -> int:
        return self.hit.start

    @property
    def container(self) -> str | None:
        return "/".join(name for name, _ in self.layers) or None

    @property
    def encoding(self) -> str:
        codecs_ = [name for name, at in self.layers if at is not None]
        if self.hit.encoding != "plain" or not codecs_:
            codecs_.append(self.hit.encoding)
        return "/".join(codecs_)

    def location(self, label: str) -> str:
        return label + _where(self.layers) + f"@{self.offset}"


def _where(layers: Iterable[Layer]) -> str:
    return "".join(f"@{at}:{name}" if at is not None else f":{name}" for name, at in layers)


@dataclass
class TreeScan:
    """What a scan found; `unreadable` paths were not scanned and must be reported; `not_inspected` lists
    everything not read to its end; `notes` explain the rest (excluded homes)."""

    findings: list[Finding] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    not_inspected: list[NotInspected] = field(default_factory=list)
    files: int = 0
    bytes: int = 0

    def __iter__(self) -> Iterator[list]:
        """`findings, unreadable = scan_paths(...)`."""
        return iter((self.findings, self.unreadable))

    def merge(self, other: TreeScan) -> None:
        self.findings += other.findings
        self.unreadable += other.unreadable
        self.notes += other.notes
        self.not_inspected += other.not_inspected
        self.files += other.files
        self.bytes += other.bytes

    def reasons(self) -> list[str]:
        """Why a verdict over this scan cannot be `clean`: every file read only in part."""
        return [f"not fully inspected: {n.summary()}" for n in self.not_inspected if n.partial]


# -- the streaming scan -------------------------------------------------------------------------------------


class _Scan:
    """One top-level scan (a file or a buffer): its hits, what it could not read, its decoding budget."""

    def __init__(self, matcher: Matcher, limits: Limits) -> None:
        self.matcher = matcher
        self.limits = limits
        self.remaining = limits.total_bytes
        self.hits: list[ScanHit] = []
        self.skipped: list[tuple[tuple[Layer, ...], str, int]] = []  # (layers, reason, bytes read)
        # A hit must lie whole in one window with the base64 character on either side of it, and a wrapped
        # block's line (up to LINE_LOOKBACK bytes) with the break after it.
        self.overlap = max(matcher.longest + 8, LINE_LOOKBACK + 8)

    def stream(self, chunks: Iterable[bytes], layers: tuple[Layer, ...], reopen: Reopen, *, top: bool,
               sqlite_path: Path | None = None) -> None:
        """Scan the bytes of `chunks` window by window, and every layer that starts in them.

        A hit (or a container start) belongs to the window its end falls in: each window owns the bytes up
        to its last one but one (the last one only in the final window), so a base64 form's closing
        character is always in the window that reports it.
        """
        if type(chunks) is tuple and len(chunks) == 1:  # one buffer (a SQLite cell, a body): one window
            (window,) = chunks
            self._window(window, 0, 0, len(window), 0, layers, reopen, top)
            if window.startswith(SQLITE_MAGIC):
                self._sqlite(layers, reopen, sqlite_path)
            return
        owned_from = 0  # absolute offset: what ends at or before it was handled by an earlier window
        skip_until = 0  # absolute offset: the end of the last base64 block or chunked body decoded
        base = 0  # absolute offset of the window's first byte
        tail = b""
        sqlite = False
        for chunk, last in _windows(chunks):
            window = tail + chunk if tail else chunk
            limit = base + len(window) - (0 if last else 1)
            if base == 0 and window.startswith(SQLITE_MAGIC):
                sqlite = True
            skip_until = self._window(window, base, owned_from, limit, skip_until, layers, reopen, top and base == 0)
            owned_from = limit
            if last:
                break
            tail = window[-self.overlap :]
            base += len(window) - len(tail)
        if sqlite:
            self._sqlite(layers, reopen, sqlite_path)

    def _window(self, window: bytes, base: int, owned_from: int, limit: int, skip_until: int,
                layers: tuple[Layer, ...], reopen: Reopen, top: bool) -> int:
        """Scan one window (its first byte at absolute offset `base`): the hits and layer starts it owns
        (ending in (owned_from, limit]); returns the new `skip_until`."""
        for hit in self.matcher.find(window):
            if owned_from < base + hit.end <= limit:
                self.hits.append(ScanHit(replace(hit, start=base + hit.start, end=base + hit.end), layers,
                                         self.matcher.snippet(window, hit)))
        for pos, codec, seen in self._starts(window, top=top):
            at = base + pos
            if not owned_from < base + seen <= limit or at < skip_until:
                continue
            end = self._layer(window, pos, codec, layers, reopen, base + len(window), at)
            if end is not None:
                skip_until = max(skip_until, end)
        return skip_until

    def _starts(self, window: bytes, *, top: bool) -> list[tuple[int, str, int]]:
        """(offset, codec, end of what shows it) of every layer that may start in `window`, in offset order.
        The window whose bytes show a start (its magic number, a block's first line break) decodes it."""
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

    def _layer(self, window: bytes, pos: int, codec: str, layers: tuple[Layer, ...], reopen: Reopen,
               after: int, at: int) -> int | None:
        """Decode the layer of `codec` at window[pos] (absolute offset `at`) and scan it; returns where it
        ended in its parent, for a block or a chunked body that ended properly."""
        child = (*layers, (codec, at))
        progress = codecs.Progress()
        source = _rest(memoryview(window)[pos:], reopen, after)
        pieces = codecs.decode(codec, source, progress)
        if len(layers) >= self.limits.depth:
            if next(pieces, b""):  # something decodes there: a layer not inspected
                self.skipped.append((child, f"depth cap ({self.limits.depth} nested containers)", 0))
            return None
        if codec not in TRANSFORMS:
            pieces = self._capped(pieces, child)

        def again(offset: int) -> Iterator[bytes]:
            return _skip(codecs.decode(codec, reopen(at), codecs.Progress()), offset)

        self.stream(pieces, child, again, top=False)
        return at + progress.consumed if codec in TRANSFORMS else None

    def _capped(self, pieces: Iterator[bytes], layers: tuple[Layer, ...]) -> Iterator[bytes]:
        """`pieces` up to the stream and total limits; reaching one while output remains is recorded."""
        read = 0
        for piece in pieces:
            room = min(self.limits.stream_bytes - read, self.remaining)
            if room <= 0 or len(piece) > room:
                if room > 0:
                    read += room
                    self.remaining -= room
                    yield piece[:room]
                if read >= self.limits.stream_bytes:
                    reason = f"decompression cap ({self.limits.stream_bytes} bytes per stream)"
                else:
                    reason = f"decompression budget ({self.limits.total_bytes} bytes per file) exhausted"
                self.skipped.append((layers, reason, read))
                return
            read += len(piece)
            self.remaining -= len(piece)
            yield piece

    def _sqlite(self, layers: tuple[Layer, ...], reopen: Reopen, path: Path | None) -> None:
        """Scan every value of every table of a private copy of the database (plus its -wal/-journal)."""
        with tempfile.TemporaryDirectory(prefix="tenancy-scan-") as tmp:
            copy = Path(tmp) / "db"
            if path is not None:
                shutil.copyfile(path, copy)
                for suffix in ("-wal", "-journal"):
                    side = Path(f"{path}{suffix}")
                    if side.is_file() and not side.is_symlink():
                        shutil.copyfile(side, f"{copy}{suffix}")
            else:  # a database inside a layer: spooled to the copy, within the stream limit
                written = 0
                with copy.open("wb") as fh:
                    for piece in reopen(0):
                        fh.write(piece[: self.limits.stream_bytes - written])
                        written += len(piece)
                        if written > self.limits.stream_bytes:
                            self.skipped.append(((*layers, ("sqlite", None)), "sqlite: database larger than the "
                                                 f"stream cap ({self.limits.stream_bytes} bytes)", written))
                            break
            try:
                conn = sqlite3.connect(f"file:{copy}?mode=ro", uri=True)
                conn.text_factory = bytes
            except sqlite3.Error as exc:
                self.skipped.append(((*layers, ("sqlite", None)), f"sqlite: cannot open: {exc}", 0))
                return
            try:
                tables = [
                    r[0].decode("utf-8", "replace")
                    for r in conn.execute(
                        "SELECT name FROM sqlite_master"
                        " WHERE type = 'table' AND coalesce(sql, '') NOT LIKE 'CREATE VIRTUAL%'"
                    )
                ]
                for table in ["sqlite_master", *tables]:
                    self._table(conn, table, layers)
            except sqlite3.Error as exc:
                self.skipped.append(((*layers, ("sqlite", None)), f"sqlite: cannot read: {exc}", 0))
            finally:
                conn.close()

    def _table(self, conn: sqlite3.Connection, table: str, layers: tuple[Layer, ...]) -> None:
        quoted = '"' + table.replace('"', '""') + '"'
        try:
            cur = conn.execute(f"SELECT rowid, * FROM {quoted}")
            rowid_col = True
        except sqlite3.OperationalError:  # WITHOUT ROWID: number the rows instead
            cur = conn.execute(f"SELECT * FROM {quoted}")
            rowid_col = False
        names = [d[0] for d in cur.description][1 if rowid_col else 0 :]
        shortest = self.matcher.shortest
        for n, row in enumerate(cur):
            rowid = row[0] if rowid_col else n
            for column, value in zip(names, row[1:] if rowid_col else row, strict=True):
                if isinstance(value, bytes) and len(value) >= shortest:
                    cell = (*layers, (f"sqlite:{table}.{column}#{rowid}", None))
                    self.stream((value,), cell, _bytes_reopen(value), top=False)

    def result(self, not_inspected: list[NotInspected] | None, label: str = "") -> list[ScanHit]:
        """The hits, without those a decoded block repeats from its own raw bytes (see the module docstring)."""
        if not_inspected is not None:
            not_inspected += [NotInspected(label + _where(layers), reason, read)
                              for layers, reason, read in self.skipped]
        shown = {(h.tenant, h.kind, h.layers) for h in self.hits}
        return [h for h in self.hits
                if not (h.layers and h.layers[-1][0] in TRANSFORMS and (h.tenant, h.kind, h.layers[:-1]) in shown)]


def _windows(chunks: Iterable[bytes]) -> Iterator[tuple[bytes, bool]]:
    """`chunks` regrouped into windows of about WINDOW bytes, each with whether it is the last."""
    pending: list[bytes] = []
    size = 0
    ready: bytes | None = None
    for chunk in chunks:
        if not chunk:
            continue
        pending.append(bytes(chunk))
        size += len(chunk)
        if size >= WINDOW:
            if ready is not None:
                yield ready, False
            ready = pending[0] if len(pending) == 1 else b"".join(pending)
            pending, size = [], 0
    if pending:
        if ready is not None:
            yield ready, False
        ready = pending[0] if len(pending) == 1 else b"".join(pending)
    if ready is not None:
        yield ready, True


def _rest(view: memoryview, reopen: Reopen, after: int) -> Iterator[memoryview | bytes]:
    """What follows a layer's start: the rest of the window, then (only if the decoder needs it) the
    stream read again from the window's end."""
    yield view
    yield from reopen(after)


def _skip(pieces: Iterator[bytes], offset: int) -> Iterator[bytes]:
    for piece in pieces:
        if offset >= len(piece):
            offset -= len(piece)
            continue
        yield piece[offset:]
        offset = 0


def _bytes_reopen(data: bytes | memoryview) -> Reopen:
    def again(offset: int) -> Iterator[bytes]:
        if offset < len(data):
            yield bytes(data[offset:])

    return again


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


# -- entry points over bytes and files ----------------------------------------------------------------------


def scan_bytes(
    data: bytes | bytearray | memoryview,
    matcher: Matcher,
    *,
    limits: Limits = DEFAULT_LIMITS,
    not_inspected: list[NotInspected] | None = None,
    headerless: bool = True,
) -> list[ScanHit]:
    """Every canary in `data` and in the layers it contains (see the module docstring). `headerless`:
    also try the formats without a magic number at offset 0 (a file's bytes; not an HTTP body, whose
    content-encoding is in its headers)."""
    data = bytes(data)
    scan = _Scan(matcher, limits)
    scan.stream((data,), (), _bytes_reopen(data), top=headerless)
    return scan.result(not_inspected, "bytes")


def scan_file(
    path: Path | str,
    matcher: Matcher,
    *,
    limits: Limits = DEFAULT_LIMITS,
    not_inspected: list[NotInspected] | None = None,
    label: str | None = None,
) -> list[ScanHit]:
    """Scan one regular file as a stream; a SQLite database is also read logically together with its
    -wal/-journal. Raises OSError when the file cannot be opened or is not a regular file."""
    path = Path(path)
    fd = _open(path)
    scan = _Scan(matcher, limits)

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


# -- findings -----------------------------------------------------------------------------------------------


def _counts(hit: ScanHit | Hit, owner: str | None) -> bool:
    return hit.tenant != owner if owner is not None else is_secret_kind(hit.kind)


def _check_owner(registry: Registry, owner: str | None) -> None:
    if owner is not None and owner not in registry.tenants:
        raise ValueError(f"unknown tenant {owner!r}")


def _findings(hits: Iterable[ScanHit], owner: str | None, label: str, kind: str, channel: str) -> list[Finding]:
    """One finding per hit that counts against `owner`, located `label` + the hit's place."""
    return [
        Finding(
            kind=kind,
            victim=h.tenant,
            seen_in=owner,
            canary=h.kind,
            channel=channel,
            location=h.location(label),
            encoding=h.encoding,
            evidence=h.evidence,
        )
        for h in hits
        if _counts(h, owner)
    ]


def scan_text(
    text: str | bytes,
    registry: Registry,
    owner: str | None,
    *,
    label: str,
    channel: str = "log",
    matcher: Matcher | None = None,
    limits: Limits = DEFAULT_LIMITS,
    not_inspected: list[NotInspected] | None = None,
) -> list[Finding]:
    """`text_leak` findings in a log or RPC stream (`channel` "log" or "rpc"), located `label@offset`.
    `matcher`: the registry's (`matcher_for(registry)` when not given)."""
    _check_owner(registry, owner)
    data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    matcher = matcher or matcher_for(registry)
    skipped: list[NotInspected] = []
    hits = scan_bytes(data, matcher, limits=limits, not_inspected=skipped)
    if not_inspected is not None:
        not_inspected += [replace(n, path=label + n.path.removeprefix("bytes")) for n in skipped]
    return _findings(hits, owner, label, "text_leak", channel)


def scan_log(
    path: Path,
    registry: Registry,
    owner: str | None,
    *,
    label: str,
    channel: str = "log",
    matcher: Matcher | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> TreeScan:
    """`text_leak` findings in a log file, read as a stream (never whole), located `label@offset`."""
    _check_owner(registry, owner)
    matcher = matcher or matcher_for(registry)
    result = TreeScan()
    try:
        hits = scan_file(path, matcher, limits=limits, not_inspected=result.not_inspected, label=label)
    except OSError as exc:
        result.unreadable.append(str(path))
        result.not_inspected.append(NotInspected(label, f"unreadable: {exc.strerror or exc}"))
        return result
    result.files, result.bytes = 1, path.stat().st_size
    result.findings = _findings(hits, owner, label, "text_leak", channel)
    return result


def scan_tree(
    root: Path | str,
    registry: Registry,
    owner: str | None,
    *,
    exclude: Iterable[Path | str] = (),
    matcher: Matcher | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> TreeScan:
    """`file_leak` findings for every file under `root` (a tenant home), locations relative to `root`.

    Every other tenant's `home` that lies under `root` is excluded automatically (a launch profile's home
    holding `profiles/<name>`), as is every path in `exclude`. Every name below `root` is scanned too.
    Symlinks are never followed: their targets' names are scanned, and those pointing out of the tree or
    nowhere are listed in `not_inspected` (not partial: what they point to is not in the tree). FIFOs,
    sockets and devices are listed too, never opened. `matcher`: the registry's (`matcher_for(registry)`
    when not given).
    """
    _check_owner(registry, owner)
    root = Path(os.path.abspath(root))
    matcher = matcher or matcher_for(registry)
    excluded = {Path(os.path.abspath(p)) for p in exclude}
    excluded |= {Path(os.path.abspath(t.home)) for t in registry if t.home and t.name != owner}
    excluded.discard(root)
    result = TreeScan()

    def onerror(exc: OSError) -> None:
        label = _redacted(matcher, Path(exc.filename).relative_to(root).as_posix()) if exc.filename else "?"
        result.unreadable.append(str(exc.filename))
        result.notes.append(f"unreadable directory {exc.filename}: {exc.strerror or exc}")
        result.not_inspected.append(NotInspected(label, f"unreadable directory: {exc.strerror or exc}"))

    for dirpath, dirnames, filenames in os.walk(root, onerror=onerror, followlinks=False):
        here = Path(dirpath)
        keep = []
        for d in sorted(dirnames):
            sub = here / d
            if sub in excluded:
                result.notes.append(f"excluded {sub} (another tenant's home)")
            elif sub.is_symlink():
                filenames.append(d)  # reported below, never followed
            else:
                _scan_name(sub.relative_to(root).as_posix(), matcher, owner, result)
                keep.append(d)
        dirnames[:] = keep
        for name in sorted(filenames):
            path = here / name
            if path in excluded:
                continue
            rel = path.relative_to(root).as_posix()
            _scan_name(rel, matcher, owner, result)
            _scan_entry(path, _redacted(matcher, rel), root, matcher, owner, result, limits)
    return result


def _redacted(matcher: Matcher, label: str) -> str:
    """A path as reports may show it: every canary in it replaced by `<tenant:kind>`."""
    return matcher.redact_text(label) if matcher.find(label.encode("utf-8", "surrogateescape")) else label


def _scan_name(rel: str, matcher: Matcher, owner: str | None, result: TreeScan, *, what: str = "name",
               text: str | None = None) -> None:
    """A canary in the last component of the path `rel` (or in `text`, a symlink's target): a `file_leak`
    at `PATH:name@OFFSET`, OFFSET in the path. Earlier components were scanned as their own entries."""
    data = (rel if text is None else text).encode("utf-8", "surrogateescape")
    first = 0 if text is not None else len(rel) - len(rel.rsplit("/", 1)[-1])
    for hit in matcher.find(data):
        if hit.end <= first or not _counts(hit, owner):
            continue
        result.findings.append(Finding(
            kind="file_leak", victim=hit.tenant, seen_in=owner, canary=hit.kind, channel="file",
            location=f"{_redacted(matcher, rel)}:{what}@{hit.start}",
            encoding=what if hit.encoding == "plain" else f"{what}/{hit.encoding}",
            evidence=matcher.snippet(data, hit),
        ))


def _scan_entry(
    path: Path, label: str, root: Path | None, matcher: Matcher, owner: str | None, result: TreeScan,
    limits: Limits = DEFAULT_LIMITS,
) -> None:
    try:
        st = path.lstat()
    except OSError as exc:
        result.unreadable.append(str(path))
        result.notes.append(f"unreadable {path}: {exc.strerror or exc}")
        result.not_inspected.append(NotInspected(label, f"unreadable: {exc.strerror or exc}"))
        return
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path)
        _scan_name(label, matcher, owner, result, what="target", text=target)
        real = os.path.realpath(path)
        shown = _redacted(matcher, target)
        if not os.path.exists(real):
            result.not_inspected.append(NotInspected(label, f"dangling symlink to {shown} (not followed)", 0, False))
        elif root is None or not Path(real).is_relative_to(root):
            result.not_inspected.append(NotInspected(
                label, f"symlink to {_redacted(matcher, real)}, out of the tree (not followed)", 0, False))
        return
    if not stat.S_ISREG(st.st_mode):
        kind = ("fifo" if stat.S_ISFIFO(st.st_mode) else "socket" if stat.S_ISSOCK(st.st_mode)
                else "device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "special file")
        result.not_inspected.append(NotInspected(label, f"not a regular file ({kind}), not opened", 0, False))
        return
    try:
        hits = scan_file(path, matcher, limits=limits, not_inspected=result.not_inspected, label=label)
    except OSError as exc:
        result.unreadable.append(str(path))
        result.notes.append(f"unreadable {path}: {exc.strerror or exc}")
        result.not_inspected.append(NotInspected(label, f"unreadable: {exc.strerror or exc}"))
        return
    result.files += 1
    result.bytes += st.st_size
    result.findings += _findings(hits, owner, label, "file_leak", "file")


def scan_paths(
    paths: Iterable[Path | str], registry: Registry, owner: str | None, *, matcher: Matcher | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> TreeScan:
    """Files and directories (as `tenancy-audit scan` gets them); unpacks as `findings, unreadable`."""
    _check_owner(registry, owner)
    matcher = matcher or matcher_for(registry)
    result = TreeScan()
    for p in paths:
        path = Path(os.path.realpath(p)) if os.path.exists(p) else Path(p)  # explicit paths are followed
        if path.is_dir():
            result.merge(scan_tree(path, registry, owner, matcher=matcher, limits=limits))
        elif not os.path.lexists(path):
            result.unreadable.append(str(p))
            result.notes.append(f"unreadable {p}: does not exist")
            result.not_inspected.append(NotInspected(str(p), "unreadable: does not exist"))
        else:
            _scan_entry(path, _redacted(matcher, str(p)), None, matcher, owner, result, limits)
    return result

"""The scanner: every canary of every tenant in files, trees, compressed streams, SQLite and text.

Built on `harness.detect.matcher.Matcher` (one automaton, every encoding, one pass). On top of the raw bytes, each
scan decodes the containers a tenant home holds and scans their contents too ("layers"):

- gzip members found anywhere in the bytes (`1f 8b 08`: rotated `*.gz` logs, concatenated members, HTTP
  bodies), zlib streams found by their header (`78 01|5e|9c|da`), raw deflate at offset 0 and inside zip
  entries. Output is bounded (`MAX_STREAM_BYTES` per stream, `MAX_TOTAL_BYTES` per scan); a corrupt or
  truncated gzip member still has its decodable prefix scanned; a truncated output is noted, never a crash.
- SQLite files (`SQLite format 3\\0`): the raw bytes, and every value of every column of every table
  (FTS shadow tables and `sqlite_master` included) read with `sqlite3` from a private copy of the database
  and its `-wal`/`-journal`, so a canary that straddles an overflow page or lives only in the WAL is found.

Reporting scheme (`ScanHit`):
- `container` is None for the raw bytes, else the layers joined by `/`: `gzip`, `zlib`, `deflate`,
  `sqlite:<table>.<column>#<rowid>`, e.g. `sqlite:messages.content#3/gzip` for a gzip blob in a cell.
- `offset` is the canary's byte offset inside the innermost layer (decompressed bytes, or the cell value as
  UTF-8 / blob bytes); `layers` also records where each stream starts in its parent (None for a cell).
- `encoding` is the matcher's encoding prefixed by every codec layer, a trailing `plain` dropped: `plain`,
  `base64`, `gzip` (plain text in a gzip stream), `gzip/base64`, `zlib/utf16le`. SQLite is a container,
  not an encoding: a plain canary in a cell has encoding `plain`.
- `location(label)`: `path@OFFSET` for the raw bytes, `path@AT:gzip@OFFSET` in a stream that starts at AT,
  `path:sqlite:messages.content#3@OFFSET` in a cell.

Which canaries count: with an `owner`, every canary of every other tenant; with no owner, the secrets
(`is_secret_kind`) of every tenant. Evidence is always redacted with the matcher of the whole registry.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import stat
import struct
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import ahocorasick_rs

from harness.core.findings import Finding
from harness.core.registry import Registry, is_secret_kind
from harness.detect.matcher import Hit, Matcher, matcher_for

MAX_STREAM_BYTES = 256 * 1024 * 1024  # decompressed output scanned per stream
MAX_TOTAL_BYTES = 1024 * 1024 * 1024  # decompressed output scanned per top-level scan
MAX_DEPTH = 4  # layers: a gzip in a SQLite blob in a gzip ...
SQLITE_MAGIC = b"SQLite format 3\x00"
_MAGICS = (
    (b"\x1f\x8b\x08", "gzip"),
    *((m, "zlib") for m in (b"\x78\x01", b"\x78\x5e", b"\x78\x9c", b"\x78\xda")),
    (b"PK\x03\x04", "zip"),
)
_MAGIC_AUTOMATON = ahocorasick_rs.BytesAhoCorasick([m for m, _ in _MAGICS])
_CHUNK = 1 << 16

Layer = tuple[str, int | None]  # (name, where it starts in its parent; None for a SQLite cell)


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
        codecs = [name for name, at in self.layers if at is not None]
        if self.hit.encoding != "plain" or not codecs:
            codecs.append(self.hit.encoding)
        return "/".join(codecs)

    def location(self, label: str) -> str:
        parts = [label]
        for name, at in self.layers:
            parts.append(f"@{at}:{name}" if at is not None else f":{name}")
        return "".join(parts) + f"@{self.offset}"


@dataclass
class TreeScan:
    """What a scan found; `unreadable` paths were not scanned and must be reported; `notes` explain gaps."""

    findings: list[Finding] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    files: int = 0
    bytes: int = 0

    def __iter__(self) -> Iterator[list]:
        """`findings, unreadable = scan_paths(...)`."""
        return iter((self.findings, self.unreadable))

    def merge(self, other: TreeScan) -> None:
        self.findings += other.findings
        self.unreadable += other.unreadable
        self.notes += other.notes
        self.files += other.files
        self.bytes += other.bytes


# -- bytes, streams, SQLite ---------------------------------------------------------------------------------


class _Budget:
    def __init__(self, notes: list[str] | None) -> None:
        self.remaining = MAX_TOTAL_BYTES
        self.notes = notes if notes is not None else []


def scan_bytes(
    data: bytes | bytearray | memoryview, matcher: Matcher, *, notes: list[str] | None = None
) -> list[ScanHit]:
    """Every canary in `data` and in the streams and SQLite cells it contains (see the module docstring)."""
    return _scan(bytes(data), matcher, (), _Budget(notes), sqlite_path=None)


def scan_file(path: Path | str, matcher: Matcher, *, notes: list[str] | None = None) -> list[ScanHit]:
    """Scan one regular file; a SQLite database is also read logically together with its -wal/-journal.

    Raises OSError when the file cannot be read.
    """
    path = Path(path)
    data = _read(path)
    return _scan(data, matcher, (), _Budget(notes), sqlite_path=path)


def _read(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"not a regular file: {path}")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read()
    finally:
        os.close(fd)


def _scan(
    data: bytes, matcher: Matcher, layers: tuple[Layer, ...], budget: _Budget, sqlite_path: Path | None
) -> list[ScanHit]:
    out = [ScanHit(h, layers, matcher.snippet(data, h)) for h in matcher.find(data)]
    if len(layers) >= MAX_DEPTH:
        return out
    for name, at, wbits, partial_ok in _stream_candidates(data, top=not layers):
        if budget.remaining <= 0:
            budget.notes.append(f"decompression budget of {MAX_TOTAL_BYTES} bytes exhausted; later streams not scanned")
            break
        decoded = _inflate(memoryview(data)[at:], wbits, min(MAX_STREAM_BYTES, budget.remaining), partial_ok)
        if decoded is None:
            continue
        plain, truncated = decoded
        budget.remaining -= len(plain)
        if truncated:
            where = "".join(f"@{a}:{n}" if a is not None else f":{n}" for n, a in layers)
            budget.notes.append(f"{where or 'bytes'}@{at}:{name}: output truncated at {len(plain)} bytes")
        out += _scan(plain, matcher, (*layers, (name, at)), budget, sqlite_path=None)
    if data.startswith(SQLITE_MAGIC):
        out += _scan_sqlite(data, matcher, layers, budget, sqlite_path)
    return out


def _stream_candidates(buf: bytes, top: bool) -> Iterator[tuple[str, int, int, bool]]:
    """(container name, offset, zlib wbits, accept a partial stream) for every plausible stream start.

    One pass of a small automaton over the magic numbers; a bare raw-deflate body (HTTP `deflate`) is
    tried at offset 0 of a top-level buffer that holds nothing else.
    """
    starts: list[tuple[int, str, int, bool]] = []
    for idx, pos, _ in _MAGIC_AUTOMATON.find_matches_as_indexes(buf, overlapping=True):
        name = _MAGICS[idx][1]
        if name == "gzip":
            if pos + 3 < len(buf) and not buf[pos + 3] & 0xE0:  # reserved FLG bits clear
                starts.append((pos, "gzip", 31, True))
        elif name == "zlib":
            starts.append((pos, "zlib", 15, False))
        elif pos + 30 <= len(buf):  # zip local file header: method, name and extra lengths
            (method,) = struct.unpack_from("<H", buf, pos + 8)
            nlen, xlen = struct.unpack_from("<HH", buf, pos + 26)
            if method == 8:
                starts.append((pos + 30 + nlen + xlen, "deflate", -15, False))
    if top and buf and not starts:
        starts.append((0, "deflate", -15, False))
    for pos, name, wbits, partial in sorted(starts):
        yield name, pos, wbits, partial


def _inflate(data: memoryview, wbits: int, limit: int, partial_ok: bool) -> tuple[bytes, bool] | None:
    """(output, truncated) of the stream at the start of `data`, or None if it is not a usable stream.

    A corrupt stream yields the output decodable before the damage (when `partial_ok`).
    """
    d = zlib.decompressobj(wbits)
    out: list[bytes] = []
    pos = size = 0
    while pos < len(data) and not d.eof and size < limit:
        chunk = data[pos : pos + _CHUNK]
        saved = d.copy()
        try:
            size = _feed(d, chunk, out, size, limit)
        except zlib.error:
            if not partial_ok:
                return None
            d = saved
            with contextlib.suppress(zlib.error):
                size = _feed(d, chunk[: _longest_good_prefix(saved, chunk)], out, size, limit)
            break
        pos += len(chunk)
    truncated = size >= limit and not d.eof
    if not size or not (d.eof or truncated or partial_ok):
        return None
    return b"".join(out), truncated


def _feed(d: zlib._Decompress, chunk: memoryview, out: list[bytes], size: int, limit: int) -> int:
    """Decompress `chunk` into `out` without passing `limit` bytes in all; returns the new output size."""
    piece = d.decompress(chunk, limit - size)
    while True:
        out.append(piece)
        size += len(piece)
        if size >= limit or not d.unconsumed_tail:
            return size
        piece = d.decompress(d.unconsumed_tail, limit - size)


def _longest_good_prefix(d: zlib._Decompress, chunk: memoryview) -> int:
    """The longest prefix of `chunk` that `d` decodes without an error (errors are monotonic in length)."""
    lo, hi = 0, len(chunk) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        try:
            d.copy().decompress(chunk[:mid])
            lo = mid
        except zlib.error:
            hi = mid - 1
    return lo


def _scan_sqlite(
    data: bytes, matcher: Matcher, layers: tuple[Layer, ...], budget: _Budget, path: Path | None
) -> list[ScanHit]:
    """Scan every value of every table of a private copy of the database (plus its -wal/-journal)."""
    out: list[ScanHit] = []
    with tempfile.TemporaryDirectory(prefix="tenancy-scan-") as tmp:
        copy = Path(tmp) / "db"
        if path is not None:
            shutil.copyfile(path, copy)
            for suffix in ("-wal", "-journal"):
                side = Path(f"{path}{suffix}")
                if side.is_file() and not side.is_symlink():
                    shutil.copyfile(side, f"{copy}{suffix}")
        else:
            copy.write_bytes(data)
        try:
            conn = sqlite3.connect(f"file:{copy}?mode=ro", uri=True)
        except sqlite3.Error as exc:
            budget.notes.append(f"sqlite: cannot open: {exc}")
            return out
        conn.text_factory = bytes
        try:
            tables = [
                r[0].decode("utf-8", "replace")
                for r in conn.execute(
                    "SELECT name FROM sqlite_master"
                    " WHERE type = 'table' AND coalesce(sql, '') NOT LIKE 'CREATE VIRTUAL%'"
                )
            ]
            for table in ["sqlite_master", *tables]:
                out += _scan_table(conn, table, matcher, layers, budget)
        except sqlite3.Error as exc:
            budget.notes.append(f"sqlite: cannot read: {exc}")
        finally:
            conn.close()
    return out


def _scan_table(
    conn: sqlite3.Connection, table: str, matcher: Matcher, layers: tuple[Layer, ...], budget: _Budget
) -> list[ScanHit]:
    quoted = '"' + table.replace('"', '""') + '"'
    try:
        cur = conn.execute(f"SELECT rowid, * FROM {quoted}")
        rowid_col = True
    except sqlite3.OperationalError:  # WITHOUT ROWID: number the rows instead
        cur = conn.execute(f"SELECT * FROM {quoted}")
        rowid_col = False
    names = [d[0] for d in cur.description][1 if rowid_col else 0 :]
    shortest = matcher.shortest
    out: list[ScanHit] = []
    for n, row in enumerate(cur):
        rowid = row[0] if rowid_col else n
        for column, value in zip(names, row[1:] if rowid_col else row, strict=True):
            if isinstance(value, bytes) and len(value) >= shortest:
                cell = (*layers, (f"sqlite:{table}.{column}#{rowid}", None))
                out += _scan(value, matcher, cell, budget, sqlite_path=None)
    return out


# -- findings -----------------------------------------------------------------------------------------------


def _counts(hit: ScanHit, owner: str | None) -> bool:
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
) -> list[Finding]:
    """`text_leak` findings in a log or RPC stream (`channel` "log" or "rpc"), located `label@offset`.
    `matcher`: the registry's (`matcher_for(registry)` when not given)."""
    _check_owner(registry, owner)
    data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    return _findings(scan_bytes(data, matcher or matcher_for(registry)), owner, label, "text_leak", channel)


def scan_tree(
    root: Path | str,
    registry: Registry,
    owner: str | None,
    *,
    exclude: Iterable[Path | str] = (),
    matcher: Matcher | None = None,
) -> TreeScan:
    """`file_leak` findings for every file under `root` (a tenant home), locations relative to `root`.

    Every other tenant's `home` that lies under `root` is excluded automatically (a launch profile's home
    holding `profiles/<name>`), as is every path in `exclude`. Symlinks are never followed; those that
    point out of the tree or nowhere are noted. FIFOs, sockets and devices are noted, not opened.
    `matcher`: the registry's (`matcher_for(registry)` when not given).
    """
    _check_owner(registry, owner)
    root = Path(os.path.abspath(root))
    matcher = matcher or matcher_for(registry)
    excluded = {Path(os.path.abspath(p)) for p in exclude}
    excluded |= {Path(os.path.abspath(t.home)) for t in registry if t.home and t.name != owner}
    excluded.discard(root)
    result = TreeScan()

    def onerror(exc: OSError) -> None:
        result.unreadable.append(str(exc.filename))
        result.notes.append(f"unreadable directory {exc.filename}: {exc.strerror or exc}")

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
                keep.append(d)
        dirnames[:] = keep
        for name in sorted(filenames):
            path = here / name
            if path in excluded:
                continue
            _scan_entry(path, path.relative_to(root).as_posix(), root, matcher, owner, result)
    return result


def _scan_entry(
    path: Path, label: str, root: Path | None, matcher: Matcher, owner: str | None, result: TreeScan
) -> None:
    try:
        st = path.lstat()
    except OSError as exc:
        result.unreadable.append(str(path))
        result.notes.append(f"unreadable {path}: {exc.strerror or exc}")
        return
    if stat.S_ISLNK(st.st_mode):
        target = os.path.realpath(path)
        if not os.path.exists(target):
            result.notes.append(f"dangling symlink {label} -> {os.readlink(path)} (not followed)")
        elif root is None or not Path(target).is_relative_to(root):
            result.notes.append(f"symlink {label} -> {target} points out of the tree (not followed)")
        return
    if not stat.S_ISREG(st.st_mode):
        result.notes.append(f"not a regular file, not read: {label}")
        return
    try:
        notes: list[str] = []
        hits = scan_file(path, matcher, notes=notes)
    except OSError as exc:
        result.unreadable.append(str(path))
        result.notes.append(f"unreadable {path}: {exc.strerror or exc}")
        return
    result.files += 1
    result.bytes += st.st_size
    result.notes += [f"{label}{n}" if n.startswith("@") else f"{label}: {n}" for n in notes]
    result.findings += _findings(hits, owner, label, "file_leak", "file")


def scan_paths(
    paths: Iterable[Path | str], registry: Registry, owner: str | None, *, matcher: Matcher | None = None
) -> TreeScan:
    """Files and directories (as `tenancy-audit scan` gets them); unpacks as `findings, unreadable`."""
    _check_owner(registry, owner)
    matcher = matcher or matcher_for(registry)
    result = TreeScan()
    for p in paths:
        path = Path(os.path.realpath(p)) if os.path.exists(p) else Path(p)  # explicit paths are followed
        if path.is_dir():
            result.merge(scan_tree(path, registry, owner, matcher=matcher))
        elif not os.path.lexists(path):
            result.unreadable.append(str(p))
            result.notes.append(f"unreadable {p}: does not exist")
        else:
            _scan_entry(path, str(p), None, matcher, owner, result)
    return result

"""A SQLite database read logically: every value of every table (FTS shadow tables and `sqlite_master` included) of
a private copy of the database and its `-wal`/`-journal`, each value scanned as a stream of its own by the walk that
found the database (`harness.detect.engine.walk.LayerWalk`), so a canary that straddles an overflow page or lives
only in the WAL is found.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from harness.detect.engine import containers, records
from harness.detect.engine.hits import Layer, Limits
from harness.detect.engine.matcher import Matcher
from harness.detect.engine.progress import Reopen, bytes_reopen

#: Rows of a table whose values `_cells` looks at together first.
CELL_BATCH = 32


class Walk(Protocol):
    """What a database is read by (`harness.detect.engine.walk.LayerWalk`)."""

    matcher: Matcher
    limits: Limits
    min_bytes: int
    skipped: list[tuple[tuple[Layer, ...], str, int]]

    def stream(self, chunks: Iterable[bytes], layers: tuple[Layer, ...], reopen: Reopen, *, top: bool) -> None: ...

    def add_hits(self, window: bytes, base: int, owned_from: int, limit: int, layers: tuple[Layer, ...], *,
                 ends: bool = True) -> Any: ...

    def out_of_time(self, layers: tuple[Layer, ...], read: int = 0) -> bool: ...


def read(walk: Walk, layers: tuple[Layer, ...], reopen: Reopen, path: Path | None) -> None:
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
                    fh.write(piece[: walk.limits.stream_bytes - written])
                    written += len(piece)
                    if written > walk.limits.stream_bytes:
                        walk.skipped.append(((*layers, ("sqlite", None)), "sqlite: database larger than the "
                                             f"stream cap ({walk.limits.stream_bytes} bytes)", written))
                        break
        try:
            conn = sqlite3.connect(f"file:{copy}?mode=ro", uri=True)
            conn.text_factory = bytes
        except sqlite3.Error as exc:
            walk.skipped.append(((*layers, ("sqlite", None)), f"sqlite: cannot open: {exc}", 0))
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
                _table(walk, conn, table, layers)
        except sqlite3.Error as exc:
            walk.skipped.append(((*layers, ("sqlite", None)), f"sqlite: cannot read: {exc}", 0))
        finally:
            conn.close()

def _table(walk: Walk, conn: sqlite3.Connection, table: str, layers: tuple[Layer, ...]) -> None:
    quoted = '"' + table.replace('"', '""') + '"'
    try:
        cur = conn.execute(f"SELECT rowid, * FROM {quoted}")
        rowid_col = True
    except sqlite3.OperationalError:  # WITHOUT ROWID: number the rows instead
        cur = conn.execute(f"SELECT * FROM {quoted}")
        rowid_col = False
    names = [d[0] for d in cur.description][1 if rowid_col else 0 :]
    shortest = walk.matcher.shortest
    batch: list[tuple[bytes, str, int]] = []  # (value, column, rowid)
    for n, row in enumerate(cur):
        if n % CELL_BATCH == 0:
            _cells(walk, table, batch, layers)
            batch = []
            if walk.out_of_time((*layers, (f"sqlite:{table}", None))):
                return
        rowid = row[0] if rowid_col else n
        batch += [(value, column, rowid) for column, value in zip(names, row[1:] if rowid_col else row, strict=True)
                  if isinstance(value, bytes) and len(value) >= shortest]
    _cells(walk, table, batch, layers)

def _cells(walk: Walk, table: str, batch: list[tuple[bytes, str, int]], layers: tuple[Layer, ...]) -> None:
    """Scan values of a table, each as a stream of its own. The values of text (no NUL byte) are first
    looked at together, joined: when no layer can start in any of them (`containers.may_start`) and no value
    can be cut across records there (`records.may_cut`), each is only searched for canaries, and not even
    that when none can be there (`Matcher.may_find`). Most values of a database are so."""
    text = [value for value, _, _ in batch if 0 not in value]
    no_layer = no_canary = False
    if len(text) > 1 and not containers.may_start(text, walk.min_bytes):
        joined = containers.SEPARATOR.join(text)
        no_layer = not records.may_cut(joined, walk.matcher)
        no_canary = no_layer and not walk.matcher.may_find(joined)
    for value, column, rowid in batch:
        if no_canary and 0 not in value:
            continue
        cell = (*layers, (f"sqlite:{table}.{column}#{rowid}", None))
        if no_layer and 0 not in value:
            walk.add_hits(value, 0, 0, len(value), cell)
        else:
            walk.stream((value,), cell, bytes_reopen(value), top=True)


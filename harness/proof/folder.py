"""The file channels as an evidence folder: files in the tenants' homes (their contents and names, SQLite rows
live, freed, overflowing and in a WAL), kept versions of home files, logs and RPC frame logs; judged with the
saved flows by `detect.reconcile.reconcile`, as `judge.evaluate` reads a run's folder."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sqlite3
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from harness.core.files import FLOWS, REGISTRY
from harness.core.findings import Finding
from harness.core.record import RunRecord
from harness.core.registry import Registry
from harness.detect import file_versions as versions
from harness.detect.reconcile import LogSource, Reading, reconcile
from harness.proof.cases import Case
from harness.proof.encodings import at_start

RPC_LOGS = {"rpc.stdio": "rpc-tui.jsonl", "rpc.websocket": "rpc-serve.jsonl"}
_CASE = re.compile(r"\bcase\d{5}\b")


def _content(case: Case) -> bytes:
    """The payload after a line's start (alone when its format is recognised only where a stream starts)."""
    return case.payload if at_start(case.encoding) else b"note %s: %s\n" % (case.id.encode(), case.payload)


def _value(data: bytes) -> str | bytes:
    """A database value: text when it is, else a blob."""
    return data.decode() if data.isascii() and b"\0" not in data else data


def _sqlite(path: Path, case: Case, *, freed: bool = False, overflow: bool = False) -> None:
    """A database whose table `notes` holds the payload, then deleted if `freed`, after 4050 bytes of padding if
    `overflow` (across the end of the first page; before it if its format is recognised only at a value's start)."""
    data = _content(case)
    if overflow:
        data = data + b" " * 4050 if at_start(case.encoding) else b" " * 4050 + data
    value = _value(data)
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA secure_delete = OFF")
        db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body)")
        db.execute("INSERT INTO notes (body) VALUES (?)", (f"case {case.id}",))
        db.execute("INSERT INTO notes (body) VALUES (?)", (value,))
        if freed:
            db.execute("DELETE FROM notes WHERE id = 2")
    db.close()


def _wal(path: Path, case: Case) -> None:
    """A database and its WAL as a scan sees them while the writer runs: the row only in the WAL's frames."""
    with tempfile.TemporaryDirectory() as tmp:
        live = Path(tmp) / path.name
        db = sqlite3.connect(live)
        try:
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA wal_autocheckpoint = 0")
            db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body)")
            db.commit()
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            db.execute("INSERT INTO notes (body) VALUES (?)", (_value(_content(case)),))
            db.commit()
            shutil.copyfile(live, path)
            shutil.copyfile(live.with_name(live.name + "-wal"), path.with_name(path.name + "-wal"))
        finally:
            db.close()


@dataclass(frozen=True)
class Written:
    """The folder's run record (its homes, the owner of every log) and the case of every RPC log's line."""

    record: RunRecord
    rpc: dict[str, list[str]]


def write(out: Path, registry: Registry, cases: Iterable[Case]) -> Written:
    """Every file case in the evidence folder `out`, the tenants' homes in its `homes/`."""
    homes = {t.name: out / "homes" / t.name for t in registry}
    for home in homes.values():
        home.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    owners: dict[str, str | None] = {}
    rpc: dict[str, list[Case]] = {}
    kept: list[str] = []
    for case in cases:
        home = homes[case.seen_in]
        if case.channel == "file":
            _put(home / "cases" / f"{case.id}.dat", _content(case))
        elif case.channel == "file.name":
            _put(home / "names" / case.id / case.payload.decode(), b"x\n")
        elif case.channel.startswith("sqlite"):
            db = home / "db" / f"{case.id}.db"
            db.parent.mkdir(parents=True, exist_ok=True)
            if case.channel == "sqlite.wal":
                _wal(db, case)
            else:
                _sqlite(db, case, freed=case.channel == "sqlite.freed", overflow=case.channel == "sqlite.overflow")
        elif case.channel in ("log", "log.shared"):
            stamp = b"" if at_start(case.encoding) else b"2026-01-01 00:00:00 INFO "
            _put(out / "logs" / f"{case.id}.log", stamp + _content(case))
            owners[f"{case.id}.log"] = case.seen_in if case.channel == "log" else None
        elif case.channel in RPC_LOGS:
            frame = {"jsonrpc": "2.0", "method": "message.delta",
                     "params": {"session_id": f"s-{case.id}", "text": case.payload.decode("latin-1")}}
            rpc.setdefault(RPC_LOGS[case.channel], []).append(case)
            _put_line(out / "logs" / RPC_LOGS[case.channel],
                      json.dumps({"t": 0.0, "dir": "in", "tenant": case.seen_in, "frame": frame}))
        elif case.channel == "versions":
            kept.append(_version(out, home / "kept" / f"{case.id}.txt", _content(case)))
    if kept:
        _put(out / versions.FOLDER / versions.INDEX, "\n".join(kept).encode() + b"\n")
    record = RunRecord(scenario="scorecard", log_owners=owners,
                       homes={n: h.relative_to(out).as_posix() for n, h in homes.items()})
    return Written(record, {name: [c.id for c in lines] for name, lines in rpc.items()})


def _put(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(0o600)


def _put_line(path: Path, line: str) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write(line + "\n")
    path.chmod(0o600)


def _version(out: Path, path: Path, data: bytes) -> str:
    """A kept version of `path` holding `data`, the file itself rewritten clean; its index line."""
    _put(path, b"clean\n")
    vid = hashlib.sha256(str(path).encode()).hexdigest()[:16]
    _put(out / versions.FOLDER / vid, data)
    return json.dumps({"id": vid, "path": path.relative_to(out).as_posix(), "time": 1.0, "size": len(data),
                       "sha256": hashlib.sha256(data).hexdigest()})


def judge(out: Path, registry: Registry, record: RunRecord) -> list[Finding]:
    """Every finding `reconcile` makes of the folder: the saved flows, the homes, the kept versions, the logs."""
    record.write(out)
    registry.save(out / REGISTRY)
    logs = [LogSource(p, record.log_owners.get(p.name)) for p in sorted((out / "logs").glob("*.log"))]
    logs += [LogSource(p, None, "rpc") for p in sorted((out / "logs").glob("rpc-*.jsonl"))]
    homes = {n: out / h for n, h in record.homes.items()}
    rec = reconcile(registry, out / FLOWS, homes=homes, logs=logs, record=record,
                    reading=Reading(empty_ok=True, folder=out))
    return rec.findings


def case_in(location: str, rpc_lines: dict[str, list[str]]) -> str | None:
    """The case a file, log or RPC finding is about: named in its location, or the RPC frame's line."""
    m = re.match(r"(rpc-[a-z]+\.jsonl)#(\d+)@", location)
    if m is not None:
        lines = rpc_lines.get(m.group(1), [])
        n = int(m.group(2))
        return lines[n - 1] if 0 < n <= len(lines) else None
    found = _CASE.search(location)
    return found.group() if found else None

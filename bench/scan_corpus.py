"""bench/scan.py's inputs: a registry of N tenants x 12 canaries and its encoded patterns, a corpus of realistic
files (SQLite with FTS5 as Hermes' state.db, JSONL logs, gzip-rotated logs, binary blobs) with canaries planted in
assorted encodings, and a sparse file with a key near its end."""

from __future__ import annotations

import base64
import gzip
import json
import random
import sqlite3
from pathlib import Path

from harness.core.registry import Registry, mint
from harness.detect.engine.matcher import encodings_of

MiB = 1 << 20
EXTRA_KINDS = ("session_id", "gateway_token", "upload_note")  # 9 minted + 3 = 12 canaries per tenant
_VOCAB = (
    "the agent called tool terminal with arguments and returned output while reading file config yaml "
    "memory session gateway cron prompt user assistant system provider model stream token usage error "
    "retry backoff websocket frame request response header body json schema"
)
WORDS = tuple(_VOCAB.split())


def make_registry(n: int, root: Path) -> Registry:
    names = [f"t{i:03d}" for i in range(n)]
    reg = mint(names, root / "work", {name: {"listen": 20000 + i} for i, name in enumerate(names)})
    for t in reg:
        tag = t.key.rsplit("-", 1)[1]
        for kind in EXTRA_KINDS:
            t.canaries[kind] = f"{kind.replace('_', '-')}-{t.name}-{tag}"
    reg.validate()  # once (add_canary re-validates the whole registry on every call)
    return reg


def patterns_of(reg: Registry) -> list[bytes]:
    out: dict[bytes, None] = {}
    for t in reg:
        for value in t.all_canaries().values():
            for forms in encodings_of(value).values():
                out.update(dict.fromkeys(forms))
    return list(out)


def _log_line(rnd: random.Random, i: int) -> str:
    text = " ".join(rnd.choices(WORDS, k=rnd.randint(5, 40)))
    return json.dumps(
        {
            "ts": 1714550400 + i,
            "level": rnd.choice(["INFO", "DEBUG", "WARNING"]),
            "role": rnd.choice(["user", "assistant", "tool"]),
            "content": text,
        }
    )


def _plant(rnd: random.Random, reg: Registry) -> str:
    t = rnd.choice(list(reg))
    value = rnd.choice(list(t.all_canaries().values()))
    enc = rnd.choice(["plain", "json", "base64", "hex", "url"])
    if enc == "base64":
        return base64.b64encode(value.encode()).decode()
    if enc == "hex":
        return value.encode().hex()
    if enc == "url":
        return "".join(f"%{b:02X}" for b in value.encode())
    if enc == "json":
        return "".join(f"\\u{ord(c):04x}" for c in value)
    return value


def _jsonl(rnd: random.Random, size: int, reg: Registry, plants: int) -> bytes:
    pool = [_log_line(rnd, i) for i in range(2000)]
    lines, total = [], 0
    while total < size:
        line = rnd.choice(pool)
        lines.append(line)
        total += len(line) + 1
    for _ in range(plants):
        i = rnd.randrange(len(lines))
        lines[i] = json.dumps({"ts": i, "level": "INFO", "content": f"leak {_plant(rnd, reg)}"})
    return ("\n".join(lines) + "\n").encode()


def _sqlite(path: Path, rnd: random.Random, size: int, reg: Registry, plants: int) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = OFF")
    conn.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, session TEXT, role TEXT, content TEXT)")
    conn.execute("CREATE VIRTUAL TABLE messages_fts USING fts5(content, content='messages')")
    pool = [" ".join(rnd.choices(WORDS, k=rnd.randint(10, 400))) for _ in range(500)]
    rows, total = [], 0
    while total < size // 2:  # the FTS index roughly doubles it
        text = rnd.choice(pool)
        rows.append(("s1", rnd.choice(["user", "assistant"]), text))
        total += len(text) + 40
    for _ in range(plants):
        i = rnd.randrange(len(rows))
        rows[i] = (rows[i][0], rows[i][1], rows[i][2] + " " + _plant(rnd, reg))
    conn.executemany("INSERT INTO messages (session, role, content) VALUES (?, ?, ?)", rows)
    conn.execute("INSERT INTO messages_fts (messages_fts) VALUES ('rebuild')")
    conn.commit()
    conn.close()


def make_corpus(root: Path, mib: int, reg: Registry, seed: int = 1) -> list[Path]:
    """About `mib` MiB: 40% JSONL logs, 30% SQLite, 10% gzip-rotated logs, 20% binary."""
    rnd = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    total = mib * MiB
    file_size = max(MiB, min(16 * MiB, total // 16))
    made = 0
    i = 0
    while made < total:
        share = rnd.random()
        size = min(file_size, total - made)
        if share < 0.4:
            path = root / "logs" / f"agent-{i}.jsonl"
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(_jsonl(rnd, size, reg, plants=8))
        elif share < 0.7:
            path = root / "db" / f"state-{i}.db"
            path.parent.mkdir(exist_ok=True)
            _sqlite(path, rnd, size, reg, plants=8)
        elif share < 0.8:
            path = root / "logs" / f"agent-{i}.log.1.gz"
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(gzip.compress(_jsonl(rnd, size * 4, reg, plants=8), compresslevel=1))
        else:
            path = root / "bin" / f"blob-{i}.bin"
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(rnd.randbytes(size))
        made += path.stat().st_size
        i += 1
    return sorted(p for p in root.rglob("*") if p.is_file())


def make_sparse(path: Path, gib: float, key: str) -> None:
    """`gib` GiB that are a hole on disk, with `key` written 1 MiB before the end."""
    size = int(gib * (1 << 30))
    with path.open("wb") as fh:
        fh.truncate(size)
        fh.seek(size - MiB)
        fh.write(f"export OPENAI_API_KEY={key}\n".encode())

"""The scanner: planted leaks of every kind x encoding x container, a clean corpus, trees, text mode."""

from __future__ import annotations

import base64
import gzip
import io
import json
import math
import os
import random
import sqlite3
import urllib.parse
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.core.registry import Registry, mint
from harness.detect import scan
from harness.detect.engine import stream
from harness.detect.engine.matcher import Matcher, matcher_for
from harness.detect.engine.stream import ScanHit, scan_bytes, scan_file
from harness.detect.scan import scan_paths, scan_text, scan_tree

OWNER, VICTIM = "alice", "bob"
KINDS = [
    "key",
    "model",
    "api_server_key",
    "env_marker",
    "memory",
    "soul",
    "workdir",
    "cron_prompt",
    "shell_state",
    "share_link",
]
ENCODINGS = [
    "plain",
    "json_slash",
    "json_u",
    "json_U",
    "url_quote",
    "url_plus",
    "url_all",
    "base64_0",
    "base64_1",
    "base64_2",
    "base64url_0",
    "base64url_1",
    "base64url_2",
    "hex",
    "HEX",
    "utf16le",
    "utf16be",
]
PREFIX = b"2024-05-01T10:00:00Z INFO agent: data="
SUFFIX = b" end of line\n"


def make_registry(root: Path, names: tuple[str, ...] = ("alice", "bob", "carol")) -> Registry:
    reg = mint(list(names), root / "work", {n: {"listen": 42000 + i} for i, n in enumerate(names)})
    for t in reg:
        tag = t.key.rsplit("-", 1)[1]
        # URL- and JSON-special characters, so every url/json/base64url form differs from plain.
        reg.add_canary(t.name, "share_link", f"https://share.test/{t.name}/{tag}?a=1&b=~x y+z")
    return reg


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Registry:
    return make_registry(tmp_path_factory.mktemp("reg"))


@pytest.fixture(scope="module")
def matcher(registry: Registry) -> Matcher:
    return matcher_for(registry)


def value_of(registry: Registry, kind: str, tenant: str = VICTIM) -> str:
    return registry[tenant].all_canaries()[kind]


def encode(value: str, variant: str) -> tuple[bytes, int, int, str]:
    """(payload, start, end of the canary's pattern in payload, expected encoding) by an independent encoder."""
    raw = value.encode()

    def whole(payload: bytes, enc: str) -> tuple[bytes, int, int, str]:
        return payload, 0, len(payload), enc if payload != raw else "plain"

    if variant == "plain":
        return whole(raw, "plain")
    if variant == "json_slash":
        return whole(json.dumps(value)[1:-1].replace("/", "\\/").encode(), "json")
    if variant in ("json_u", "json_U"):
        form = "".join(f"\\u{ord(c):04x}" for c in value)
        return whole((form if variant == "json_u" else form.upper().replace("\\U", "\\u")).encode(), "json")
    if variant == "url_quote":
        return whole(urllib.parse.quote(value, safe="").encode(), "url")
    if variant == "url_plus":
        return whole(urllib.parse.quote_plus(value).encode(), "url")
    if variant == "url_all":
        return whole("".join(f"%{b:02X}" for b in raw).encode(), "url")
    if variant.startswith("base64"):
        pad = int(variant[-1])
        before, after = b"xyz"[:pad], b"!?"
        std = base64.b64encode(before + raw + after)
        url = base64.urlsafe_b64encode(before + raw + after)
        lo, hi = math.ceil(pad * 8 / 6), (pad + len(raw)) * 8 // 6  # chars determined by the canary alone
        if variant.startswith("base64url"):
            return url, lo, hi, "base64url" if url[lo:hi] != std[lo:hi] else "base64"
        return std, lo, hi, "base64"
    if variant in ("hex", "HEX"):
        return whole((raw.hex() if variant == "hex" else raw.hex().upper()).encode(), "hex")
    if variant in ("utf16le", "utf16be"):
        return whole(value.encode("utf-16-le" if variant == "utf16le" else "utf-16-be"), variant)
    raise AssertionError(variant)


def only(hits: list[ScanHit], kind: str, container: str | None, tenant: str = VICTIM) -> ScanHit:
    mine = [h for h in hits if h.tenant == tenant and h.kind == kind and h.container == container]
    assert len(mine) == 1, (container, hits)
    return mine[0]


def assert_redacted(matcher: Matcher, hit: ScanHit) -> None:
    assert f"<{hit.tenant}:{hit.kind}>" in hit.evidence, hit.evidence
    assert matcher.find(hit.evidence.encode()) == [], hit.evidence


def test_encoder_covers_every_encoding(registry: Registry) -> None:
    """The oracle produces every encoding the design names for at least one canary (no vacuous cases)."""
    seen = {encode(value_of(registry, k), v)[3] for k in KINDS for v in ENCODINGS}
    assert seen == {"plain", "json", "url", "base64", "base64url", "hex", "utf16le", "utf16be"}


# -- planted leaks: kind x encoding x container --------------------------------------------------------------

planted = pytest.mark.parametrize(("kind", "variant"), [(k, v) for k in KINDS for v in ENCODINGS])


@planted
def test_raw(registry: Registry, matcher: Matcher, kind: str, variant: str) -> None:
    payload, lo, hi, enc = encode(value_of(registry, kind), variant)
    data = os.urandom(333).replace(b"\x1f", b"_") + PREFIX + payload + SUFFIX
    hit = only(scan_bytes(data, matcher), kind, None)
    assert (hit.offset, hit.hit.end, hit.encoding, hit.layers) == (
        333 + len(PREFIX) + lo,
        333 + len(PREFIX) + hi,
        enc,
        (),
    )
    assert hit.location("f.bin") == f"f.bin@{333 + len(PREFIX) + lo}"
    assert_redacted(matcher, hit)


@planted
def test_raw_in_a_big_buffer(registry: Registry, matcher: Matcher, kind: str, variant: str) -> None:
    """The same plants in a buffer big enough for the marker prefilter, at the start, middle and end."""
    assert matcher.prefiltered
    payload, lo, hi, enc = encode(value_of(registry, kind), variant)
    # no NUL in the filler: one just before a UTF-16LE plant makes it a UTF-16BE one a byte earlier (a true
    # match, but not the plant; the test failed in 3 of 30 runs)
    filler = os.urandom(30_000).replace(b"\x1f", b"_").replace(b"\x00", b"_")
    for at in (0, 12_345, len(filler)):
        data = filler[:at] + payload + filler[at:]
        hit = only(scan_bytes(data, matcher), kind, None)
        assert (hit.offset, hit.hit.end, hit.encoding) == (at + lo, at + hi, enc)


def _compressed(codec: str, inner: bytes) -> tuple[bytes, int]:
    """(file bytes, offset of the stream in the file) for a stream of `codec` holding `inner`."""
    head = b"binary header \x00\x01\x02" * 3
    if codec == "gzip":
        return head + gzip.compress(inner) + b"trailer", len(head)
    if codec == "zlib":
        return head + zlib.compress(inner) + b"trailer", len(head)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("logs/agent.log", inner)
    data = buf.getvalue()
    info = zipfile.ZipFile(io.BytesIO(data)).infolist()[0]
    name_len, extra_len = int.from_bytes(data[26:28], "little"), int.from_bytes(data[28:30], "little")
    return data, info.header_offset + 30 + name_len + extra_len


@planted
@pytest.mark.parametrize("codec", ["gzip", "zlib", "deflate"])
def test_compressed(registry: Registry, matcher: Matcher, kind: str, variant: str, codec: str) -> None:
    payload, lo, _, enc = encode(value_of(registry, kind), variant)
    inner = PREFIX * 40 + payload + SUFFIX * 40
    data, at = _compressed(codec, inner)
    assert payload[lo : lo + 12] not in data  # really compressed: the raw bytes do not show it
    hit = only(scan_bytes(data, matcher), kind, codec)
    expected_enc = codec if enc == "plain" else f"{codec}/{enc}"
    assert (hit.offset, hit.encoding, hit.layers) == (len(PREFIX) * 40 + lo, expected_enc, ((codec, at),))
    assert hit.location("a.gz") == f"a.gz@{at}:{codec}@{len(PREFIX) * 40 + lo}"
    assert_redacted(matcher, hit)


def _cell(payload: bytes) -> str | bytes:
    """Text when the payload is text (as state.db stores messages), a blob otherwise."""
    return payload.decode() if payload.isascii() and b"\0" not in payload else payload


def _make_db(path: Path, rows: list[str | bytes], *, page_size: int = 4096, wal: bool = False) -> sqlite3.Connection:
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA page_size = {page_size}")
    if wal:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, role TEXT, content)")
    conn.executemany("INSERT INTO messages (role, content) VALUES ('user', ?)", [(r,) for r in rows])
    conn.commit()
    return conn


@planted
def test_sqlite_cell(tmp_path: Path, registry: Registry, matcher: Matcher, kind: str, variant: str) -> None:
    payload, lo, _, enc = encode(value_of(registry, kind), variant)
    db = tmp_path / "state.db"
    _make_db(db, ["hello", "world", _cell(PREFIX + payload + SUFFIX), "bye"]).close()
    hits = scan_file(db, matcher)
    hit = only(hits, kind, "sqlite:messages.content#3")
    assert (hit.offset, hit.encoding) == (len(PREFIX) + lo, enc)
    assert hit.location("state.db") == f"state.db:sqlite:messages.content#3@{len(PREFIX) + lo}"
    assert only(hits, kind, None).encoding == enc  # the raw page bytes are scanned too
    assert_redacted(matcher, hit)


def _first_page_chars(tmp_path: Path, filler: str | bytes) -> int:
    """How much of a long value sqlite keeps on the row's own page (measured, not computed)."""
    probe = tmp_path / "probe.db"
    _make_db(probe, ["x", filler], page_size=1024).close()
    raw = probe.read_bytes()
    probe.unlink()
    blob = filler.encode() if isinstance(filler, str) else filler
    lo, hi = 0, len(blob)
    while lo < hi:  # largest k with blob[:k] stored contiguously
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if blob[:mid] in raw else (lo, mid - 1)
    assert 0 < lo < len(blob), "the value must spill onto an overflow page"
    return lo


@planted
def test_sqlite_overflow_straddle(
    tmp_path: Path, registry: Registry, matcher: Matcher, kind: str, variant: str
) -> None:
    payload, lo, hi, enc = encode(value_of(registry, kind), variant)
    rnd = random.Random(f"{kind}{variant}")
    size = 3000
    filler = "".join(rnd.choice("0123456789abcdef") for _ in range(size))
    text_cell = isinstance(_cell(payload), str)
    split = _first_page_chars(tmp_path, filler if text_cell else filler.encode())
    pos = split - lo - (hi - lo) // 2  # the canary's pattern straddles the first overflow boundary
    assert pos >= 0 and pos + len(payload) <= size
    value = filler.encode()[:pos] + payload + filler.encode()[pos + len(payload) :]
    db = tmp_path / "state.db"
    _make_db(db, ["x", _cell(value)], page_size=1024).close()
    raw = db.read_bytes()
    assert payload[lo:hi] not in raw  # the straddle is real: the raw bytes never hold the whole canary
    assert payload[lo : split - pos] in raw and payload[split - pos : hi] in raw
    hits = scan_file(db, matcher)
    hit = only(hits, kind, "sqlite:messages.content#2")
    assert (hit.offset, hit.encoding) == (pos + lo, enc)
    assert not [h for h in hits if h.container is None and h.tenant == VICTIM]
    assert_redacted(matcher, hit)


@planted
def test_sqlite_wal_only(tmp_path: Path, registry: Registry, matcher: Matcher, kind: str, variant: str) -> None:
    payload, lo, hi, enc = encode(value_of(registry, kind), variant)
    db = tmp_path / "state.db"
    conn = _make_db(db, ["hello"], wal=True)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("INSERT INTO messages (role, content) VALUES ('tool', ?)", (_cell(PREFIX + payload),))
        conn.commit()
        wal = Path(f"{db}-wal")
        assert payload[lo:hi] not in db.read_bytes() and payload[lo:hi] in wal.read_bytes()
        hit = only(scan_file(db, matcher), kind, "sqlite:messages.content#2")
        assert (hit.offset, hit.encoding) == (len(PREFIX) + lo, enc)
        raw = only(scan_file(wal, matcher), kind, None)  # the -wal is also scanned as bytes
        assert raw.encoding == enc
        assert_redacted(matcher, hit)
    finally:
        conn.close()


# -- containers in more detail -------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-le", "utf-16-be"])
def test_utf16_file(tmp_path: Path, registry: Registry, matcher: Matcher, codec: str) -> None:
    text = "line one\n" * 50 + f"export OPENAI_API_KEY={value_of(registry, 'key')}\n" + "tail\n" * 20
    path = tmp_path / "notes.txt"
    path.write_bytes(text.encode(codec))
    hit = only(scan_file(path, matcher), "key", None)
    bom = 2 if codec == "utf-16" else 0
    assert hit.offset == bom + 2 * text.index(value_of(registry, "key"))
    assert hit.encoding == ("utf16be" if codec == "utf-16-be" else "utf16le")


def test_rotated_gzip_logs(tmp_path: Path, registry: Registry, matcher: Matcher) -> None:
    """Concatenated members are one stream, as `gzip -d` reads them: each canary at its offset in their output, every
    member decoded once; a truncated member still counts."""
    key, soul = value_of(registry, "key"), value_of(registry, "soul")
    texts = [b'{"msg": "clean"}\n' * 1000, b'{"msg": "x"}\n' * 100 + f'{{"auth": "{key}"}}\n'.encode()]
    third = gzip.compress(b"z" * 5000 + soul.encode() + os.urandom(200000))
    path = tmp_path / "agent.log.1.gz"
    path.write_bytes(b"".join(map(gzip.compress, texts)) + third[: len(third) // 2])  # the last one cut mid-stream
    hits = scan_file(path, matcher)
    k = only(hits, "key", "gzip")
    assert k.layers == (("gzip", 0),) and k.offset == len(texts[0]) + 1300 + len('{"auth": "')
    s = only(hits, "soul", "gzip")
    assert s.layers == (("gzip", 0),) and s.offset == len(texts[0]) + len(texts[1]) + 5000


def test_nested_gzip_in_sqlite_blob(tmp_path: Path, registry: Registry, matcher: Matcher) -> None:
    memory = value_of(registry, "memory")
    db = tmp_path / "cache.db"
    blob = gzip.compress(b"a" * 77 + base64.b64encode(memory.encode()))
    _make_db(db, [blob]).close()
    hit = only(scan_file(db, matcher), "memory", "sqlite:messages.content#1/gzip")
    assert hit.encoding == "gzip/base64" and hit.offset == 77
    assert hit.location("cache.db") == "cache.db:sqlite:messages.content#1@0:gzip@77"


def test_sqlite_fts_shadow_tables_and_schema(tmp_path: Path, registry: Registry, matcher: Matcher) -> None:
    db = tmp_path / "state.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE VIRTUAL TABLE messages_fts USING fts5(content)")
    conn.execute("INSERT INTO messages_fts (content) VALUES (?)", (f"note {value_of(registry, 'cron_prompt')}",))
    conn.execute(f"CREATE TABLE t (x TEXT DEFAULT '{value_of(registry, 'env_marker')}')")
    conn.execute("CREATE TABLE kv (k TEXT PRIMARY KEY, v BLOB) WITHOUT ROWID")
    conn.execute("INSERT INTO kv VALUES ('a', ?)", (value_of(registry, "soul").encode("utf-16-le"),))
    conn.commit()
    conn.close()
    hits = scan_file(db, matcher)
    assert only(hits, "cron_prompt", "sqlite:messages_fts_content.c0#1").offset == 5
    (schema,) = [h.container for h in hits if h.kind == "env_marker" and h.container]
    assert schema.startswith("sqlite:sqlite_master.sql#")
    assert only(hits, "soul", "sqlite:kv.v#0").encoding == "utf16le"


def test_decompression_is_bounded(registry: Registry, matcher: Matcher) -> None:
    key = value_of(registry, "key").encode()
    small = stream.Limits(stream_bytes=10_000)
    early = gzip.compress(b"a" * 500 + key + b"b" * 100_000)
    late = gzip.compress(b"a" * 50_000 + key)
    skipped: list[stream.NotInspected] = []
    assert only(scan_bytes(early, matcher, limits=small, not_inspected=skipped), "key", "gzip").offset == 500
    assert skipped == [stream.NotInspected("bytes@0:gzip", "decompression cap (10000 bytes per stream)", 10_000)]
    skipped.clear()
    assert scan_bytes(late, matcher, limits=small, not_inspected=skipped) == []  # beyond the cap: listed
    assert [(n.path, n.bytes_read, n.partial) for n in skipped] == [("bytes@0:gzip", 10_000, True)]
    skipped.clear()
    assert only(scan_bytes(late, matcher, not_inspected=skipped), "key", "gzip").offset == 50_000  # the control
    assert skipped == []


@pytest.mark.parametrize(
    "data",
    [
        b"\x1f\x8b\x08\x00" + os.urandom(5000),
        b"\x78\x9c" + os.urandom(5000),
        b"\x78\x01\x78\xda\x78\x5e",
        zlib.compress(b"x" * 10000)[:-20],
        b"PK\x03\x04" + b"\x00" * 4 + b"\x08\x00" + b"\xff" * 40,
        b"SQLite format 3\x00" + os.urandom(3000),
        b"SQLite format 3\x00",
        b"",
    ],
)
def test_corrupt_streams_do_not_crash(registry: Registry, matcher: Matcher, data: bytes) -> None:
    assert scan_bytes(data, matcher) == []
    assert scan_bytes(data + value_of(registry, "key").encode(), matcher)[-1].kind == "key"


def test_corrupt_gzip_keeps_decodable_prefix(registry: Registry, matcher: Matcher) -> None:
    stream = bytearray(gzip.compress(b"q" * 100 + value_of(registry, "model").encode() + os.urandom(50_000)))
    stream[len(stream) // 2 :] = os.urandom(len(stream) - len(stream) // 2)
    assert only(scan_bytes(bytes(stream), matcher), "model", "gzip").offset == 100


def test_no_file_is_skipped_for_size_or_nul(tmp_path: Path, registry: Registry, matcher: Matcher) -> None:
    path = tmp_path / "core.bin"
    with path.open("wb") as fh:
        fh.write(b"\0" * (24 << 20))
        fh.write(value_of(registry, "key").encode())
    assert only(scan_file(path, matcher), "key", None).offset == 24 << 20


# -- trees, owners, exclusions, unreadable files --------------------------------------------------------------


def _write_corpus(root: Path, registry: Registry, plant: Callable[[str], str] | None) -> None:
    """A tenant home's worth of realistic files; `plant(text)` may put canaries into the log text."""
    rnd = random.Random(7)
    own, other = registry[OWNER], registry[VICTIM]
    # Near misses: other tenants' canaries one character short, with one character changed, split by a space. One
    # short is followed by text: at a record's end, a record after it that starts with the character it lacks would
    # complete it (a value cut across records, which the records' reassembly finds: tests/test_framings.py).
    near = [v[:-1] + " (cut)" for v in other.all_canaries().values()]
    near += [v[:-1] + ("0" if v[-1] != "0" else "1") for v in other.all_canaries().values()]
    near += [v[: len(v) // 2] + " " + v[len(v) // 2 :] for v in other.all_canaries().values()]
    lines = []
    for i in range(4000):
        content = rnd.choice([*near, *own.all_canaries().values(), "hello", "tool call ok"])
        lines.append(json.dumps({"i": i, "role": rnd.choice(["user", "assistant"]), "content": content}))
    text = "\n".join(lines) + "\n"
    if plant:
        text = plant(text)
        lines = text.splitlines()
    (root / "logs").mkdir(parents=True)
    (root / "logs" / "agent.log").write_text(text)
    (root / "logs" / "agent.log.1.gz").write_bytes(gzip.compress(text.encode()))
    (root / "notes.utf16").write_bytes(text[:20000].encode("utf-16"))
    (root / "blob.bin").write_bytes(rnd.randbytes(1 << 20))
    (root / ".env").write_text(f"OPENAI_API_KEY={own.key}\nHERMES_MODEL={own.model}\n")
    conn = _make_db(root / "state.db", [*lines[:2000], "y" * 5000])
    conn.close()


def test_clean_corpus(tmp_path: Path, registry: Registry) -> None:
    _write_corpus(tmp_path / "home", registry, plant=None)
    result = scan_tree(tmp_path / "home", registry, OWNER)
    assert result.findings == [] and result.unreadable == [] and result.notes == [] and result.not_inspected == []
    assert result.files == 6
    # The owner's own canaries are there (the filter, not their absence, keeps this clean):
    assert scan_tree(tmp_path / "home", registry, VICTIM).findings


def test_planted_corpus(tmp_path: Path, registry: Registry) -> None:
    """The clean corpus's twin with one canary: found in the log, its gzip, the UTF-16 copy and state.db."""
    key = value_of(registry, "key")
    _write_corpus(tmp_path / "home", registry, plant=lambda text: text.replace('"hello"', f'"{key}"', 1))
    findings = scan_tree(tmp_path / "home", registry, OWNER).findings
    assert {(f.victim, f.seen_in, f.canary, f.channel, f.kind) for f in findings} == {
        (VICTIM, OWNER, "key", "file", "file_leak")
    }
    where = sorted((f.location.split("@")[0].split(":")[0], f.encoding) for f in findings)
    assert ("logs/agent.log", "plain") in where and ("logs/agent.log.1.gz", "gzip") in where
    assert ("state.db", "plain") in where  # raw page bytes and the cell
    assert any(f.location.startswith("state.db:sqlite:messages.content#") for f in findings)
    log = next(f for f in findings if f.location.startswith("logs/agent.log@"))
    text = (tmp_path / "home" / "logs" / "agent.log").read_bytes()
    assert log.location == f"logs/agent.log@{text.index(key.encode())}"
    assert all(f"<{VICTIM}:key>" in f.evidence and key not in f.evidence for f in findings)


def test_owner_filtering(tmp_path: Path, registry: Registry) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mixed = " ".join(f"{t.name}: {t.key} {t.canaries['memory']}" for t in registry)
    (home / "mixed.txt").write_text(mixed)
    found = {
        owner: sorted((f.victim, f.canary) for f in scan_tree(home, registry, owner).findings)
        for owner in ("alice", "bob", None)
    }
    assert found["alice"] == [("bob", "key"), ("bob", "memory"), ("carol", "key"), ("carol", "memory")]
    assert found["bob"] == [("alice", "key"), ("alice", "memory"), ("carol", "key"), ("carol", "memory")]
    assert found[None] == [("alice", "key"), ("bob", "key"), ("carol", "key")]  # no owner: secrets only
    with pytest.raises(ValueError, match="unknown tenant 'mallory'"):
        scan_tree(home, registry, "mallory")


def test_nested_profiles_excluded(tmp_path: Path) -> None:
    reg = make_registry(tmp_path / "r")
    home = tmp_path / "hermes"
    for t in reg:
        t_home = home if t.name == OWNER else home / "profiles" / t.name
        t_home.mkdir(parents=True, exist_ok=True)
        (t_home / "config.yaml").write_text(f"model: {t.model}\napi_key: {t.key}\n")
    (home / "memories.md").write_text(f"remember {reg['carol'].canaries['memory']}\n")
    # Without homes in the registry the nested profiles look like leaks (the control):
    unfiltered = {(f.victim, f.location) for f in scan_tree(home, reg, OWNER).findings}
    assert ("bob", "profiles/bob/config.yaml@7") in unfiltered
    for t in reg:
        t.home = str(home if t.name == OWNER else home / "profiles" / t.name)
    result = scan_tree(home, reg, OWNER)
    assert [(f.victim, f.canary, f.location) for f in result.findings] == [("carol", "memory", "memories.md@9")]
    assert sorted(result.notes) == [
        f"excluded {home}/profiles/bob (another tenant's home)",
        f"excluded {home}/profiles/carol (another tenant's home)",
    ]
    # A nested profile's own scan still sees its own tree, and explicit `exclude` works too:
    bob = scan_tree(home / "profiles" / "bob", reg, "bob")
    assert bob.findings == []
    explicit = scan_tree(home, make_registry(tmp_path / "r2"), OWNER, exclude=[home / "profiles"])
    assert explicit.notes == [f"excluded {home}/profiles (another tenant's home)"]


def test_symlinks_not_followed_out_of_tree(tmp_path: Path, registry: Registry) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(value_of(registry, "key"))
    home = tmp_path / "home"
    home.mkdir()
    (home / "link.txt").symlink_to(outside / "secret.txt")
    (home / "linkdir").symlink_to(outside)
    (home / "dangling").symlink_to(tmp_path / "nowhere")
    os.mkfifo(home / "pipe")  # opening it would block forever
    result = scan_tree(home, registry, OWNER)
    assert result.findings == [] and result.unreadable == [] and result.reasons() == []
    assert sorted(n.summary() for n in result.not_inspected) == sorted(
        [
            f"dangling: dangling symlink to {tmp_path / 'nowhere'} (not followed) (0 bytes read)",
            f"link.txt: symlink to {outside / 'secret.txt'}, out of the tree (not followed) (0 bytes read)",
            f"linkdir: symlink to {outside}, out of the tree (not followed) (0 bytes read)",
            "pipe: not a regular file (fifo), not opened (0 bytes read)",
        ]
    )
    assert not any(n.partial for n in result.not_inspected)
    assert scan_tree(outside, registry, OWNER).findings  # control: the target does hold a leak
    # A path named explicitly (the CLI) is followed:
    assert [f.canary for f in scan_paths([home / "link.txt"], registry, OWNER).findings] == ["key"]


def test_unreadable_file_reported(tmp_path: Path, registry: Registry, deny_open: Callable[[str], None]) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "locked.db").write_text(value_of(registry, "key"))
    (home / "open.txt").write_text(value_of(registry, "soul"))
    deny_open("locked.db")
    result = scan_tree(home, registry, OWNER)
    assert result.unreadable == [str(home / "locked.db")]
    assert result.notes == [f"unreadable {home / 'locked.db'}: Permission denied"]
    assert result.reasons() == ["not fully inspected: locked.db: unreadable: Permission denied (0 bytes read)"]
    assert [f.canary for f in result.findings] == ["soul"]  # the rest is still scanned
    findings, unreadable = scan_paths([home, tmp_path / "missing"], registry, OWNER)
    assert [f.canary for f in findings] == ["soul"]
    assert unreadable == [str(home / "locked.db"), str(tmp_path / "missing")]


def test_unreadable_directory_reported(tmp_path: Path, registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    (home / "sealed").mkdir(parents=True)
    (home / "sealed" / "x.txt").write_text(value_of(registry, "key"))
    real = os.scandir

    def deny(path):  # type: ignore[no-untyped-def]
        if str(path).endswith("sealed"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", deny)
    result = scan_tree(home, registry, OWNER)
    assert result.findings == [] and result.unreadable == [str(home / "sealed")]


def test_file_vanishing_during_walk_reported(
    tmp_path: Path, registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real failure even for root: the file is deleted between listing and reading (a log rotating)."""
    (tmp_path / "rotating.log").write_text("x")
    real = scan._scan_entry

    def racy(path, *args):  # type: ignore[no-untyped-def]
        path.unlink()
        return real(path, *args)

    monkeypatch.setattr(scan, "_scan_entry", racy)
    assert scan_tree(tmp_path, registry, OWNER).unreadable == [str(tmp_path / "rotating.log")]


# -- text mode, cache -----------------------------------------------------------------------------------------


def test_text_mode(registry: Registry, matcher: Matcher) -> None:
    bob = registry["bob"]
    frame = f'{{"jsonrpc":"2.0","result":{{"text":"{bob.canaries["memory"]} and {bob.key}"}}}}'
    with_owner = scan_text(frame, registry, OWNER, label="rpc:stdio", channel="rpc")
    assert [(f.kind, f.victim, f.seen_in, f.canary, f.channel) for f in with_owner] == [
        ("text_leak", "bob", "alice", "memory", "rpc"),
        ("text_leak", "bob", "alice", "key", "rpc"),
    ]
    assert with_owner[0].location == f"rpc:stdio@{frame.index(bob.canaries['memory'])}"
    own = scan_text(frame, registry, "bob", label="x", channel="log")
    assert own == []
    secrets = scan_text(frame.encode(), registry, None, label="gateway.log", channel="log")
    assert [(f.victim, f.seen_in, f.canary) for f in secrets] == [("bob", None, "key")]
    assert all(matcher.find(f.evidence.encode()) == [] for f in with_owner + secrets)
    assert "<bob:memory>" in secrets[0].evidence  # the evidence is redacted with every canary, not just keys


def test_matcher_cache(tmp_path: Path) -> None:
    reg = make_registry(tmp_path)
    first = matcher_for(reg)
    assert matcher_for(reg) is first
    assert matcher_for(make_registry(tmp_path)) is not first
    reg.add_canary("bob", "late_marker", "late-marker-bob-000000001")
    second = matcher_for(reg)
    assert second is not first
    hits = scan_text("x late-marker-bob-000000001", reg, OWNER, label="l", channel="log")
    assert [f.canary for f in hits] == ["late_marker"]


def test_reconcile_excludes_nested_homes_where_they_are_now(tmp_path: Path) -> None:
    """An evidence folder moved after its run: the registry still names the homes where they ran, the
    reconciliation gets them where they are now, and a nested profile is still not the launch home's leak."""
    from harness.detect.reconcile import Reading, reconcile

    reg = make_registry(tmp_path / "r")
    ran, now = tmp_path / "ran", tmp_path / "moved"
    homes = {t.name: now if t.name == OWNER else now / "profiles" / t.name for t in reg}
    for t in reg:
        t.home = str(ran if t.name == OWNER else ran / "profiles" / t.name)
        homes[t.name].mkdir(parents=True, exist_ok=True)
        (homes[t.name] / "config.yaml").write_text(f"api_key: {t.key}\n")
    (now / "memories.md").write_text(f"remember {reg['carol'].canaries['memory']}\n")
    rec = reconcile(reg, tmp_path / "no-flows.mitm", homes=homes, reading=Reading(empty_ok=True))
    assert [(f.victim, f.seen_in, f.location) for f in rec.findings] == [("carol", OWNER, "memories.md@9")]

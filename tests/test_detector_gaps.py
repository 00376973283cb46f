"""The detector gaps the scorecard found (docs/detection.md), each pinned by a negative control: the planted leak is
caught, the same value one character short (a near miss of the same shape) is not."""

from __future__ import annotations

import base64
import gzip
import json
import random
import sqlite3
import zlib
from pathlib import Path

import brotli
import pytest

from harness.core.protocol import PROBE_BEGIN, PROBE_END
from harness.core.registry import Registry
from harness.detect import scan, snapshots
from harness.detect.engine.matcher import Matcher
from harness.detect.engine.stream import scan_bytes, scan_file
from harness.detect.flowscan import FlowScan
from harness.proof.cases import mint


@pytest.fixture(scope="module")
def registry() -> Registry:
    return mint(random.Random(35), {})


def secret(registry: Registry, near_miss: bool) -> bytes:
    """beta's memory canary, or the same without its last character."""
    value = registry["beta"].canaries["memory"].encode()
    return value[:-1] if near_miss else value


def seen(findings: list) -> set[tuple[str | None, str | None]]:
    return {(f.victim, f.canary) for f in findings}


@pytest.mark.parametrize("near_miss", [False, True])
def test_a_header_value_is_scanned_through_its_layers(registry: Registry, near_miss: bool) -> None:
    """A header holding a compressed blob in base64 (a compressed cookie, tracing baggage): only the canaries'
    own forms were looked for in headers."""
    scan_ = FlowScan(Matcher.for_registry(registry), "f1", "alpha", "request", "request_leak")
    blob = base64.b64encode(gzip.compress(secret(registry, near_miss), mtime=0)).decode()
    scan_.headers([("x-context", blob), ("authorization", f"Bearer {registry['alpha'].key}")], "request")
    assert seen(scan_.findings) == (set() if near_miss else {("beta", "memory")})
    assert near_miss or scan_.findings[0].encoding == "base64/gzip"


@pytest.mark.parametrize("near_miss", [False, True])
def test_an_env_variable_is_scanned_through_its_layers(registry: Registry, near_miss: bool) -> None:
    """An environment variable holding zlib in hex: the env snapshot check looked for the canaries' forms only."""
    alpha = registry["alpha"]
    env = f"HERMES_HOME={alpha.home}\nBLOB={zlib.compress(secret(registry, near_miss)).hex()}\n"
    output = (f"{PROBE_BEGIN}\n{env}ENVB64={base64.b64encode(env.encode()).decode()}\n"
              f"CWD={alpha.canaries['workdir']}\n{PROBE_END}\n")
    body = {"messages": [{"role": "tool", "tool_call_id": "c1", "content": json.dumps({"output": output})}]}
    (snap,) = snapshots.extract(alpha, "f1", body)
    found = snapshots.check(snap, registry, Matcher.for_registry(registry))
    assert seen(found) == (set() if near_miss else {("beta", "memory")})
    assert near_miss or {f.kind for f in found} == {"env_leak"}


@pytest.mark.parametrize("near_miss", [False, True])
def test_a_file_name_is_scanned_through_its_layers(tmp_path: Path, registry: Registry, near_miss: bool) -> None:
    """A file named by the hex of a compressed value (a cache key): names were looked at for the canaries' forms."""
    (tmp_path / zlib.compress(secret(registry, near_miss)).hex()).write_text("x")
    result = scan.scan_tree(tmp_path, registry, "alpha")
    assert seen(result.findings) == (set() if near_miss else {("beta", "memory")})
    assert near_miss or result.findings[0].encoding == "name/hex/zlib"


@pytest.mark.parametrize("near_miss", [False, True])
@pytest.mark.parametrize("after", [1, 4050])
def test_a_brotli_stream_followed_by_other_bytes(registry: Registry, near_miss: bool, after: int) -> None:
    """brotli's decoder fails on bytes after the end of its stream and kept nothing: a value padded after it, or
    data appended to a file, hid what it held."""
    data = brotli.compress(b"note: " + secret(registry, near_miss) + b" " * 200, quality=11) + b"\x00" * after
    hits = scan_bytes(data, Matcher.for_registry(registry))
    assert {(h.tenant, h.kind) for h in hits} == (set() if near_miss else {("beta", "memory")})


@pytest.mark.parametrize("near_miss", [False, True])
@pytest.mark.parametrize("layer", ["hex/zlib", "base64-crlf/zlib"])
def test_a_deleted_rows_text_runs(tmp_path: Path, registry: Registry, near_miss: bool, layer: str) -> None:
    """A deleted row's text is no value any more: only the raw pages hold it, where text runs (hex, base64 without
    a magic number) were not looked for."""
    packed = zlib.compress(secret(registry, near_miss))
    text = packed.hex() if layer == "hex/zlib" else base64.encodebytes(packed).replace(b"\n", b"\r\n").decode()
    db = tmp_path / "state.db"
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA secure_delete = OFF")
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        conn.executemany("INSERT INTO notes (body) VALUES (?)", [("kept",), (f"note: {text}",)])
        conn.execute("DELETE FROM notes WHERE id = 2")
    conn.close()
    hits = scan_file(db, Matcher.for_registry(registry))
    assert {(h.tenant, h.kind) for h in hits} == (set() if near_miss else {("beta", "memory")})

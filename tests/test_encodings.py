"""The adversarial corpus: every encoding a real leak takes, each with a planted leak it must find, a clean
twin or near miss it must not report, and a negative control showing that the decoder under test is the
one that finds it (the test fails with that decoder removed)."""

from __future__ import annotations

import base64
import bz2
import gzip
import io
import json
import lzma
import os
import re
import socket
import sqlite3
import urllib.parse
import zipfile
import zlib
from collections.abc import Callable
from email.mime.application import MIMEApplication
from email.mime.multipart import MIMEMultipart
from pathlib import Path

import brotli
import pytest

from harness.core.registry import Registry, mint
from harness.detect.checks import RawRequest, RawResponse
from harness.detect.engine import codecs, containers, forms, matcher, stream, wrapped
from harness.detect.engine.matcher import Matcher, encodings_of, matcher_for
from harness.detect.engine.stream import NotInspected, scan_bytes, scan_file
from harness.detect.flows import Route, inspect_request, inspect_response
from harness.detect.reconcile import Reading, reconcile
from harness.detect.scan import scan_log, scan_text, scan_tree
from tests.registries import with_share_links

try:
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:
    from backports import zstd

OWNER, VICTIM = "alice", "bob"
#: Written by hand (no marker, so the prefilter is off for the registry that holds it): `/`, `-`, a space,
#: `&`, `<`, non-ASCII and a character outside the BMP (a surrogate pair in JSON).
HANDWRITTEN = "hand/written-canary <x&y> é 🙂 0123456789"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Registry:
    return with_share_links(tmp_path_factory.mktemp("reg") / "work", lambda i, n: {"listen": 44000 + i})


@pytest.fixture(scope="module")
def m(registry: Registry) -> Matcher:
    return matcher_for(registry)


@pytest.fixture(scope="module")
def hand(tmp_path_factory: pytest.TempPathFactory) -> tuple[Registry, Matcher]:
    reg = mint(["alice", "bob"], tmp_path_factory.mktemp("hand") / "work", {"alice": {"listen": 44100},
                                                                         "bob": {"listen": 44101}})
    reg.add_canary("bob", "handwritten_key", HANDWRITTEN)
    mat = Matcher.for_registry(reg)
    assert not mat.prefiltered
    return reg, mat


def value(registry: Registry, kind: str = "key", tenant: str = VICTIM) -> str:
    return registry[tenant].all_canaries()[kind]


def found(hits: list[stream.ScanHit], tenant: str = VICTIM) -> set[tuple[str, str, str | None]]:
    return {(h.kind, h.encoding, h.container) for h in hits if h.tenant == tenant}


def near_misses(v: str) -> list[str]:
    """Values one bit away from `v`: the low bits of its last character, the high bits of its first."""
    return [v[:-1] + chr(ord(v[-1]) ^ 1), v[:-1] + chr(ord(v[-1]) ^ 2), chr(ord(v[0]) ^ 0x10) + v[1:]]


def wrap(text: bytes, column: int, brk: bytes) -> bytes:
    return brk.join(text[i : i + column] for i in range(0, len(text), column))


# -- base64: exact edges, wrapped blocks ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["key", "memory", "share_link"])
@pytest.mark.parametrize("pad", range(3))
@pytest.mark.parametrize("after", [b"", b"!", b"\xff\x00", b"tail of the value"])
def test_base64_edges_are_exact(registry: Registry, m: Matcher, kind: str, pad: int, after: bytes) -> None:
    v = value(registry, kind)
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        data = b"x=" + encode(b"abc"[:pad] + v.encode() + after) + b";"
        assert (kind, VICTIM) in {(h.kind, h.tenant) for h in m.find(data)}, (pad, after)
        for near in near_misses(v):
            twin = b"x=" + encode(b"abc"[:pad] + near.encode() + after) + b";"
            assert [h for h in m.find(twin) if h.tenant == VICTIM] == [], (near, pad, after)


def test_base64_edges_negative_control(registry: Registry, m: Matcher, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the edge check the near miss is reported: the check is what rejects it."""
    v = value(registry, "memory")
    twins = [base64.b64encode(b"abc"[:pad] + near.encode() + b"!") for pad in range(3) for near in near_misses(v)]
    monkeypatch.setattr(forms.Edge, "agrees", lambda self, data, start, end: True)
    assert any(Matcher(m.canaries).find(t) for t in twins)


@pytest.mark.parametrize("brk", [b"\n", b"\r\n", b"\\n", b"\\r\\n", b"\\\\n"], ids=["lf", "crlf", "json", "json-crlf",
                                                                                     "json-in-json"])
@pytest.mark.parametrize("column", [76, 64, 40])
def test_wrapped_base64_every_split(registry: Registry, m: Matcher, brk: bytes, column: int) -> None:
    """The canary at every offset of a wrapped block, so the break falls at every place in its encoding."""
    v = value(registry, "memory").encode()
    head = b"x" * 3 + b"\x01\x02"
    for shift in range(0, len(v) * 4 // 3 + 8):
        payload = os.urandom(shift) + v + b" and more text after it"
        block = wrap(base64.b64encode(head + payload), column, brk)
        data = b'{"attachment": "' + block + b'", "n": 1}\n'
        assert v not in data
        hits = scan_bytes(data, m)
        assert ("memory", VICTIM) in {(h.kind, h.tenant) for h in hits}, shift
        # The clean twin: the same block around a near miss.
        for near in near_misses(v.decode()):
            twin = b'{"attachment": "' + wrap(base64.b64encode(head + os.urandom(shift) + near.encode()), column,
                                             brk) + b'"}'
            assert [h for h in scan_bytes(twin, m) if h.tenant == VICTIM] == [], (shift, near)


def test_wrapped_base64_as_the_base64_command_writes_it(tmp_path: Path, registry: Registry, m: Matcher) -> None:
    key = value(registry, "key").encode()
    for lead in range(0, 60):
        path = tmp_path / "dump.b64"
        path.write_bytes(base64.encodebytes(os.urandom(lead) + b"token=" + key + b"\n" + os.urandom(100)))
        hits = scan_file(path, m)
        (hit,) = [h for h in hits if h.tenant == VICTIM]  # once: in the raw bytes if no break splits it
        assert hit.kind == "key"
        if hit.layers:
            assert hit.layers == (("base64", 0),) and hit.offset == lead + len(b"token=")
        else:
            assert hit.encoding == "base64"


def test_wrapped_base64_negative_control(registry: Registry, m: Matcher, monkeypatch: pytest.MonkeyPatch) -> None:
    key = value(registry, "key").encode()
    blocks = [base64.encodebytes(os.urandom(lead) + key) for lead in range(40)]
    assert all(found(scan_bytes(b, m)) for b in blocks)
    # Some splits only the block decoder sees. Two finders start it, and either alone finds every split: the
    # wrapped block's line breaks, and its first line as a run of base64 characters.
    real_runs = containers._runs
    monkeypatch.setattr(containers, "_runs", lambda window, marks, min_bytes: [])
    assert all(found(scan_bytes(b, m)) for b in blocks)
    monkeypatch.setattr(containers, "_runs", real_runs)
    monkeypatch.setattr(wrapped, "blocks", lambda window: [])
    assert all(found(scan_bytes(b, m)) for b in blocks)
    monkeypatch.setattr(containers, "_runs", lambda window, marks, min_bytes: [])
    assert not all(found(scan_bytes(b, m)) for b in blocks)


def test_mime_attachment(registry: Registry, m: Matcher) -> None:
    secret = value(registry, "api_server_key").encode()
    containers = set()
    for lead in range(0, 57, 3):
        msg = MIMEMultipart()
        msg.attach(MIMEApplication(os.urandom(lead) + b"API_SERVER_KEY=" + secret + b"\n" * 3, Name="env.txt"))
        data = msg.as_bytes().replace(b"\n", b"\r\n")
        assert secret not in data and b"\r\n" in data
        (hit,) = [h for h in scan_bytes(data, m) if h.tenant == VICTIM]
        assert hit.kind == "api_server_key", lead
        containers.add(hit.container)  # the raw bytes when no break splits it, else the decoded block
    assert containers == {None, "base64"}


# -- base64 encoded twice: decoded around a trigger, not patterns ---------------------------------------------


def _twice(inner_pad: int, outer_pad: int, raw: bytes, urlsafe: bool = False) -> bytes:
    encode = base64.urlsafe_b64encode if urlsafe else base64.b64encode
    return encode(b"xyz"[:outer_pad] + encode(b"abc"[:inner_pad] + raw + b"!"))


@pytest.mark.parametrize("kind", ["key", "memory", "share_link"])
@pytest.mark.parametrize("urlsafe", [False, True])
def test_base64_twice_at_every_alignment(registry: Registry, m: Matcher, kind: str, urlsafe: bool) -> None:
    """Both encodings at each of their three byte alignments, in a header-sized buffer and in a big one
    (the prefilter's path), with the prefilter or without; a value one bit away is never reported."""
    v = value(registry, kind)
    unfiltered = Matcher(m.canaries, prefilter=False)
    filler = os.urandom(20_000).replace(b"\x00", b"_")
    for inner_pad in range(3):
        for outer_pad in range(3):
            twice = _twice(inner_pad, outer_pad, v.encode(), urlsafe)
            for data in (b"x=" + twice + b";", filler + b" " + twice + b" " + filler):
                hits = [h for h in m.find(data) if h.tenant == VICTIM]
                assert [h.kind for h in hits] == [kind], (inner_pad, outer_pad)
                assert hits[0].encoding == "base64/base64"  # either alphabet, as the contract names it
                assert unfiltered.find(data) == m.find(data)
            for near in near_misses(v):
                twin = b"x=" + _twice(inner_pad, outer_pad, near.encode(), urlsafe) + b";"
                assert [h for h in m.find(twin) if h.tenant == VICTIM] == [], (near, inner_pad, outer_pad)


def test_base64_twice_redacted_and_handwritten(registry: Registry, m: Matcher, hand: tuple[Registry, Matcher]) -> None:
    """Redaction covers the text it was decoded from; a canary without the marker is its own trigger."""
    redacted = m.redact(b"a " + _twice(1, 2, value(registry, "soul").encode()) + b" b")
    assert b"<bob:soul>" in redacted
    assert not [h for h in m.find(redacted) if h.tenant == VICTIM]
    _, mat = hand
    for inner_pad in range(3):
        for outer_pad in range(3):
            data = b"x=" + _twice(inner_pad, outer_pad, HANDWRITTEN.encode()) + b";"
            assert [(h.kind, h.encoding) for h in mat.find(data)] == [("handwritten_key", "base64/base64")]


def test_base64_twice_negative_control(registry: Registry, m: Matcher, monkeypatch: pytest.MonkeyPatch) -> None:
    """No pattern holds a double form: without the decoding around the triggers nothing is found."""
    plants = [b"x=" + _twice(i, o, value(registry, "key").encode()) + b";" for i in range(3) for o in range(3)]
    assert all(m.find(p) for p in plants)
    monkeypatch.setattr(matcher.Matcher, "_double_base64", lambda self, data, triggers: [])
    assert not any(m.find(p) for p in plants)


# -- nested containers ---------------------------------------------------------------------------------------


def _nest(data: bytes, layers: str) -> bytes:
    for layer in reversed(layers.split("/")):
        data = {"base64": base64.b64encode, "gzip": gzip.compress, "wrapped": base64.encodebytes,
                "json": lambda d: json.dumps({"blob": d.decode("latin-1")}).encode()}[layer](data)
    return data


@pytest.mark.parametrize("layers", ["base64/gzip", "base64/base64", "gzip/base64", "wrapped/gzip",
                                    "gzip/wrapped", "base64/gzip/base64", "json/base64/gzip", "wrapped/wrapped"])
def test_nested_containers(registry: Registry, m: Matcher, layers: str) -> None:
    memory = value(registry, "memory").encode()
    plain = b"remember: " + memory + b"\n" + os.urandom(40).hex().encode()
    data = b'{"log": "' + _nest(plain, layers) + b'"}'
    assert not m.find(data) or layers in ("base64/base64",)  # a double base64 form is a pattern of its own
    assert [h.kind for h in scan_bytes(data, m) if h.tenant == VICTIM] == ["memory"], layers
    twin = b'{"log": "' + _nest(plain.replace(memory, near_misses(memory.decode())[0].encode()), layers) + b'"}'
    assert [h for h in scan_bytes(twin, m) if h.tenant == VICTIM] == []


def test_nesting_is_bounded_and_the_bound_is_listed(registry: Registry, m: Matcher) -> None:
    data = _nest(b"k=" + value(registry, "key").encode(), "base64/gzip/base64/gzip/base64/gzip")
    skipped: list[NotInspected] = []
    assert scan_bytes(data, m, not_inspected=skipped) == []
    assert [(n.path, n.reason, n.partial) for n in skipped] == [
        ("bytes@0:base64@0:gzip@0:base64@0:gzip@0:base64", "depth cap (4 nested containers)", True)]
    assert found(scan_bytes(data, m, limits=stream.Limits(depth=6)))  # the control: the depth was the cause


def test_nested_json_escapes(registry: Registry, m: Matcher) -> None:
    """A JSON string holding JSON holding JSON, the canary's `/` escaped at the innermost level."""
    link = value(registry, "share_link")
    inner = json.dumps({"url": link}).replace("/", "\\u002f")
    data = json.dumps({"args": json.dumps({"payload": inner})}).encode()
    assert link.encode() not in data
    (hit,) = [h for h in m.find(data) if h.tenant == VICTIM]
    assert hit.kind == "share_link" and hit.encoding == "json"
    assert m.redact(data).count(b"<bob:share_link>") == 1


# -- compression ---------------------------------------------------------------------------------------------

COMPRESSORS = {
    "gzip": gzip.compress,
    "zlib": zlib.compress,
    "xz": lzma.compress,
    "lzma": lambda d: lzma.compress(d, format=lzma.FORMAT_ALONE),
    "bz2": bz2.compress,
    "zstd": zstd.compress,
    "br": brotli.compress,
}


@pytest.mark.parametrize("codec", sorted(COMPRESSORS))
def test_compressed_files(tmp_path: Path, registry: Registry, m: Matcher, codec: str) -> None:
    """A rotated log as logrotate writes it (`agent.log.2.xz`, `agent.log.3.bz2`, ...), the canary deep in it."""
    key = value(registry, "key").encode()
    text = b"".join(b'{"i": %d, "msg": "tool call ok"}\n' % i for i in range(20000))
    path = tmp_path / f"agent.log.2.{codec}"
    path.write_bytes(COMPRESSORS[codec](text + b'{"auth": "' + key + b'"}\n' + text))
    assert key not in path.read_bytes()
    hits = [h for h in scan_file(path, m) if h.tenant == VICTIM]
    assert [(h.kind, h.encoding, h.offset) for h in hits] == [("key", codec, len(text) + len(b'{"auth": "'))]
    clean = tmp_path / f"clean.log.{codec}"
    clean.write_bytes(COMPRESSORS[codec](text + b'{"auth": "' + near_misses(key.decode())[0].encode() + b'"}\n'))
    assert [h for h in scan_file(clean, m) if h.tenant == VICTIM] == []


@pytest.mark.parametrize("codec", ["xz", "bz2", "zstd", "br", "lzma"])
def test_compression_negative_control(tmp_path: Path, registry: Registry, m: Matcher, codec: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "x.bin"
    text = b"".join(b'{"i": %d, "msg": "tool call ok"}\n' % i for i in range(2000))
    path.write_bytes(COMPRESSORS[codec](text + b"k=" + value(registry, "key").encode() + text))
    assert found(scan_file(path, m))
    real = codecs.decode
    monkeypatch.setattr(codecs, "decode", lambda c, chunks, p: iter(()) if c == codec else real(c, chunks, p))
    assert not found(scan_file(path, m))


def test_zip_and_tar_members(tmp_path: Path, registry: Registry, m: Matcher) -> None:
    import tarfile

    soul = value(registry, "soul").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("a.txt", b"x" * 1000)
        zf.writestr("b/SOUL.md", b"y" * 5000 + soul)
    assert ("soul", "deflate", "deflate") in found(scan_bytes(buf.getvalue(), m))
    tar = tmp_path / "backup.tar.xz"
    with tarfile.open(tar, "w:xz") as tf:
        info = tarfile.TarInfo("home/SOUL.md")
        info.size = len(soul)
        tf.addfile(info, io.BytesIO(soul))
    assert ("soul", "xz", "xz") in found(scan_file(tar, m))


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "zstd", "xz", "bzip2", "gzip, br"])
def test_flow_content_encodings(registry: Registry, m: Matcher, encoding: str) -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": value(registry, "memory")}]}).encode()
    raw = body
    for enc in [e.strip() for e in encoding.split(",")]:
        raw = {"gzip": gzip.compress, "deflate": zlib.compress, "br": brotli.compress, "zstd": zstd.compress,
               "xz": lzma.compress, "bzip2": bz2.compress}[enc](raw)
    report = inspect_request(registry, m, Route("reverse", listen_port=44000),
                             RawRequest("f1", "POST", "/v1/chat/completions", [("content-encoding", encoding)], raw))
    assert [(f.victim, f.canary, f.encoding) for f in report.findings] == [(VICTIM, "memory", encoding.replace(
        ", ", "+"))]


def test_flow_body_layers_and_a_cut_body(registry: Registry, m: Matcher) -> None:
    """A response carrying gzip inside base64 inside JSON is found by the layers the file scanner uses."""
    soul = value(registry, "soul").encode()
    body = json.dumps({"b": base64.b64encode(gzip.compress(b"x" * 99 + soul)).decode()}).encode()
    report = inspect_response(m, RawResponse("f2", 200, [], body), tenant=OWNER)
    assert [(f.canary, f.encoding, f.location) for f in report.findings] == [
        ("soul", "base64/gzip", "flow:f2:response.body@7:base64@0:gzip@99")]
    from harness.detect import decode

    bomb = gzip.compress(b"\0" * (decode.MAX_BODY + 100) + soul)
    report = inspect_response(m, RawResponse("f3", 200, [("content-encoding", "gzip")], bomb), tenant=OWNER)
    assert report.findings == []
    assert [(n.path, n.reason, n.partial) for n in report.not_inspected] == [
        ("flow:f3:response.body", "body truncated", True)]


# -- escapes: JSON, percent, HTML ----------------------------------------------------------------------------


def _escaped_forms(v: str) -> dict[str, str]:
    forms = {
        "u002f": v.replace("/", "\\u002f"),
        "u002F": v.replace("/", "\\u002F"),
        "u002d": v.replace("-", "\\u002d"),
        "every other": "".join(f"\\u{ord(c):04x}" if i % 2 else c for i, c in enumerate(v)),
        "slash": v.replace("/", "\\/"),
        "pct lower": urllib.parse.quote(v, safe="").lower(),
        "pct upper": urllib.parse.quote(v, safe=""),
        "plus": urllib.parse.quote_plus(v),
        "pct every byte lower": "".join(f"%{b:02x}" for b in v.encode()),
        "html": v.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"),
    }
    return {k: f for k, f in forms.items() if f != v}


@pytest.mark.parametrize("kind", ["share_link", "workdir", "key"])
def test_escapes_of_any_character(registry: Registry, m: Matcher, kind: str) -> None:
    v = value(registry, kind)
    for name, form in _escaped_forms(v).items():
        data = b'{"text": "see ' + form.encode() + b' now"}'
        hits = [h for h in m.find(data) if h.tenant == VICTIM]
        assert [h.kind for h in hits] == [kind], (name, form)
        assert data[hits[0].start : hits[0].end] == form.encode(), name
        for near in near_misses(v):
            twin = b'{"text": "see ' + _escaped_forms(near).get(name, near).encode() + b' now"}'
            assert [h for h in m.find(twin) if h.tenant == VICTIM] == [], (name, near)


def test_json_escapes_negative_control(registry: Registry, m: Matcher, monkeypatch: pytest.MonkeyPatch) -> None:
    v = value(registry, "workdir")
    data = v.replace("-", "\\u002d").encode()
    assert m.find(data)
    monkeypatch.setattr(matcher.Matcher, "_escaped", lambda self, data, starts: [])
    assert not m.find(data)


def test_handwritten_canary_in_every_form(hand: tuple[Registry, Matcher]) -> None:
    _, mat = hand
    forms = {
        "json.dumps": json.dumps({"v": HANDWRITTEN}),  # é and the emoji escaped, 🙂 as a surrogate pair
        "json.dumps upper": re.sub(r"\\u[0-9a-f]{4}", lambda m: "\\u" + m.group()[2:].upper(),
                                   json.dumps({"v": HANDWRITTEN})),
        "raw utf-8": json.dumps({"v": HANDWRITTEN}, ensure_ascii=False),
        "slash escaped": json.dumps({"v": HANDWRITTEN}).replace("/", "\\/"),
        "html": f"<p>{HANDWRITTEN.replace('&', '&amp;').replace('<', '&lt;').replace('>', '&gt;')}</p>",
        "pct lower": urllib.parse.quote(HANDWRITTEN).lower(),
        "plus": urllib.parse.urlencode({"q": HANDWRITTEN}),
        "base64": base64.b64encode(HANDWRITTEN.encode()).decode(),
        "every char": "".join(f"\\u{u:04x}" for u in _utf16_units(HANDWRITTEN)),
    }
    for name, text in forms.items():
        assert [h.kind for h in mat.find(text.encode())] == ["handwritten_key"], name
    assert encodings_of(HANDWRITTEN)["json"]


def _utf16_units(text: str) -> list[int]:
    data = text.encode("utf-16-be")
    return [int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2)]


# -- chunked transfer-encoding -------------------------------------------------------------------------------


def _chunked(data: bytes, size: int) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(data[i : i + size]), data[i : i + size])
                    for i in range(0, len(data), size)) + b"0\r\n\r\n"


def test_chunked_body_that_splits_the_canary(tmp_path: Path, registry: Registry, m: Matcher) -> None:
    key = value(registry, "key").encode()
    body = b'{"auth": "' + key + b'"}'
    for size in range(1, len(body)):
        chunked = _chunked(body, size)
        if key in chunked:
            continue
        dump = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked
        assert ("key", "chunked", "chunked") in found(scan_bytes(dump, m)), size
        assert ("key", "chunked", "chunked") in found(scan_bytes(chunked, m)), size  # a captured body alone
        twin = dump.replace(b"Transfer-Encoding: chunked", b"X-Other: chunked")
        assert not found(scan_bytes(twin, m))  # the control: not a chunked message, nothing joins the chunks


# -- names ---------------------------------------------------------------------------------------------------


def test_names_in_a_home(tmp_path: Path, registry: Registry) -> None:
    mem, key = value(registry, "memory"), value(registry, "key")
    home = tmp_path / "home"
    (home / "skills" / mem).mkdir(parents=True)
    (home / "skills" / mem / "SKILL.md").write_text("a skill\n")
    (home / "cache").mkdir()
    (home / "cache" / f"{base64.urlsafe_b64encode(key.encode()).decode()}.json").write_text("{}")
    (home / "link").symlink_to(f"/tmp/{key}")
    own = value(registry, "memory", OWNER)
    (home / own).mkdir()  # the owner's own canary in a name is no leak
    result = scan_tree(home, registry, OWNER)
    got = sorted((f.canary, f.encoding, f.location) for f in result.findings)
    assert got == [
        ("key", "name/base64", "cache/<bob:key>.json:name@6"),
        ("key", "target", "link:target@5"),
        ("memory", "name", "skills/<bob:memory>:name@7"),
    ]
    assert all(mem not in f.location and key not in f.location for f in result.findings)
    assert all(mem not in n.path for n in result.not_inspected)
    clean = tmp_path / "clean"
    (clean / "skills" / near_misses(mem)[0]).mkdir(parents=True)
    assert scan_tree(clean, registry, OWNER).findings == []


# -- fail closed: limits, special files ----------------------------------------------------------------------


def test_a_gzip_bomb_with_a_key_after_the_cap_is_inconclusive(tmp_path: Path, registry: Registry) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "bomb.gz").write_bytes(gzip.compress(b"\0" * 300_000 + value(registry, "key").encode()))
    result = scan_tree(home, registry, OWNER, limits=stream.Limits(stream_bytes=100_000))
    assert result.findings == []
    assert result.reasons() == ["not fully inspected: bomb.gz@0:gzip: decompression cap (100000 bytes per stream) "
                                "(100000 bytes read)"]
    total = scan_tree(home, registry, OWNER, limits=stream.Limits(total_bytes=50_000))
    assert [n.reason for n in total.not_inspected] == ["decompression budget (50000 bytes per file) exhausted"]
    assert [f.canary for f in scan_tree(home, registry, OWNER).findings] == ["key"]  # the control


def test_reconcile_gives_a_partial_file_one_reason_and_an_unreadable_one_its_own(
        tmp_path: Path, registry: Registry, deny_open: Callable[[str], None]) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "bomb.gz").write_bytes(gzip.compress(b"\0" * 300_000 + value(registry, "key").encode()))
    (home / "a-locked").write_text("x")
    (tmp_path / "flows.mitm").write_bytes(b"")
    deny_open("a-locked")
    rec = reconcile(registry, tmp_path / "flows.mitm", homes={OWNER: home},
                    reading=Reading(empty_ok=True, limits=stream.Limits(stream_bytes=100_000)))
    # one list in the order the tree was walked (unreadable entries are not set apart)
    assert [n.path for n in rec.not_inspected] == [f"{home}/a-locked", f"{home}/bomb.gz@0:gzip"]
    assert rec.reasons[1:] == [  # after the empty flow file's reason
        f"unreadable file {home / 'a-locked'}",
        f"not fully inspected: {home}/bomb.gz@0:gzip: decompression cap (100000 bytes per stream) (100000 bytes read)"]


def test_special_files_are_listed_and_never_opened(tmp_path: Path, registry: Registry) -> None:
    home = tmp_path / "home"
    home.mkdir()
    os.mkfifo(home / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(home / "agent.sock"))
    try:
        result = scan_tree(home, registry, OWNER)
    finally:
        sock.close()
    assert sorted((n.path, n.reason, n.partial) for n in result.not_inspected) == [
        ("agent.sock", "not a regular file (socket), not opened", False),
        ("pipe", "not a regular file (fifo), not opened", False),
    ]


# -- streaming: windows, big files ---------------------------------------------------------------------------


def test_a_canary_across_every_window_boundary(registry: Registry, m: Matcher, monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    monkeypatch.setattr(stream, "WINDOW", 1 << 14)
    link = value(registry, "share_link")
    forms = [link.encode(), base64.b64encode(b"ab" + link.encode() + b"!"), link.replace("/", "\\u002f").encode()]
    path = tmp_path / "f.log"
    for form in forms:
        for at in range((1 << 14) - len(form) - 2, (1 << 14) + 2):
            path.write_bytes(b"." * at + form + b"." * 40_000)
            hits = [h for h in scan_file(path, m) if h.tenant == VICTIM]
            assert len(hits) == 1 and 0 <= hits[0].offset - at <= 3, (form, at)


def test_a_sparse_file_is_read_in_windows(tmp_path: Path, registry: Registry, m: Matcher) -> None:
    """A 256 MiB file (sparse: nothing is written but the end) with the key in its last bytes."""
    path = tmp_path / "core.bin"
    key = value(registry, "key").encode()
    with path.open("wb") as fh:
        fh.truncate(256 << 20)
        fh.seek(-len(key) - 1, os.SEEK_END)
        fh.write(key)
    (hit,) = scan_file(path, m)
    assert hit.offset == (256 << 20) - len(key) - 1


def test_a_log_is_read_as_a_stream(tmp_path: Path, registry: Registry) -> None:
    log = tmp_path / "agent.log.3.bz2"
    log.write_bytes(bz2.compress(b"line\n" * 1000 + value(registry, "key").encode()))
    result = scan_log(log, registry, None, label="agent.log.3.bz2")
    assert [(f.kind, f.canary, f.encoding, f.location) for f in result.findings] == [
        ("text_leak", "key", "bz2", "agent.log.3.bz2@0:bz2@5000")]


def test_rpc_frame_with_nested_layers(registry: Registry) -> None:
    soul = value(registry, "soul")
    frame = {"jsonrpc": "2.0", "result": {"attachment": base64.encodebytes(gzip.compress(soul.encode())).decode()}}
    findings = scan_text(json.dumps(frame), registry, OWNER, label="rpc-x.jsonl#3", channel="rpc")
    assert [(f.canary, f.encoding) for f in findings] == [("soul", "base64/gzip")]


def test_sqlite_in_a_gzip_is_read_logically(tmp_path: Path, registry: Registry, m: Matcher) -> None:
    db = tmp_path / "s.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE t (v TEXT)")
    conn.execute("INSERT INTO t VALUES (?)", ("x" * 3000 + value(registry, "memory"),))
    conn.commit()
    conn.close()
    data = gzip.compress(db.read_bytes())
    assert ("memory", "gzip", "gzip/sqlite:t.v#1") in found(scan_bytes(data, m))

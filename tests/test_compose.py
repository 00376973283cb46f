"""Composition by construction: a canary inside any chain of up to three supported layers, in any order, is
found in a buffer, a file, an HTTP body and a saved flow file; the same chain around a near miss (one
character changed, the tail cut) gives nothing.

Property-based (hypothesis, derandomized: the same examples on every run): a random canary of a minted
registry at a random offset in random bytes, inside a random chain of layers with random parameters (base64
alphabet and wrap width and line break, hex case, percent-encoding style, chunk size, zip method, and the framings':
where members are cut, quoted-printable's width, encoded words' size, a dump's tool), in a random line of text.
`test_every_pair_of_layers` is the hand-written table: every ordered pair, always.
"""

from __future__ import annotations

import argparse
import base64
import bz2
import gzip
import hashlib
import io
import json
import lzma
import sqlite3
import tarfile
import tempfile
import urllib.parse
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import brotli
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from mitmproxy import http
from mitmproxy import io as mitmio
from mitmproxy.test import tflow

from harness.core.registry import TAG_MARKER, Registry
from harness.detect.engine import codecs, containers
from harness.detect.engine.matcher import Matcher, matcher_for
from harness.detect.engine.stream import Limits, NotInspected, scan_bytes, scan_file
from harness.detect.flows import inspect_flow
from harness.detect.reconcile import read_flows
from harness.proof import framings as F
from tests.registries import with_share_links

try:
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:
    from backports import zstd

VICTIM = "bob"
#: Every example of every test is the same on every run; the whole file takes well under a minute.
#: The most layers a plant's chain has.
MAX_LAYERS = 3
SETTINGS = settings(derandomize=True, database=None, max_examples=300, deadline=timedelta(seconds=10),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# -- the layers -------------------------------------------------------------------------------------------


def _deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-15)
    return c.compress(data) + c.flush()


def _chunked(data: bytes, size: int) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(data[i : i + size]), data[i : i + size])
                    for i in range(0, len(data), size)) + b"0\r\n\r\n"


def _zip(data: bytes, method: int) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as zf:
        zf.writestr("notes/member.txt", data)
    return buf.getvalue()


def _tar(data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("home/member.txt")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _sqlite(data: bytes) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "state.db"
        conn = sqlite3.connect(db)
        conn.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, content BLOB)")
        conn.execute("INSERT INTO messages (content) VALUES (?)", (data,))
        conn.commit()
        conn.close()
        return db.read_bytes()


def _base64(data: bytes, urlsafe: bool, width: int | None, brk: bytes) -> bytes:
    text = (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(data)
    return text if width is None else brk.join(text[i : i + width] for i in range(0, len(text), width))


def _url(data: bytes, style: str) -> bytes:
    if style == "quote":
        return urllib.parse.quote_from_bytes(data, safe="").encode()
    if style == "plus":
        return urllib.parse.quote_plus(data).encode()
    return "".join(f"%{b:02X}" for b in data).encode()


@dataclass(frozen=True)
class Layer:
    """One layer of a chain: a supported kind and the parameters it was drawn with."""

    kind: str
    params: tuple[object, ...]
    encode: Callable[[bytes], bytes] = field(compare=False, repr=False)

    def __repr__(self) -> str:
        return self.kind + (repr(self.params) if self.params else "")


#: Layers whose stream has no magic number: found where a stream (a file, a decoded layer, a member) starts.
AT_A_START = frozenset({"deflate", "lzma", "br", "chunked", "sqlite"})
FIXED: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "zlib": zlib.compress,
    "deflate": _deflate,
    "xz": lzma.compress,
    "lzma": lambda d: lzma.compress(d, format=lzma.FORMAT_ALONE),
    "bz2": bz2.compress,
    "zstd": zstd.compress,
    "br": brotli.compress,
    "json": lambda d: json.dumps(d.decode("latin-1")).encode(),  # binary data written as a JSON string
    "tar": _tar,
    "sqlite": _sqlite,
}
#: The framings that cut or wrap what they carry (docs/detection.md, "Framings"): members back to back,
#: quoted-printable, character references, encoded words, hex dumps.
FRAMINGS = ["members", "qp", "refs", "words", "dump"]
#: Framings whose text is their line's (quoted-printable) or its run of text (references): other text before them
#: on the line is decoded with them.
LINE_FRAMINGS = frozenset({"qp", "refs"})
KINDS = sorted([*FIXED, "base64", "hex", "url", "chunked", "zip", *FRAMINGS])


@st.composite
def layers(draw: st.DrawFn, anywhere: bool = False) -> Layer:
    """A layer of any kind (`anywhere`: of a kind found anywhere in a stream, not only at its start)."""
    kind = draw(st.sampled_from([k for k in KINDS if not anywhere or k not in AT_A_START]))
    if kind in FIXED:
        return Layer(kind, (), FIXED[kind])
    if kind == "base64":
        urlsafe = draw(st.booleans())
        width = draw(st.none() | st.integers(16, 120))
        brk = draw(st.sampled_from([b"\n", b"\r\n", b"\\n"]))
        return Layer(kind, (urlsafe, width, brk), lambda d: _base64(d, urlsafe, width, brk))
    if kind == "hex":
        upper = draw(st.booleans())
        return Layer(kind, (upper,), lambda d: d.hex().upper().encode() if upper else d.hex().encode())
    if kind == "url":
        style = draw(st.sampled_from(["quote", "plus", "every byte"]))
        return Layer(kind, (style,), lambda d: _url(d, style))
    if kind == "chunked":
        size = draw(st.integers(1, 64))
        return Layer(kind, (size,), lambda d: _chunked(d, size))
    if kind in FRAMINGS:
        return draw(framings(kind))
    method = draw(st.sampled_from([zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED]))
    return Layer(kind, (method,), lambda d: _zip(d, method))


@st.composite
def framings(draw: st.DrawFn, kind: str) -> Layer:
    """A framing with random parameters (`harness.proof.framings` writes each as its tool does)."""
    if kind == "members":
        codec = draw(st.sampled_from(["gzip", "bz2", "xz", "zstd"]))
        cuts = tuple(sorted(set(draw(st.lists(st.integers(1, 999), min_size=1, max_size=3)))))
        return Layer(kind, (codec, cuts), F.members(codec, cuts))
    if kind == "qp":  # lines of 60 or more: a soft break ends a line of a token (base64, hex) only when it is full
        width, brk = draw(st.integers(61, 76)), draw(st.sampled_from([b"\n", b"\r\n"]))
        return Layer(kind, (width, brk), lambda d: F.quoted_printable(width, brk)(d) + brk)
    if kind == "refs":
        hexadecimal = draw(st.booleans())
        return Layer(kind, (hexadecimal,), F.references(hexadecimal))
    if kind == "words":
        size, q = draw(st.integers(1, 40)), draw(st.sampled_from("BQ"))
        return Layer(kind, (size, q), F.encoded_words(size, q))
    tool = draw(st.sampled_from(sorted(F.DUMPS)))
    return Layer(kind, (tool,), F.dump(tool))


#: A line of a log: printable text (no byte of it is a base64 character next to the layer: a separator is).
TEXT = st.binary(max_size=80).map(lambda b: bytes(0x20 + c % 95 for c in b))
SEPARATORS = st.sampled_from([b" ", b"\n", b'"', b"=", b": ", b",", b"\t"])


@dataclass(frozen=True)
class Plant:
    """A canary (or a near miss) at a random offset in random bytes, inside a chain of layers (outermost first),
    in a line of text when the outermost layer can be found anywhere."""

    chain: tuple[Layer, ...]
    before: bytes
    after: bytes
    line: tuple[bytes, bytes]

    def wrap(self, value: str) -> bytes:
        data = self.before + value.encode() + self.after
        for layer in reversed(self.chain):
            data = layer.encode(data)
        if self.chain[0].kind in AT_A_START:
            return data
        return self.line[0] + data + self.line[1]


@st.composite
def plants(draw: st.DrawFn, min_layers: int = 1, anywhere: bool = False) -> Plant:
    """A plant in a chain of `min_layers` to 3 layers (`anywhere`: the outermost is found anywhere in a
    stream, as in an HTTP body, whose own encoding its headers name)."""
    chain = (draw(layers(anywhere)), *draw(st.lists(layers(), min_size=min_layers - 1, max_size=MAX_LAYERS - 1)))
    before = draw(st.binary(max_size=200))
    after = draw(st.binary(max_size=40))
    line = (draw(TEXT) + draw(SEPARATORS), draw(SEPARATORS) + draw(TEXT))
    if chain[0].kind == "qp" or (chain[0].kind in LINE_FRAMINGS and len(chain) > 1 and chain[1].kind in AT_A_START):
        # A quoted-printable body starts on a line of its own (its lines are 76 characters at most), and what a
        # framing of whole lines or runs decodes starts there: a stream in it starts with it.
        line = (b"\n", line[1])
    return Plant(chain, before, after, line)


# -- the registry -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Registry:
    return with_share_links(tmp_path_factory.mktemp("reg") / "work", lambda i, n: {"host": f"{n}.llm.test"})


@pytest.fixture(scope="module")
def m(registry: Registry) -> Matcher:
    return matcher_for(registry)


CANARY_KINDS = st.sampled_from(["key", "model", "api_server_key", "memory", "workdir", "share_link"])


def canary(registry: Registry, kind: str) -> str:
    value = registry[VICTIM].all_canaries()[kind]
    assert TAG_MARKER in value
    return value


def near_miss(value: str, draw: st.DrawFn) -> str:
    """`value` with one character changed, or its tail cut."""
    if draw(st.booleans()):
        return value[: len(value) - draw(st.integers(1, 6))]
    i = draw(st.integers(0, len(value) - 1))
    return value[:i] + ("x" if value[i] != "x" else "y") + value[i + 1 :]


def found(hits: list, kind: str) -> bool:
    return (VICTIM, kind) in {(h.tenant, h.kind) for h in hits}


def cut(entries: list[NotInspected]) -> list[NotInspected]:
    """The entries a limit made (depth, size, time) within a plant's layers: none for three layers. (A database
    that cannot be read, such as a fragment of one seen in another's raw pages, is listed too, but is no limit.
    A plant's random bytes may hold layers of their own: a run of base64 characters that decodes to a raw deflate
    stream with a proper end, as `0+4AAAsk` does; the depth cap listing the second of two such layers under three
    of the plant's is the walk's rule at work, past every layer the plant made: `MAX_LAYERS` and the one the cap
    lists.)"""
    return [n for n in entries if n.reason.startswith(("depth cap", "decompression", "time budget"))
            and _depth(n.path) <= MAX_LAYERS + 1]


def _depth(path: str) -> int:
    """How many layers `path` (`bytes@N:LAYER@N:...`, `flow:ID:response.body@N:LAYER@N:...`) names past the
    buffer or body it starts in."""
    parts = path.split(":")
    return len(parts) - 1 - next(i for i, part in enumerate(parts) if "@" in part)


# -- properties -------------------------------------------------------------------------------------------


@SETTINGS
@given(plant=plants(), kind=CANARY_KINDS)
def test_a_canary_in_any_chain_is_found_in_a_buffer_and_a_file(m: Matcher, registry: Registry, plant: Plant,
                                                                kind: str) -> None:
    data = plant.wrap(canary(registry, kind))
    skipped: list[NotInspected] = []
    assert found(scan_bytes(data, m, not_inspected=skipped), kind)
    assert cut(skipped) == []  # three layers are within every bound
    with tempfile.NamedTemporaryFile(suffix=".log") as fh:
        fh.write(data)
        fh.flush()
        assert found(scan_file(fh.name, m), kind)


@SETTINGS
@given(plant=plants(), kind=CANARY_KINDS, data=st.data())
def test_a_near_miss_in_any_chain_is_not_found(m: Matcher, registry: Registry, plant: Plant, kind: str,
                                               data: st.DataObject) -> None:
    value = canary(registry, kind)
    near = near_miss(value, data.draw)
    assume(value.encode() not in plant.before + near.encode() + plant.after)  # a cut tail the bytes after restore
    hits = scan_bytes(plant.wrap(near), m)
    assert [h for h in hits if h.tenant == VICTIM] == []


def _flow(body: bytes) -> http.HTTPFlow:
    flow = tflow.tflow(resp=True)
    flow.request.host = "alice.llm.test"
    flow.request.headers["host"] = "alice.llm.test"
    flow.response.headers.clear()
    flow.response.raw_content = body
    return flow


@settings(SETTINGS, max_examples=100)
@given(plant=plants(min_layers=3, anywhere=True), kind=CANARY_KINDS)
def test_three_layers_are_found_in_a_file_a_body_and_a_flow_file(m: Matcher, registry: Registry, plant: Plant,
                                                                  kind: str) -> None:
    body = plant.wrap(canary(registry, kind))
    with tempfile.NamedTemporaryFile(suffix=".log") as fh:
        fh.write(body)
        fh.flush()
        assert found(scan_file(fh.name, m), kind)
    flow = _flow(body)
    report = inspect_flow(registry, m, flow)
    assert report.request.tenant == "alice"
    assert (VICTIM, kind) in {(f.victim, f.canary) for f in report.findings}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "flows.mitm"
        with path.open("wb") as fh:
            mitmio.FlowWriter(fh).add(flow)
        (saved,), reason = read_flows(path)
        assert reason is None
        report = inspect_flow(registry, m, saved)
        assert (VICTIM, kind) in {(f.victim, f.canary) for f in report.findings}
        assert cut(report.not_inspected) == []


# -- the hand-written table -------------------------------------------------------------------------------

PAIR_LAYERS = {**{k: Layer(k, (), f) for k, f in FIXED.items()},
               "base64": Layer("base64", (), base64.b64encode),
               "base64url": Layer("base64url", (), base64.urlsafe_b64encode),
               "wrapped": Layer("wrapped", (), base64.encodebytes),
               "wrapped-json": Layer("wrapped-json", (), lambda d: base64.encodebytes(d).replace(b"\n", b"\\n")),
               "hex": Layer("hex", (), lambda d: d.hex().encode()),
               "url": Layer("url", (), lambda d: _url(d, "quote")),
               "chunked": Layer("chunked", (), lambda d: _chunked(d, 7)),
               "zip": Layer("zip", (), lambda d: _zip(d, zipfile.ZIP_DEFLATED)),
               "zip-stored": Layer("zip-stored", (), lambda d: _zip(d, zipfile.ZIP_STORED)),
               "members": Layer("members", (), F.members("gzip", (500,))),
               "qp": Layer("qp", (), lambda d: F.quoted_printable(76)(d) + b"\r\n"),
               "refs": Layer("refs", (), F.references(False)),
               "words": Layer("words", (), F.encoded_words(9)),
               "dump": Layer("dump", (), F.dump("xxd"))}


@pytest.mark.parametrize("inner", sorted(PAIR_LAYERS))
@pytest.mark.parametrize("outer", sorted(PAIR_LAYERS))
def test_every_pair_of_layers(m: Matcher, registry: Registry, outer: str, inner: str) -> None:
    """Every ordered pair, in a file of its own (a layer without a magic number is at its start), around
    text that compresses (the canary deep in it) and around a near miss."""
    text = b"".join(b'{"i": %d, "msg": "tool call ok"}\n' % i for i in range(40))
    value = canary(registry, "memory")
    plant = Plant((PAIR_LAYERS[outer], PAIR_LAYERS[inner]), text + b"remember ", b"0123456789abcdef" + text,
                  (b"", b""))
    assert found(scan_bytes(plant.wrap(value), m), "memory")
    assert not found(scan_bytes(plant.wrap(value[:-1] + chr(ord(value[-1]) ^ 1)), m), "memory")


# -- bounds, fast paths, the request line -----------------------------------------------------------------


def test_the_time_budget_stops_decoding_and_is_listed(m: Matcher, registry: Registry) -> None:
    data = b"blob=" + base64.b64encode(gzip.compress(b"x" * 100 + canary(registry, "key").encode())) + b";"
    skipped: list[NotInspected] = []
    assert not found(scan_bytes(data, m, limits=Limits(seconds=0), not_inspected=skipped), "key")
    assert [(n.path, n.partial) for n in skipped] == [("bytes@5:base64", True)]
    assert skipped[0].reason.startswith("time budget (0 s per file) spent")
    assert found(scan_bytes(data, m), "key")  # the control: time was the cause


def test_past_the_depth_cap_a_run_is_listed_only_if_it_shows_more(m: Matcher, registry: Registry) -> None:
    """A run of hex digits decodes to something whatever it is: past the cap it is listed only if what it
    decodes to shows a layer with a magic number (or a canary in an encoding of its own)."""
    one = Limits(depth=1)
    garbage = gzip.compress(b"sha256=" + hashlib.sha256(b"a file").hexdigest().encode() + b"\n")
    skipped: list[NotInspected] = []
    assert scan_bytes(garbage, m, limits=one, not_inspected=skipped) == [] and skipped == []
    hidden = gzip.compress(b"blob=" + gzip.compress(canary(registry, "key").encode()).hex().encode() + b"\n")
    assert scan_bytes(hidden, m, limits=one, not_inspected=skipped) == []
    assert [(n.path, n.reason) for n in skipped] == [("bytes@0:gzip@5:hex", "depth cap (1 nested containers)")]
    assert found(scan_bytes(hidden, m), "key")  # the control


def test_the_fast_paths_find_what_the_full_path_does(m: Matcher, registry: Registry,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Two fast paths decide from a stream's first bytes: raw deflate and brotli are tried only where its
    first 32 bytes are not all text, and a zlib, raw deflate or brotli stream is decoded only if its first 64
    bytes decode. The full path (both off) finds the same in every pair of layers, in text and in binary data
    full of zlib magic numbers."""
    value = canary(registry, "soul")
    corpus = [Plant((PAIR_LAYERS[a], PAIR_LAYERS[b]), b"soul: ", b"\n", (b"", b"")).wrap(value)
              for a in PAIR_LAYERS for b in PAIR_LAYERS]
    noise = hashlib.sha256(b"noise").digest() * 256
    corpus += [b"plain text, no layer at all, " + value.encode(), json.dumps({"soul": value}).encode(),
               noise.replace(b"\x00", b"x\x9c") + zlib.compress(value.encode()) + noise.replace(b"\x01", b"x\xda")]
    fast = [scan_bytes(data, m) for data in corpus]
    assert all(found(hits, "soul") for hits in fast)
    monkeypatch.setattr(containers, "_TEXT", b"")
    monkeypatch.setattr(codecs, "plausible", lambda codec, head: True)
    assert [scan_bytes(data, m) for data in corpus] == fast


def test_base64_in_a_query_string(m: Matcher, registry: Registry) -> None:
    """The request line is scanned with its layers too: brotli in base64 in a percent-encoded query."""
    state = b"x" * 200 + canary(registry, "memory").encode() + b"y" * 200  # compressed: no literal of it in the stream
    token = urllib.parse.quote(base64.b64encode(brotli.compress(state)), safe="")
    flow = _flow(b"{}")
    flow.request.path = f"/v1/chat/completions?state={token}&x=1"
    report = inspect_flow(registry, m, flow)
    (finding,) = [f for f in report.findings if f.victim == VICTIM]
    assert (finding.canary, finding.encoding) == ("memory", "url/base64/br")
    assert finding.location == f"flow:{flow.id}:request.path@27:url@0:base64@0:br@200"


def test_the_time_budget_is_an_option() -> None:
    from harness import arguments

    parser = argparse.ArgumentParser()
    arguments.limit_options(parser)
    assert arguments.limits(parser.parse_args([])).seconds == Limits().seconds
    assert arguments.limits(parser.parse_args(["--max-seconds", "2.5"])).seconds == 2.5
    with pytest.raises(arguments.UsageError):
        arguments.limits(parser.parse_args(["--max-seconds", "-1"]))


def test_the_fast_path_for_database_values_finds_what_the_full_path_does(
        tmp_path: Path, m: Matcher, registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """The values of 32 rows are first looked at joined: a database whose rows hold, here and there, a canary
    in every pair of layers (text or binary, whole or in a value's middle), the rest prose, gives the same
    hits as scanning every value alone, and finds every plant."""
    value = canary(registry, "memory")
    plants = [Plant((PAIR_LAYERS[a], PAIR_LAYERS[b]), b"memory: ", b"\n", (b"", b"")).wrap(value)
              for a in PAIR_LAYERS for b in PAIR_LAYERS]
    prose = b"the agent called tool terminal with arguments and returned output while reading file config "
    db = tmp_path / "state.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, content BLOB, note TEXT)")
    every = 40  # most batches of rows hold no plant
    rows = [(plants[i // every] if i % every == 0 else prose * (1 + i % 5), f"note {i}")
            for i in range(every * len(plants))]
    conn.executemany("INSERT INTO messages (content, note) VALUES (?, ?)", rows)
    conn.commit()
    conn.close()
    fast = scan_file(db, m)
    assert {h.layers[0][0] for h in fast if h.tenant == VICTIM and h.layers} >= {
        f"sqlite:messages.content#{i + 1}" for i in range(0, len(rows), every)}
    monkeypatch.setattr(containers, "may_start", lambda values, min_bytes: True)
    assert scan_file(db, m) == fast

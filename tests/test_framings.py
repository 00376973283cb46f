"""The framings that cut or wrap a value (docs/detection.md, "Framings"): line-delimited records, markup character
references, quoted-printable soft line breaks, RFC 2047 encoded words, a MIME body's base64, compressed members back
to back, text encodings inside UTF-16, hex dumps. For each, a value planted across the framing is found; a near miss
is not (one character changed, one short, the value split with something inserted that is not the framing).
Property tests (hypothesis, derandomized) cut the value at any position across the framing.
"""

from __future__ import annotations

import base64
import itertools
import json
import sqlite3
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mitmproxy.test import tflow

from harness.core.findings import Finding
from harness.core.registry import Registry
from harness.detect.engine import stream, walk
from harness.detect.engine.matcher import Matcher, matcher_for
from harness.detect.engine.stream import Limits, NotInspected, scan_bytes, scan_file
from harness.detect.flows import inspect_flow
from harness.proof import framings as F
from tests.registries import with_share_links

VICTIM = "bob"
SETTINGS = settings(derandomize=True, database=None, max_examples=200, deadline=timedelta(seconds=10),
                    suppress_health_check=[HealthCheck.too_slow])
KINDS = ("key", "memory", "workdir", "share_link")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Registry:
    return with_share_links(tmp_path_factory.mktemp("reg") / "work", lambda i, n: {"host": f"{n}.llm.test"})


@pytest.fixture(scope="module")
def m(registry: Registry) -> Matcher:
    return matcher_for(registry)


def value(registry: Registry, kind: str) -> bytes:
    return registry[VICTIM].all_canaries()[kind].encode()


def found(m: Matcher, data: bytes, skipped: list[NotInspected] | None = None) -> bool:
    return any(h.tenant == VICTIM for h in scan_bytes(data, m, not_inspected=skipped))


# -- the framings: each frames `value` cut at `cut` (its boundary there), or with `insert` at the cut instead ------

def _records(style: str, size: int) -> Callable[[bytes, int, bytes], bytes]:
    def frame(v: bytes, cut: int, insert: bytes = b"") -> bytes:
        text = b"Sure, here it is: " + v[:cut]
        first = F.records(style, max(len(text), 1))(text)  # one record up to the cut, the rest in `size` pieces
        return first + insert + F.records(style, size)(v[cut:] + b" (done)")
    return frame


def _references(v: bytes, cut: int, insert: bytes = b"") -> bytes:
    return b"<p title='" + v[:cut] + insert + F.references(cut % 2 == 1)(v[cut:]) + b"'>x</p>"


def _qp(v: bytes, cut: int, insert: bytes = b"") -> bytes:
    """A mail body in quoted-printable (76 columns, as encoders write it), its text before the value so long that a
    soft line break falls at the cut; the near miss breaks the line there without the `=`."""
    brk = b"\r\n" if cut % 2 else b"\n"
    text = (b"Hi, " + b"as promised, " * 7)[: 75 - cut % 75]  # the first line: the text and value[:cut % 75]
    body = F.quoted_printable(76, brk)(text + v)
    if insert:
        at = body.index(b"=" + brk)
        body = body[:at] + insert + body[at + 1 + len(brk) :]
    return b"Content-Transfer-Encoding: quoted-printable\r\n\r\n" + body + brk


def _words(v: bytes, cut: int, insert: bytes = b"") -> bytes:
    kind = "BQ"[cut % 2]
    first, second = F.encoded_words(len(v), kind)(v[:cut]), F.encoded_words(len(v), kind)(v[cut:])
    return b"Subject: Re: " + first + (insert or b"\r\n ") + second + b"\r\n"


def _mime(v: bytes, cut: int, insert: bytes = b"") -> bytes:
    body = F.mime_base64(b"x" * ((57 - cut) % 57) + v)  # a line of 76 characters holds 57 bytes: it ends at the cut
    if insert:
        at = body.index(b"\r\n")
        body = body[:at] + b"\r\n" + insert + body[at:]
    return b"Content-Transfer-Encoding: base64\r\n\r\n" + body + b"\r\n"


def _members(codec: str) -> Callable[[bytes, int, bytes], bytes]:
    def frame(v: bytes, cut: int, insert: bytes = b"") -> bytes:
        data = b"log line\n" + v + b"\nend\n"
        at = 9 + cut
        first, second = F.members(codec, ())(data[:at]), F.members(codec, ())(data[at:])
        return first + (insert or (b"\0" * 4 if codec == "xz" else b"")) + second
    return frame


def _nested(order: str, encoding: str) -> Callable[[bytes, int, bytes], bytes]:
    def frame(v: bytes, cut: int, insert: bytes = b"") -> bytes:
        encoded = base64.b64encode(b"#" * (cut % 3) + v) if encoding == "base64" else v.hex().encode()
        at = len(encoded) * cut // len(v)
        line = b"2026-01-01 INFO token=" + encoded[:at] + insert + encoded[at:] + b" ok\r\n"
        return F.utf16(order)(line)
    return frame


def _dump(tool: str) -> Callable[[bytes, int, bytes], bytes]:
    width = 30 if tool == "xxd -p" else 16

    def frame(v: bytes, cut: int, insert: bytes = b"") -> bytes:
        pad = (width - cut) % width
        text = F.dump(tool)(b"=" * pad + v + b"\n")  # a line of the dump ends after value[:cut]
        if insert:
            lines = text.split(b"\n")  # a line break first: line k of the dump is lines[k]
            after = (pad + cut) // width
            text = b"\n".join([*lines[: after + 1], insert, *lines[after + 1 :]])
        return b"$ " + tool.encode() + b" note.txt" + text
    return frame


FRAMINGS: dict[str, Callable[..., bytes]] = {
    **{f"records-{style}": _records(style, 3) for style in F.RECORDS},
    "references": _references, "quoted-printable": _qp, "encoded-words": _words, "mime-base64": _mime,
    **{f"members-{codec}": _members(codec) for codec in ("gzip", "bz2", "xz", "zstd")},
    "utf16le/base64": _nested("le", "base64"), "utf16be/hex": _nested("be", "hex"),
    **{f"dump-{tool}": _dump(tool) for tool in F.DUMPS},
}
#: What each framing's near miss inserts at the cut: something that is not the framing.
INSERTED = {"references": b"&#8203;", "quoted-printable": b"\r\n", "encoded-words": b" x ", "mime-base64": b"--",
            "utf16le/base64": "\u00e9".encode(), "utf16be/hex": "\u00e9".encode()}
for _name in FRAMINGS:
    INSERTED.setdefault(_name, b"\n")
INSERTED |= {f"records-{style}": F.records(style, 8)(b"~") for style in F.RECORDS}
INSERTED |= {f"dump-{tool}": b"--" for tool in F.DUMPS}


def _cut_of(v: bytes) -> int:
    return v.index(b"qxcvyb") + 3  # in the marker: the hardest place for records


@pytest.mark.parametrize("name", sorted(FRAMINGS))
@pytest.mark.parametrize("kind", KINDS)
def test_a_value_across_the_framing_is_found(m: Matcher, registry: Registry, name: str, kind: str) -> None:
    v = value(registry, kind)
    for cut in (1, _cut_of(v), len(v) - 1):
        data = FRAMINGS[name](v, cut)
        assert v not in data, "the framing cuts it"
        skipped: list[NotInspected] = []
        assert found(m, data, skipped), (name, cut, data[:300])
        assert [n for n in skipped if n.partial] == []


@pytest.mark.parametrize("name", sorted(FRAMINGS))
def test_near_misses_across_the_framing_are_not_found(m: Matcher, registry: Registry, name: str) -> None:
    v = value(registry, "memory")
    cut = _cut_of(v)
    changed = v[:-4] + (b"0" if v[-4:-3] != b"0" else b"1") + v[-3:]
    assert not found(m, FRAMINGS[name](changed, cut)), "one character changed"
    assert not found(m, FRAMINGS[name](v[:-1], cut)), "one character short"
    assert not found(m, FRAMINGS[name](v, cut, INSERTED[name])), "split by something that is not the framing"


# -- properties: the value cut at any position across the framing ----------------------------------------------

#: Records of other streams between the pieces: a ping event, a usage report, another choice's delta.
NOISE = ['{"type": "ping"}', 'data: {"usage": {"total_tokens": 12}}', json.dumps({"choices": [{"index": 1, "delta": {
    "content": "other"}}]})]


def _cuts(draw: st.DrawFn, n: int) -> list[int]:
    """1 to 4 positions in a value of `n` bytes, in order, none at its ends."""
    return sorted(set(draw(st.lists(st.integers(1, n - 1), min_size=1, max_size=4))))


@st.composite
def framed(draw: st.DrawFn, n: int) -> tuple[str, Callable[[bytes], bytes]]:
    """A framing with random parameters, cutting a value of `n` bytes anywhere: (what it is, the framing)."""
    family = draw(st.sampled_from(["records", "references", "qp", "words", "members", "utf16", "dump"]))
    if family == "records":
        style, sizes, noise = draw(st.sampled_from(sorted(F.RECORDS))), _cuts(draw, n), draw(st.booleans())

        def frame(v: bytes) -> bytes:
            at = [0, *sizes, len(v)]
            text = [b"Sure: " + v[: at[1]], *(v[a:b] for a, b in itertools.pairwise(at[1:]))]
            lines = [F.records(style, len(p) or 1)(p) for p in text]
            return (b"\n" + NOISE[len(v) % 3].encode() + b"\n" if noise else b"").join(lines)
        return f"records {style} cut at {sizes}", frame
    if family == "references":
        refs = draw(st.lists(st.sampled_from([None, False, True]), min_size=n, max_size=n))
        return f"references {refs}", lambda v: b"<td>" + b"".join(
            bytes([c]) if r is None else F.references(r)(bytes([c])) for c, r in zip(v, refs, strict=False)) + b"</td>"
    if family == "qp":
        width, brk = draw(st.integers(4, 76)), draw(st.sampled_from([b"\n", b"\r\n"]))
        return f"qp {width} {brk!r}", lambda v: b"body: " + F.quoted_printable(width, brk)(v) + brk
    if family == "words":
        size, kind = draw(st.integers(1, n)), draw(st.sampled_from("BQ"))
        fold = draw(st.sampled_from([b" ", b"\r\n ", b"\n\t"]))
        return f"words {size} {kind} {fold!r}", lambda v: b"To: " + F.encoded_words(size, kind, fold)(v) + b"\r\n"
    if family == "members":
        codec, cuts = draw(st.sampled_from(["gzip", "bz2", "xz", "zstd"])), _cuts(draw, 1000)
        return f"{codec} members at {cuts}", lambda v: F.members(codec, tuple(cuts))(b"log: " + v + b"\n")
    if family == "utf16":
        order, enc, pad = draw(st.sampled_from(["le", "be"])), draw(st.sampled_from(["base64", "hex"])), draw(
            st.integers(0, 2))

        def nested(v: bytes) -> bytes:
            text = base64.b64encode(b"#" * pad + v) if enc == "base64" else v.hex().encode()
            return F.utf16(order)(b"[INFO] blob " + text + b"\r\n")
        return f"{enc} in utf16{order} after {pad}", nested
    tool, pad = draw(st.sampled_from(sorted(F.DUMPS))), draw(st.integers(0, 31))
    return f"{tool} after {pad}", lambda v: b"$ " + tool.encode() + F.dump(tool)(b"=" * pad + v + b"\n")


@SETTINGS
@given(kind=st.sampled_from(KINDS), data=st.data())
def test_a_value_cut_anywhere_across_any_framing_is_found(m: Matcher, registry: Registry, kind: str,
                                                          data: st.DataObject) -> None:
    v = value(registry, kind)
    what, frame = data.draw(framed(len(v)))
    skipped: list[NotInspected] = []
    assert found(m, frame(v), skipped), what
    assert [n for n in skipped if n.partial] == []


@SETTINGS
@given(kind=st.sampled_from(KINDS), data=st.data())
def test_a_near_miss_across_any_framing_is_not_found(m: Matcher, registry: Registry, kind: str,
                                                     data: st.DataObject) -> None:
    v = value(registry, kind)
    what, frame = data.draw(framed(len(v)))
    tag = v.index(b"qxcvyb") + 6
    at = data.draw(st.integers(tag, tag + 11))
    changed = v[:at] + (b"x" if v[at:at + 1] != b"x" else b"y") + v[at + 1:]
    assert not found(m, frame(changed)), (what, "one character changed")
    assert not found(m, frame(v[:-1])), (what, "one character short")


# -- where a framing is: a JSON string, a database value, a response, a file across windows ------------------------

IN_JSON = ["records-ndjson", "records-jsonrpc", "quoted-printable", "dump-xxd", "dump-hexdump -C", "dump-od -An -tx1",
           "dump-xxd -p", "utf16le/base64"]


@pytest.mark.parametrize("name", IN_JSON)
def test_a_framing_in_a_json_string_is_found(m: Matcher, registry: Registry, name: str) -> None:
    """A tool's output in a provider request: the framing's lines are a JSON string's escaped line breaks."""
    v = value(registry, "memory")

    def body(framed: bytes) -> bytes:
        return json.dumps({"messages": [{"role": "tool", "content": framed.decode("latin-1")}]}).encode()

    assert found(m, body(FRAMINGS[name](v, _cut_of(v))))
    assert not found(m, body(FRAMINGS[name](v[:-1], _cut_of(v))))


def test_records_in_a_database_value_are_reassembled(tmp_path: Path, m: Matcher, registry: Registry) -> None:
    v = value(registry, "key")
    db = tmp_path / "state.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, content TEXT)")
    rows = [("plain words " * 5,)] * 40 + [(FRAMINGS["records-ndjson"](v, _cut_of(v)).decode(),)] + [("x",)] * 40
    conn.executemany("INSERT INTO messages (content) VALUES (?)", rows)
    conn.commit()
    conn.close()
    hits = [h for h in scan_file(db, m) if h.tenant == VICTIM]
    assert [h.layers[-2:] for h in hits] == [(("sqlite:messages.content#41", None), ("records:message.content", 1))]


def test_an_ndjson_response_is_inspected(m: Matcher, registry: Registry) -> None:
    """A streaming provider's NDJSON response (the live addon and `reconcile` share this): the value the body's
    records reassemble is reported at the stream's field, the better evidence; the same records in a response
    that is not a stream (by its content type) are reported in the body's records."""
    v = value(registry, "workdir")

    def leak(content_type: str) -> tuple[str, Finding]:
        flow = tflow.tflow(resp=True)
        flow.request.host = flow.request.headers["host"] = "alice.llm.test"
        flow.response.headers.clear()
        flow.response.headers["content-type"] = content_type
        flow.response.raw_content = F.records("ndjson", 4)(b"working in " + v + b" now")
        (finding,) = [f for f in inspect_flow(registry, m, flow).findings if f.victim == VICTIM]
        return flow.id, finding

    flow_id, finding = leak("application/x-ndjson")
    assert (finding.kind, finding.canary, finding.encoding) == ("response_leak", "workdir", "plain")
    assert finding.location.startswith(f"flow:{flow_id}:response.ndjson.message.content@")
    flow_id, finding = leak("text/plain")
    assert (finding.kind, finding.canary, finding.encoding) == ("response_leak", "workdir", "records")
    assert finding.location.startswith(f"flow:{flow_id}:response.body@1:records:message.content@")


def test_members_in_a_file(tmp_path: Path, m: Matcher, registry: Registry) -> None:
    v = value(registry, "key")
    path = tmp_path / "agent.log.gz"
    path.write_bytes(F.members("gzip", (300, 600))(b"line\n" * 500 + v + b"\n" + b"line\n" * 500))
    assert [(h.kind, h.encoding, h.layers) for h in scan_file(path, m) if h.tenant == VICTIM] == [
        ("key", "gzip", (("gzip", 0),))]


@pytest.mark.parametrize("shift", range(-40, 41, 8))
def test_records_cut_across_a_window_boundary(tmp_path: Path, m: Matcher, registry: Registry,
                                              monkeypatch: pytest.MonkeyPatch, shift: int) -> None:
    """The next window reassembles the records near a window's end: it holds `records.REACH` bytes before them."""
    monkeypatch.setattr(walk, "WINDOW", 1 << 17)
    monkeypatch.setattr(stream, "WINDOW", 1 << 17)
    v = value(registry, "memory")
    framed = FRAMINGS["records-ndjson"](v, _cut_of(v))
    cut = framed.index(b"qxc") + 3
    filler = b"".join(b'{"id": %d, "text": "filler"}\n' % i for i in range(12000))
    head = filler[: (1 << 17) - cut + shift * 64]
    path = tmp_path / "stream.jsonl"
    path.write_bytes(head[: head.rfind(b"\n") + 1] + framed + filler)
    skipped: list[NotInspected] = []
    assert [h.kind for h in scan_file(path, m, not_inspected=skipped) if h.tenant == VICTIM] == ["memory"]
    assert skipped == []


def test_records_read_around_a_cut_are_bounded_and_the_bound_is_listed(m: Matcher, registry: Registry) -> None:
    """A value spread one character a record over records so big that `records.REACH` bytes around its cut hold
    only part of it: it is not found, and the bound is listed (the run is inconclusive, never clean). The same
    stream with small records is read whole: found, nothing listed."""
    v = value(registry, "memory")

    def stream_of(padding: int) -> bytes:
        text = [b"a"] * 20 + [v[i : i + 1] for i in range(len(v))] + [b"b"] * 20
        return b"".join(json.dumps({"pad": "p" * padding, "text": t.decode()}).encode() + b"\n" for t in text)

    skipped: list[NotInspected] = []
    assert not found(m, stream_of(4000), skipped)
    assert [(n.reason.startswith("records: the text at text may go on past the 32 KiB"), n.partial) for n in skipped] \
        == [(True, True)]
    skipped.clear()
    assert found(m, stream_of(10), skipped) and skipped == []


def test_a_cut_point_outside_every_record_lists_no_bound(m: Matcher, registry: Registry) -> None:
    """A form of the marker on a line that is no record (a path in a log line, base64 in a flow file) is no value
    cut across records: the records before it (a stream whose fields repeat) are not its, so nothing is listed.
    The same marker form inside the last of those records is (the near miss of the bound's own test)."""
    v = value(registry, "memory")
    marker = v[v.index(b"qxc"):][:6]
    chunks = b"".join(b'{"id": "chunk", "n": %d}\n' % i for i in range(3))
    log = b"# a log line of no record\n" * 2000
    tail = b'plain text "home-' + marker + b'0123456789/x" here\n' + log

    skipped: list[NotInspected] = []
    assert not found(m, log + chunks + b"# between\n" * 100 + tail, skipped)
    assert skipped == []
    inside = chunks + b'{"id": "home-' + marker + b'0123"}\n'
    assert not found(m, log + inside + log, skipped)
    assert [n.reason.startswith("records: the text at id may go on past") for n in skipped] == [True]


def test_a_text_cut_in_its_last_line_is_read_to_its_end(m: Matcher, registry: Registry) -> None:
    """Records whose text ends in a line cut short (a file truncated mid-record) are read to the end when it is
    within reach: a form of the marker in the last whole record lists no bound (nothing lies past what was read)."""
    v = value(registry, "memory")
    near = v[:-1].decode() + " (cut)"
    lines = [json.dumps({"i": i, "role": "user", "content": "hello"}) for i in range(50)]
    text = "\n".join([*lines, json.dumps({"i": 50, "role": "user", "content": near}), '{"i": 51, "role": "us'])
    skipped: list[NotInspected] = []
    assert not found(m, text.encode(), skipped)
    assert skipped == []


def test_reassembly_stops_at_the_time_budget(m: Matcher, registry: Registry) -> None:
    v = value(registry, "memory")
    skipped: list[NotInspected] = []
    assert not any(h.tenant == VICTIM for h in scan_bytes(FRAMINGS["records-sse"](v, _cut_of(v)), m,
                                                           limits=Limits(seconds=0), not_inspected=skipped))
    assert [n.reason.split(" (")[0] for n in skipped] == ["time budget"] and skipped[0].partial


# -- damaged input, bombs ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(FRAMINGS))
def test_a_truncated_or_damaged_framing_is_scanned_and_never_raises(m: Matcher, registry: Registry, name: str) -> None:
    """Cut anywhere, or with a byte flipped, a framing decodes what it can; whatever is left is scanned raw."""
    data = FRAMINGS[name](value(registry, "memory"), 5)
    for cut in range(0, len(data), max(1, len(data) // 23)):
        scan_bytes(data[:cut], m)
        scan_bytes(data[:cut] + bytes([data[cut] ^ 0x5A]) + data[cut + 1 :], m)


def test_a_damaged_member_keeps_the_members_before_it(m: Matcher, registry: Registry) -> None:
    v = value(registry, "key")
    first, second = F.members("gzip", ())(b"a" * 100 + v), F.members("gzip", ())(b"b" * 100)
    assert found(m, first + second[:12] + b"\xff" * 20)  # the second member damaged in its first block


def test_members_are_one_stream_within_the_caps(m: Matcher, registry: Registry) -> None:
    """Members back to back are one stream within the stream cap: a member the cap cuts is listed (nothing past the
    cap is read), and a member after it is read from its own start, the members after it with it."""
    v = value(registry, "key")
    bomb = F.members("gzip", ())(b"\0" * (8 << 20) + v) + F.members("gzip", (500,))(b"tail " + value(registry, "soul"))
    skipped: list[NotInspected] = []
    hits = scan_bytes(bomb, m, limits=Limits(stream_bytes=1 << 20), not_inspected=skipped)
    assert [h.kind for h in hits if h.tenant == VICTIM] == ["soul"]  # the key is past the cap, the soul is not
    assert [(n.reason.split(" (")[0], n.partial) for n in skipped] == [("decompression cap", True)]
    assert {h.kind for h in scan_bytes(bomb, m) if h.tenant == VICTIM} == {"key", "soul"}  # within the default caps


@pytest.mark.parametrize("order", ["le", "be"])
@pytest.mark.parametrize("encoding", ["base64", "hex"])
def test_utf16_after_other_text_on_its_line(m: Matcher, registry: Registry, order: str, encoding: str) -> None:
    """A UTF-16 run after ASCII text (a log line's head, a JSON string's): both byte orders are tried, so the text
    before it does not shift the run's characters."""
    v = value(registry, "memory")
    encoded = base64.b64encode(v) if encoding == "base64" else v.hex().encode()
    assert found(m, b"note: " + F.utf16(order)(encoded) + b"\n")
    assert not found(m, b"note: " + F.utf16(order)(encoded[:-2]) + b"\n")

"""A conversation's requests scanned for what is new (`harness.detect.prefixes`): the findings are a full scan's,
finding for finding (location, encoding, evidence, tool), whatever the conversation and wherever its canaries are.

Property-based (hypothesis, derandomized): random conversations (user, assistant, tool-call and tool messages of
random lengths) with another tenant's canaries planted in random messages at random offsets, in every encoding
the scanner reads (plain, JSON-escaped, base64, gzip in base64, hex, percent-encoded), and near misses; at the end
of the last message two requests share, at the start of the first they do not, and cut in two across that
boundary. Its requests grow, fork and change their tail; each is inspected with and without the kept prefixes.
"""

from __future__ import annotations

import base64
import gzip
import itertools
import json
import urllib.parse
import zlib
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.core.registry import Registry, mint
from harness.detect.checks import RawRequest
from harness.detect.engine.matcher import Matcher, matcher_for
from harness.detect.flows import check_request
from harness.detect.prefixes import Prefixes
from harness.detect.reports import RequestReport
from harness.detect.routes import Route, endpoint_of

SETTINGS = settings(derandomize=True, database=None, max_examples=150, deadline=timedelta(seconds=20),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
ROUTE = Route("reverse", listen_port=43001)
WORDS = ["the", "agent", "ran", "terminal", "and", "read", "file", "config.yaml", "ok", "\\n", "done.", "{", "}",
         "\"quoted\"", "path/to/x", "x^2", "%20", "é", "AAAA"]
#: How a planted value is written into the JSON body: each gives bytes that are valid inside a JSON string.
ENCODINGS = {
    "plain": lambda v: v.encode(),
    "json": lambda v: "".join(f"\\u{ord(c):04x}" if c in "/-" else c for c in v).encode(),
    "slash": lambda v: v.replace("/", "\\/").encode(),
    "base64": lambda v: base64.b64encode(v.encode()),
    "gzip": lambda v: base64.b64encode(gzip.compress(v.encode(), mtime=0)),
    "hex": lambda v: v.encode().hex().encode(),
    "url": lambda v: urllib.parse.quote(v, safe="").encode(),
}


@pytest.fixture(scope="module")
def reg(tmp_path_factory: pytest.TempPathFactory) -> Registry:
    return mint(["alpha", "beta", "gamma"], tmp_path_factory.mktemp("work"),
                {"alpha": {"listen": 43001}, "beta": {"listen": 43002}, "gamma": {"listen": 43003}})


@st.composite
def plants(draw: st.DrawFn, reg: Registry) -> bytes:
    """Another tenant's canary (or a near miss: one character changed) in one of the encodings."""
    victim = reg[draw(st.sampled_from(["beta", "gamma", "alpha"]))]
    value = draw(st.sampled_from(sorted(victim.all_canaries().values())))
    if draw(st.booleans()) and len(value) > 4:
        at = draw(st.integers(0, len(value) - 1))
        value = value[:at] + ("x" if value[at] != "x" else "y") + value[at + 1:]
    return ENCODINGS[draw(st.sampled_from(sorted(ENCODINGS)))](value)


@st.composite
def texts(draw: st.DrawFn, reg: Registry) -> list[bytes]:
    """A message's content as raw pieces: words (JSON-escaped), with plants between any two of them or touching
    them."""
    n, ascii_only = draw(st.sampled_from([3, 40, 300])), draw(st.booleans())
    words = draw(st.lists(st.sampled_from(WORDS), min_size=n, max_size=n))
    pieces = [piece for w in words for piece in (json.dumps(w, ensure_ascii=ascii_only)[1:-1].encode(), b" ")]
    for _ in range(draw(st.integers(0, 2))):
        pieces.insert(draw(st.integers(0, len(pieces))), draw(plants(reg)))
    return pieces


@st.composite
def conversations(draw: st.DrawFn, reg: Registry) -> list[dict]:
    """Messages, each {"role", "content": raw pieces} (an assistant's may call a tool, whose result follows)."""
    out: list[dict] = [{"role": "system", "content": draw(texts(reg))}]
    for n in range(draw(st.integers(1, 10))):
        role = draw(st.sampled_from(["user", "assistant", "tool-call"]))
        if role == "tool-call":
            name = draw(st.sampled_from(["terminal", "memory", "read_file"]))
            out.append({"role": "assistant", "content": [b""], "call": (f"call_{n}", name, draw(texts(reg)))})
            out.append({"role": "tool", "content": draw(texts(reg)), "tool_call_id": f"call_{n}"})
        else:
            out.append({"role": role, "content": draw(texts(reg))})
    return out


def message(m: dict) -> bytes:
    """One message as JSON, its content's raw pieces written in as they are."""
    fields = [b'"role": "' + m["role"].encode() + b'"', b'"content": "' + b"".join(m["content"]) + b'"']
    if "call" in m:
        call_id, name, args = m["call"]
        fields.append(b'"tool_calls": [{"id": "' + call_id.encode() + b'", "type": "function", "function": '
                      b'{"name": "' + name.encode() + b'", "arguments": "' + b"".join(args) + b'"}}]')
    if "tool_call_id" in m:
        fields.append(b'"tool_call_id": "' + m["tool_call_id"].encode() + b'"')
    return b"{" + b", ".join(fields) + b"}"


def body(messages: list[dict], tail: bytes) -> bytes:
    return b'{"messages": [' + b", ".join(map(message, messages)) + b"], " + tail + b"}"


def inspect(reg: Registry, matcher: Matcher, data: bytes, prefixes: Prefixes | None) -> RequestReport:
    raw = RawRequest("f1", "POST", "/v1/chat/completions", [("authorization", f"Bearer {reg['alpha'].key}")], data)
    return check_request(reg, matcher, raw, endpoint_of(reg, ROUTE), prefixes)


def same(a: RequestReport, b: RequestReport) -> None:
    assert [f.to_dict() for f in a.findings] == [f.to_dict() for f in b.findings]
    assert a.not_inspected == b.not_inspected


@SETTINGS
@given(data=st.data())
def test_a_conversation_scanned_for_what_is_new_has_the_findings_of_full_scans(reg, data):
    matcher, known = matcher_for(reg), Prefixes()
    messages = data.draw(conversations(reg))
    tails = [b'"model": "' + reg["alpha"].model.encode() + b'", "stream": true',
             b'"model": "m", "tools": [{"type": "function", "function": {"name": "' + b"".join(data.draw(texts(reg)))
             + b'"}}]']
    lengths = sorted(data.draw(st.lists(st.integers(1, len(messages)), min_size=2, max_size=6)))
    for n in lengths:
        requests = [messages[:n]]
        if data.draw(st.booleans()) and n > 1:  # a fork: the last message another one
            requests.append([*messages[: n - 1], {"role": "user", "content": data.draw(texts(reg))}])
        for sent in requests:
            raw = body(sent, data.draw(st.sampled_from(tails)))
            same(inspect(reg, matcher, raw, None), inspect(reg, matcher, raw, known))


@SETTINGS
@given(data=st.data())
def test_canaries_at_and_across_the_boundary_of_old_and_new(reg, data):
    """The last message two requests share ends with a plant (its snippet reaches into what follows, which differs)
    and the next starts with one; or one canary is cut in two across the boundary (no finding, in either scan)."""
    matcher, known = matcher_for(reg), Prefixes()
    messages = data.draw(conversations(reg))
    value, other = (data.draw(st.sampled_from(sorted(reg[t].all_canaries().values()))) for t in ("beta", "gamma"))
    encode = ENCODINGS[data.draw(st.sampled_from(sorted(ENCODINGS)))]
    cut = data.draw(st.integers(1, len(value) - 1))
    pad = b"word " * data.draw(st.integers(0, 400))
    if data.draw(st.booleans()):
        old_end, new_start = encode(value[:cut]), encode(value[cut:])
    else:
        old_end, new_start = encode(value), encode(other)
    first = [*messages, {"role": "user", "content": [pad, old_end]}]
    if data.draw(st.booleans()):  # an empty message last: the plant's snippet reaches past it, into what differs
        first.append({"role": "user", "content": []})
    second = [*first, {"role": "assistant", "content": [new_start, pad]}]
    for sent in (first, second):
        raw = body(sent, b'"model": "m"')
        same(inspect(reg, matcher, raw, None), inspect(reg, matcher, raw, known))


def _stored_zlib(secret: bytes) -> tuple[bytes, bytes]:
    """Two requests, the second's messages m0, m1, m2 extending the first's m0, m1. m0's text starts a zlib stream
    (`x^` is a zlib header) whose stored block copies what follows, `secret` first, over m1 into m2, where its
    checksum is. In the first request other bytes follow m1: its block fails the checksum and decodes to nothing."""
    for n, k in itertools.product(range(100), range(1000)):
        m1 = b'{"role": "user", "content": "' + b"w" * 8300 + b"%03d" % k + b'"}'
        head = b"found " + secret + b" " + b"p" * n
        payload = head + b'"}, ' + m1 + b', {"role": "user", "content": "'
        stored = len(payload).to_bytes(2, "little") + (len(payload) ^ 0xFFFF).to_bytes(2, "little")
        check = zlib.adler32(payload).to_bytes(4, "big")
        if all((0x20 <= c < 0x7F and c not in b'"\\') or c >= 0xA0 for c in stored + check):  # JSON string text
            m0 = b'{"role": "user", "content": "x^1' + stored + head + b'"}'
            m2 = b'{"role": "user", "content": "' + check + b'"}'
            return (b'{"messages": [' + m0 + b", " + m1 + b'], "model": "' + b"m" * 64 + b'"}',
                    b'{"messages": [' + m0 + b", " + m1 + b", " + m2 + b'], "model": "m"}')
    raise AssertionError("no stored block whose lengths and checksum are JSON string text")


def test_a_layer_read_across_where_the_scan_would_resume_makes_the_next_request_scanned_whole(reg):
    """The first request's block read on past the message where the next request's scan would resume (to the end
    of the body, as a stream that fails may): that request is scanned whole, and its block's canary found."""
    matcher, known = matcher_for(reg), Prefixes()
    first, second = _stored_zlib(reg["beta"].canaries["soul"].encode())
    found = [inspect(reg, matcher, body, known) for body in (first, second)]
    assert [sorted(f.encoding for f in r.findings) for r in found] == [["plain"], ["plain", "zlib"]]
    for report, body in zip(found, (first, second), strict=True):
        same(report, inspect(reg, matcher, body, None))
    assert known.resumed == 0


def test_the_next_request_resumes_and_a_canary_in_its_new_messages_is_found(reg):
    matcher, known = matcher_for(reg), Prefixes()
    words = [b"history " * 200]
    messages = [{"role": "system", "content": words}, {"role": "user", "content": words}]
    first = inspect(reg, matcher, body(messages, b'"model": "m"'), known)
    secret = reg["beta"].canaries["soul"].encode()
    messages.append({"role": "tool", "content": [b"found ", secret], "tool_call_id": "c1"})
    second = inspect(reg, matcher, body(messages, b'"model": "m"'), known)
    assert (first.findings, known.resumed) == ([], 1)
    assert [(f.kind, f.victim, f.canary) for f in second.findings] == [("request_leak", "beta", "soul")]
    same(second, inspect(reg, matcher, body(messages, b'"model": "m"'), None))


def test_past_its_budget_the_least_recently_used_scans_go_and_their_next_request_is_scanned_whole(reg):
    matcher, known = matcher_for(reg), Prefixes(budget=1)
    messages = [{"role": "system", "content": [b"history " * 300, reg["beta"].canaries["memory"].encode()]}]
    for n in range(3):
        messages.append({"role": "user", "content": [f"turn {n} ".encode() * 100]})
        same(inspect(reg, matcher, body(messages, b'"model": "m"'), known),
             inspect(reg, matcher, body(messages, b'"model": "m"'), None))
    assert (known.resumed, known.size) == (0, 0)


def test_another_matcher_or_endpoint_starts_afresh(reg, tmp_path: Path):
    """A reloaded registry (a new matcher) may have canaries the kept scans did not look for; another tenant or
    endpoint's conversation is not this one's."""
    matcher, known = matcher_for(reg), Prefixes()
    messages = [{"role": "system", "content": [b"history " * 300]}, {"role": "user", "content": [b"hi"]}]
    known.scan(body(messages, b'"model": "m"'), matcher, ("alpha", "listen:43001 provider"))
    longer = body([*messages, {"role": "user", "content": [b"more"]}], b'"model": "m"')
    known.scan(longer, matcher, ("alpha", "listen:43009 provider"))
    known.scan(longer, matcher, ("beta", "listen:43001 provider"))
    other = matcher_for(mint(["alpha", "beta"], tmp_path / "work", {"alpha": {"listen": 1}, "beta": {"listen": 2}}))
    known.scan(longer, other, ("alpha", "listen:43001 provider"))
    assert known.resumed == 0
    known.scan(body([*messages, {"role": "user", "content": [b"again"]}], b'"model": "m"'), other,
               ("alpha", "listen:43001 provider"))
    assert known.resumed == 1

"""`FlowScan.headers` checks a message's header lines together before it scans any, and scans layers only in the
lines where one may start; its findings must be exactly those of scanning every line alone, forms first, then
layers for the canaries not yet seen, including a canary cut across two lines."""

from __future__ import annotations

import base64
import random
from pathlib import Path

import pytest
from test_scan import ENCODINGS, encode, make_registry

from harness.core.protocol import FLOW_HEADER
from harness.core.registry import Registry
from harness.detect.decode import KEY_HEADERS
from harness.detect.engine.matcher import Matcher
from harness.detect.flowscan import FlowScan

NAMES = ["x-note", "authorization", "api-key", "content-type", "x-trace", FLOW_HEADER, "cookie", "user-agent"]


def line_by_line(scan: FlowScan, headers: list[tuple[str, str]], prefix: str, skip: frozenset) -> None:
    """The reference: every line alone through the matcher, then every line alone through its layers."""
    lines = [(name.lower(), f"{name}: {value}".encode("utf-8", "surrogateescape"))
             for name, value in headers if name.lower() != FLOW_HEADER]
    for name, line in lines:
        own = skip if name in KEY_HEADERS else frozenset()
        scan.scan(line, f"{prefix}.headers.{name}", skip=own, offsets=False)
    for name, line in lines:
        own = skip if name in KEY_HEADERS else frozenset()
        scan.layered(line, f"{prefix}.headers.{name}", skip=own, only_new=True, offsets=False)


def random_headers(rng: random.Random, reg: Registry) -> list[tuple[str, str]]:
    headers: list[tuple[str, str]] = []
    carry = b""  # the second half of a canary cut at the end of the previous line
    for _ in range(rng.randint(1, 10)):
        value = carry + rng.randbytes(rng.randint(0, 40)).replace(b"\n", b"-")
        carry = b""
        for _ in range(rng.choice((0, 0, 1, 2))):
            tenant = rng.choice(reg.names())
            payload = encode(rng.choice(list(reg[tenant].all_canaries().values())), rng.choice(ENCODINGS))[0]
            if rng.random() < 0.2:  # cut across this line and the next
                cut = rng.randint(1, len(payload) - 1)
                payload, carry = payload[:cut], payload[cut:]
            value += payload + rng.randbytes(rng.randint(0, 8)).replace(b"\n", b"-")
        name = rng.choice(NAMES)
        headers.append((name.title() if rng.random() < 0.3 else name, value.decode("utf-8", "surrogateescape")))
    return headers


def findings(matcher: Matcher, tenant: str | None, scan_it) -> list:
    scan = FlowScan(matcher, "f1", tenant, "request", "request_leak")
    scan_it(scan)
    return scan.findings


@pytest.mark.parametrize("newline_canary", [False, True])
def test_the_header_scan_finds_what_every_line_alone_finds(tmp_path: Path, newline_canary: bool) -> None:
    """Over several registries: their canaries are random, and a joined scan once differed on 6 of 10,000 sets."""
    rng = random.Random(20261203)
    total = 0
    for round_ in range(8):
        reg = make_registry(tmp_path / str(round_))
        if newline_canary:  # a hand-written canary holding a line break: no prefilter, and it may cross lines
            reg.add_canary("carol", "note", "two\nlines-of-carol")
        matcher = Matcher.for_registry(reg)
        for _ in range(250):
            headers = random_headers(rng, reg)
            tenant = rng.choice([None, *reg.names()])
            victim = rng.choice(reg.names())
            skip = frozenset({(victim, rng.choice(["key", "api_server_key", "memory"]))})
            got = findings(matcher, tenant, lambda s, h=headers, k=skip: s.headers(h, "request", k))
            want = findings(matcher, tenant, lambda s, h=headers, k=skip: line_by_line(s, h, "request", k))
            assert got == want, headers
            total += len(want)
    assert total > 800  # the plants were found, not just agreed on as absent


def test_a_line_is_scanned_as_if_alone(tmp_path: Path) -> None:
    """The two cases where one scan of the joined lines differed from the lines alone: a UTF-16 canary at an odd
    offset of the joined lines (its byte order is told by where its line starts) and a base64 form at a line's
    end whose edge character is missing (accepted at a buffer's end, so at a line's end too)."""
    reg = make_registry(tmp_path)
    matcher = Matcher.for_registry(reg)
    memory = reg["carol"].all_canaries()["memory"]
    kind, raw = next((k, v.encode()) for k, v in reg["bob"].all_canaries().items() if len(v.encode()) % 3)
    cut = base64.b64encode(raw)[: len(raw) * 8 // 6].decode()  # without the last character, half the next byte's
    headers = [("x-a", "odd"), ("cookie", memory.encode("utf-16-be").decode("latin-1")),
               ("authorization", f"Bearer {cut}"), ("x-b", "Zz")]
    got = findings(matcher, "alice", lambda s: s.headers(headers, "request"))
    assert [(f.victim, f.canary, f.location, f.encoding) for f in got] == [
        ("carol", "memory", "flow:f1:request.headers.cookie", "utf16be"),
        ("bob", kind, "flow:f1:request.headers.authorization", "base64"),
    ]

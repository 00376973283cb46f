"""`FlowScan.headers` scans a message's header lines in one matcher call; its findings must be exactly those of
scanning every line alone (the way it was done before), including a canary cut across two lines."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from test_scan import ENCODINGS, encode, make_registry

from harness.core.protocol import FLOW_HEADER
from harness.core.registry import Registry
from harness.detect.decode import KEY_HEADERS
from harness.detect.engine.matcher import SEPARATOR, Matcher
from harness.detect.flowscan import FlowScan

NAMES = ["x-note", "authorization", "api-key", "content-type", "x-trace", FLOW_HEADER, "cookie", "user-agent"]


def line_by_line(scan: FlowScan, headers: list[tuple[str, str]], prefix: str, skip: frozenset) -> None:
    """The reference: one matcher call per header line."""
    for name, value in headers:
        if name.lower() == FLOW_HEADER:
            continue
        own = skip if name.lower() in KEY_HEADERS else frozenset()
        scan.scan(f"{name}: {value}".encode("utf-8", "surrogateescape"), f"{prefix}.headers.{name.lower()}",
                  skip=own, offsets=False)


def random_headers(rng: random.Random, reg: Registry) -> list[tuple[str, str]]:
    headers: list[tuple[str, str]] = []
    carry = b""  # the second half of a canary cut at the end of the previous line
    for _ in range(rng.randint(1, 10)):
        value = carry + rng.randbytes(rng.randint(0, 40)).replace(SEPARATOR, b"-")
        carry = b""
        for _ in range(rng.choice((0, 0, 1, 2))):
            tenant = rng.choice(reg.names())
            payload = encode(rng.choice(list(reg[tenant].all_canaries().values())), rng.choice(ENCODINGS))[0]
            if rng.random() < 0.2:  # cut across this line and the next
                cut = rng.randint(1, len(payload) - 1)
                payload, carry = payload[:cut], payload[cut:]
            value += payload + rng.randbytes(rng.randint(0, 8)).replace(SEPARATOR, b"-")
        name = rng.choice(NAMES)
        headers.append((name.title() if rng.random() < 0.3 else name, value.decode("utf-8", "surrogateescape")))
    return headers


def findings(matcher: Matcher, tenant: str | None, scan_it) -> list:
    scan = FlowScan(matcher, "f1", tenant, "request", "request_leak")
    scan_it(scan)
    return scan.findings


@pytest.mark.parametrize("newline_canary", [False, True])
def test_one_call_finds_what_every_line_alone_finds(tmp_path: Path, newline_canary: bool) -> None:
    reg = make_registry(tmp_path)
    if newline_canary:  # a hand-written canary holding the separator: lines are then scanned one by one
        reg.add_canary("carol", "note", "two\nlines-of-carol")
    matcher = Matcher.for_registry(reg)
    assert matcher.separable is not newline_canary
    rng = random.Random(20261203)
    total = 0
    for _ in range(300):
        headers = random_headers(rng, reg)
        tenant = rng.choice([None, *reg.names()])
        victim = rng.choice(reg.names())
        skip = frozenset({(victim, rng.choice(["key", "api_server_key", "memory"]))})
        got = findings(matcher, tenant, lambda s, h=headers, k=skip: s.headers(h, "request", k))
        want = findings(matcher, tenant, lambda s, h=headers, k=skip: line_by_line(s, h, "request", k))
        assert got == want, headers
        total += len(want)
    assert total > 100  # the plants were found, not just agreed on as absent

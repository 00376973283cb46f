"""The marker prefilter: a big buffer gives exactly the matches of a full scan, whatever it holds."""

from __future__ import annotations

import base64
import json
import os
import random
from pathlib import Path

import pytest

from harness.core.registry import TAG_MARKER, Registry, mint
from harness.detect.engine.matcher import PREFILTER_MIN_BYTES, Canary, Matcher, encodings_of


def make_registry(root: Path) -> Registry:
    names = ["alice", "bob", "carol"]
    reg = mint(names, root / "work", {n: {"listen": 43000 + i} for i, n in enumerate(names)})
    for t in reg:
        tag = t.key.rsplit("-", 1)[1]
        reg.add_canary(t.name, "share_link", f"https://share.test/{t.name}/{tag}?a=1&b=~x y+z")
        reg.add_canary(t.name, "marker_first", f"{tag}-starts-with-the-marker")
    return reg


@pytest.fixture(scope="module")
def matcher(tmp_path_factory: pytest.TempPathFactory) -> Matcher:
    return Matcher.for_registry(make_registry(tmp_path_factory.mktemp("reg")))


def full_scan(m: Matcher, data: bytes) -> list[tuple[int, int, int]]:
    assert m._automaton is not None
    return sorted(m._automaton.find_matches_as_indexes(data, overlapping=True))


def test_minted_canaries_turn_the_prefilter_on(matcher: Matcher) -> None:
    assert matcher.prefiltered
    assert all(TAG_MARKER in c.value for c in matcher.canaries)


def test_a_canary_without_the_marker_turns_it_off(matcher: Matcher) -> None:
    other = Matcher([*matcher.canaries, Canary("dave", "memory", "memory-canary-dave-0123456789ab")])
    assert not other.prefiltered
    data = os.urandom(3 * PREFILTER_MIN_BYTES) + b"memory-canary-dave-0123456789ab"
    assert [(h.tenant, h.kind) for h in other.find(data)] == [("dave", "memory")]


def _filler(rng: random.Random, size: int) -> bytes:
    """Random bytes, English-like text, base64, JSON with escapes, or UTF-16 text."""
    kind = rng.choice(["random", "text", "base64", "json", "utf16"])
    if kind == "random":
        return rng.randbytes(size)
    if kind == "base64":
        return base64.b64encode(rng.randbytes(size))[:size]
    words = ["the", "agent", "model", "memory", "soul", "cron", "\\u00e9", "qxc", "vyb", TAG_MARKER[:5], "/tmp"]
    text = " ".join(rng.choice(words) for _ in range(size // 3)).encode()[:size]
    return text.decode().encode("utf-16-le")[:size] if kind == "utf16" else text


def _plant(rng: random.Random, m: Matcher) -> bytes:
    """A whole encoded canary, a cut one (a near miss), or a bare encoded marker (a false alarm)."""
    choice = rng.random()
    if choice < 0.15:
        return rng.choice(sorted({f for fs in encodings_of(TAG_MARKER).values() for f in fs}))
    pattern = rng.choice(m._patterns)
    if choice < 0.35:
        return pattern[: rng.randrange(1, len(pattern))]
    if choice < 0.45:  # two canaries overlapping by a few bytes, when their bytes allow it
        other = rng.choice(m._patterns)
        return pattern + other[rng.randrange(0, 4):]
    return pattern


@pytest.mark.parametrize("seed", range(60))
def test_the_prefilter_finds_exactly_the_full_scans_matches(matcher: Matcher, seed: int) -> None:
    rng = random.Random(seed)
    parts: list[bytes] = []
    size = rng.choice([PREFILTER_MIN_BYTES, 20_000, 100_000, 300_000])
    dense = seed % 10 == 0  # so many canaries that the windows cover most of it: the full-pass fallback
    while sum(map(len, parts)) < size:
        parts.append(_plant(rng, matcher) if dense or rng.random() < 0.1 else _filler(rng, rng.randrange(1, 5000)))
    parts.insert(rng.randrange(len(parts) + 1), rng.choice(matcher._patterns))
    data = b"".join(parts)
    if seed % 3 == 0:
        data = _plant(rng, matcher) + data + rng.choice(matcher._patterns)  # matches at both edges
    expected = full_scan(matcher, data)
    assert expected, "every buffer holds at least one canary"
    assert sorted(matcher._matches(data)) == expected


@pytest.mark.parametrize("seed", range(20))
def test_short_buffers_give_the_full_scans_matches(matcher: Matcher, seed: int) -> None:
    """Buffers under PREFILTER_MIN_BYTES (header lines, small bodies) and the prefilter's windows are
    scanned by the contiguous NFA, full passes by the DFA: the two must agree."""
    rng = random.Random(1000 + seed)
    for _ in range(20):
        parts = [_plant(rng, matcher) if rng.random() < 0.4 else _filler(rng, rng.randrange(1, 400))
                 for _ in range(rng.randrange(1, 12))]
        data = b"".join(parts)[: PREFILTER_MIN_BYTES - 1]
        assert sorted(matcher._matches(data)) == full_scan(matcher, data)


def test_find_is_unchanged_by_the_prefilter(matcher: Matcher) -> None:
    rng = random.Random(7)
    buffers = [b"".join(_plant(rng, matcher) + _filler(rng, 3000) for _ in range(40)) for _ in range(5)]
    with_prefilter = [matcher.find(b) for b in buffers]
    without = Matcher(matcher.canaries, prefilter=False)
    assert not without.prefiltered
    assert [without.find(b) for b in buffers] == with_prefilter
    assert all(with_prefilter)


def test_every_encoded_canary_holds_an_encoded_marker(matcher: Matcher) -> None:
    """What makes the windows complete; `Matcher` checks it too, and turns the prefilter off if not."""
    forms = {f for fs in encodings_of(TAG_MARKER).values() for f in fs}
    assert all(any(f in p for f in forms) for p in matcher._patterns)
    # The one trigger pass (marker forms, double-base64 triggers, escape starts): more than 64 strings and
    # ahocorasick-rs gives up its SIMD searcher.
    assert forms <= set(matcher._triggers.strings) and len(matcher._triggers.strings) <= 64


def _escaped(rng: random.Random, value: str, how: str) -> bytes:
    """`value` with some characters written as JSON escapes (`\\u00XX` either case, `\\/`): chosen at
    random (`how` "random"), only in its marker ("marker": no marker form is left whole) or only `/&<>-`
    (what encoders escape; the marker is left whole); then escaped as a JSON string again, 0 to 2 times."""
    out = []
    for i, c in enumerate(value):
        in_marker = value.find(TAG_MARKER) <= i < value.find(TAG_MARKER) + len(TAG_MARKER)
        chosen = {"random": rng.random() < 0.3, "marker": in_marker, "special": c in "/&<>-"}[how]
        if chosen and ord(c) < 128:
            out.append("\\/" if c == "/" and rng.random() < 0.5 else f"\\u{ord(c):04{rng.choice('xX')}}")
        else:
            out.append(c)
    text = "".join(out)
    for _ in range(rng.randrange(3)):
        text = json.dumps(text)[1:-1]
    return text.encode()


def _twice(rng: random.Random, value: str) -> bytes:
    inner = base64.b64encode(rng.randbytes(rng.randrange(3)) + value.encode() + b"!")
    return base64.b64encode(rng.randbytes(rng.randrange(3)) + inner)


@pytest.mark.parametrize("seed", range(40))
def test_escapes_and_base64_twice_are_found_as_without_the_prefilter(matcher: Matcher, seed: int) -> None:
    """With the prefilter, only escapes near a marker form (or double-base64 trigger), or of one of their
    characters, are unescaped: that must find what unescaping around every escape finds. Plants: canaries
    half escaped (also in their marker, also escaped again), base64 twice, and escapes far from any."""
    rng = random.Random(3000 + seed)
    unfiltered = Matcher(matcher.canaries, prefilter=False)
    planted, parts = set(), []
    size = rng.choice([2000, PREFILTER_MIN_BYTES, 50_000])
    while sum(map(len, parts)) < size:
        if rng.random() < 0.3:
            c = rng.choice(matcher.canaries)
            how = rng.choice(["random", "marker", "special", "twice"])
            if how == "special" and not any(ch in c.value for ch in "/&<>-"):
                continue
            parts.append(_twice(rng, c.value) if how == "twice" else _escaped(rng, c.value, how))
            planted.add((c.tenant, c.kind))
        else:
            noise = rng.choice([b"\\/", b"\\u001b[0m", b"\\u0026", b"\\\\u002f", b" "])
            parts.append(_filler(rng, rng.randrange(1, 3000)) + noise * rng.randrange(1, 20))
        parts.append(b" ")
    data = b"".join(parts)
    hits = matcher.find(data)
    assert hits == unfiltered.find(data)
    assert planted <= {(h.tenant, h.kind) for h in hits}


def test_exclude_drops_one_tenants_canaries_and_nothing_else(matcher: Matcher) -> None:
    rng = random.Random(11)
    data = b"".join(_plant(rng, matcher) + _filler(rng, 500) for _ in range(200))
    hits = matcher.find(data)
    assert {h.tenant for h in hits} == {"alice", "bob", "carol"}
    assert matcher.find(data, exclude="bob") == [h for h in hits if h.tenant != "bob"]

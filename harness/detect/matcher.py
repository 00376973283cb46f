"""One multi-pattern automaton over every canary of every tenant, in every encoding.

A canary is found in one pass over the bytes, whatever encoding carries it: each encoded form of each
canary is a pattern of a single Aho-Corasick automaton (ahocorasick-rs, overlapping matches).

When every canary contains `TAG_MARKER` (every minted one does), a big buffer is first searched for the
marker's few encoded forms, which ahocorasick-rs does with SIMD at several GB/s; the full automaton then
runs only on the windows around them. Every encoded canary contains an encoded marker, so the windows
hold every match the full scan would find, and nothing else.
"""

from __future__ import annotations

import base64
import hashlib
import math
import threading
import urllib.parse
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import ahocorasick_rs

from harness.core.protocol import placeholder
from harness.core.registry import TAG_MARKER, Registry, is_secret_kind

DFA_MAX_PATTERNS = 12288
#: Buffers shorter than this are scanned by the full automaton at once (one call is cheaper than two).
PREFILTER_MIN_BYTES = 8192
#: Windows closer than this are scanned as one: a call costs about as much as scanning 1-2 KiB.
WINDOW_GAP = 1024
#: Joins buffers that are scanned in one call but must be scanned as if alone (a message's header lines).
SEPARATOR = b"\n"
_UTF16_PAIR = {"utf16be": ("utf16le", 1), "utf16le": ("utf16be", -1)}


@dataclass(frozen=True)
class Canary:
    tenant: str
    kind: str
    value: str

    @property
    def secret(self) -> bool:
        return is_secret_kind(self.kind)


@dataclass(frozen=True)
class Hit:
    """One occurrence: whose canary, which kind, where (byte span) and in which encoding."""

    tenant: str
    kind: str
    start: int
    end: int
    encoding: str


def _b64_alignments(raw: bytes) -> list[bytes]:
    """The base64 characters fully determined by `raw` at each of the three byte alignments."""
    out = []
    for pad in range(3):
        enc = base64.b64encode(b"\0" * pad + raw)
        first = math.ceil(pad * 8 / 6)
        last = (pad + len(raw)) * 8 // 6  # exclusive: chars fully inside the raw bits
        out.append(enc[first:last])
    return out


def encodings_of(value: str) -> dict[str, list[bytes]]:
    """Every encoded form of `value` that the scanner looks for, by encoding name."""
    raw = value.encode()
    forms: dict[str, list[bytes]] = {"plain": [raw]}
    json_forms = []
    if b"/" in raw:
        json_forms.append(raw.replace(b"/", b"\\/"))
    json_forms.append("".join(f"\\u{ord(c):04x}" for c in value).encode())
    json_forms.append("".join(f"\\u{ord(c):04X}" for c in value).encode())
    forms["json"] = json_forms
    url_forms = {urllib.parse.quote(value, safe="").encode(), urllib.parse.quote_plus(value).encode()}
    url_forms.add("".join(f"%{b:02X}" for b in raw).encode())
    forms["url"] = sorted(f for f in url_forms if f != raw)
    b64 = _b64_alignments(raw)
    forms["base64"] = b64
    forms["base64url"] = [f.replace(b"+", b"-").replace(b"/", b"_") for f in b64 if b"+" in f or b"/" in f]
    forms["hex"] = [raw.hex().encode(), raw.hex().upper().encode()]
    forms["utf16le"] = [value.encode("utf-16-le")]
    forms["utf16be"] = [value.encode("utf-16-be")]
    return {enc: fs for enc, fs in forms.items() if fs}


class Matcher:
    """Find every canary of the given set in a bytes buffer, in every encoding, in one pass."""

    def __init__(self, canaries: Iterable[Canary], *, prefilter: bool = True) -> None:
        self.canaries = list(canaries)
        patterns: dict[bytes, tuple[Canary, str]] = {}
        for canary in self.canaries:
            for encoding, forms in encodings_of(canary.value).items():
                for form in forms:
                    patterns.setdefault(form, (canary, encoding))
        self._patterns = list(patterns)
        self._meta = [patterns[p] for p in self._patterns]
        #: Length in bytes of the shortest / longest encoded form (shorter buffers cannot hold a canary).
        self.shortest = min(map(len, self._patterns), default=0)
        self.longest = max(map(len, self._patterns), default=0)
        #: No pattern holds SEPARATOR, so no match can cross one: buffers joined by it may share a scan.
        self.separable = not any(SEPARATOR in p for p in self._patterns)
        # A DFA scans about twice as fast as the default NFA but costs ~16 KB per pattern to build. That
        # size is also why the DFA only makes the full passes: a short buffer or a window touches a few
        # of its states, scattered over megabytes, and in a busy proxy most of them are out of the cache
        # (a 600-byte window with a cold cache: DFA 138 us, contiguous NFA 49 us; with a warm one 3 and 4).
        nfa = ahocorasick_rs.Implementation.ContiguousNFA
        if not self._patterns:
            self._automaton = self._local = None
        elif len(self._patterns) <= DFA_MAX_PATTERNS:
            self._automaton = ahocorasick_rs.BytesAhoCorasick(
                self._patterns, implementation=ahocorasick_rs.Implementation.DFA)
            self._local = ahocorasick_rs.BytesAhoCorasick(self._patterns, implementation=nfa)
        else:
            self._automaton = self._local = ahocorasick_rs.BytesAhoCorasick(self._patterns)
        self._tenant_of = [canary.tenant for canary, _ in self._meta]
        self._anchors, self._reach = self._prefilter() if prefilter else (None, (0, 0))

    def _prefilter(self) -> tuple[ahocorasick_rs.BytesAhoCorasick | None, tuple[int, int]]:
        """The marker forms' automaton, if every pattern holds one (else a match could hide from it), and
        how far a match can reach before and after the start of a marker form found in the data."""
        if not self._patterns:
            return None, (0, 0)
        forms = sorted({f for fs in encodings_of(TAG_MARKER).values() for f in fs})
        before = after = 0
        for pattern in self._patterns:
            offsets = [o for f in forms if (o := pattern.find(f)) >= 0]
            if not offsets:
                return None, (0, 0)
            last = max(o for f in forms if (o := pattern.rfind(f)) >= 0)
            before, after = max(before, last), max(after, len(pattern) - min(offsets))
        # Leftmost-first (not overlapping) is what lets ahocorasick-rs use its SIMD searcher. A form it
        # skips for overlapping a found one starts less than the longest form's length after it.
        automaton = ahocorasick_rs.BytesAhoCorasick(forms, matchkind=ahocorasick_rs.MatchKind.LeftmostFirst)
        return automaton, (before, after + max(map(len, forms)))

    @property
    def prefiltered(self) -> bool:
        """Whether big buffers are searched for the marker first."""
        return self._anchors is not None

    def _matches(self, data: bytes | bytearray | memoryview) -> list[tuple[int, int, int]]:
        """Every (pattern, start, end), overlapping: the same list a full scan gives, maybe reordered."""
        assert self._automaton is not None and self._local is not None
        if len(data) < PREFILTER_MIN_BYTES:
            return self._local.find_matches_as_indexes(data, overlapping=True)
        if self._anchors is None:
            return self._automaton.find_matches_as_indexes(data, overlapping=True)
        before, after = self._reach  # overlapping windows are merged: no match is found twice
        size = len(data)
        windows: list[list[int]] = []
        for _, start, _ in self._anchors.find_matches_as_indexes(data):
            lo, hi = max(0, start - before), min(size, start + after)
            if windows and lo <= windows[-1][1] + WINDOW_GAP:
                windows[-1][1] = hi
            else:
                windows.append([lo, hi])
        if sum(hi - lo for lo, hi in windows) * 2 > size:  # dense: one full pass is cheaper
            return self._automaton.find_matches_as_indexes(data, overlapping=True)
        view = memoryview(data)
        found: list[tuple[int, int, int]] = []
        for lo, hi in windows:
            found += [(i, s + lo, e + lo) for i, s, e in
                      self._local.find_matches_as_indexes(view[lo:hi], overlapping=True)]
        return found

    @classmethod
    def for_registry(cls, registry: Registry, *, secrets_only: bool = False, prefilter: bool = True) -> Matcher:
        return cls(
            (Canary(t.name, kind, value)
             for t in registry
             for kind, value in t.all_canaries().items()
             if not secrets_only or is_secret_kind(kind)),
            prefilter=prefilter,
        )

    def find(self, data: bytes | bytearray | memoryview, *, exclude: str | None = None) -> list[Hit]:
        """Every occurrence, ordered by offset; overlapping forms of one canary are reported once.
        `exclude` names a tenant whose canaries are not reported (the rules apply to each canary alone)."""
        if self._automaton is None or not data:
            return []
        found = self._matches(data)
        if found and exclude is not None:
            tenant_of = self._tenant_of
            found = [m for m in found if tenant_of[m[0]] != exclude]
        if not found:  # the common case (every header line, most bodies): nothing more to build
            return []
        hits: list[Hit] = []
        claimed: dict[tuple[str, str], int] = {}
        matches = sorted(found, key=lambda m: (m[1], -m[2]))
        # An ASCII canary in UTF-16 text matches both byte orders, one byte apart (BE at s, LE at s + 1):
        # the form aligned on an even offset is the text's real byte order.
        utf16 = {
            (self._meta[i][0], self._meta[i][1], s) for i, s, _ in matches if self._meta[i][1] in _UTF16_PAIR
        }
        for idx, start, end in matches:
            canary, encoding = self._meta[idx]
            ident = (canary.tenant, canary.kind)
            if start % 2 and encoding in _UTF16_PAIR:
                twin, shift = _UTF16_PAIR[encoding]
                if (canary, twin, start + shift) in utf16:
                    continue
            if claimed.get(ident, -1) > start:
                continue  # a second form of the same canary inside the span already reported
            claimed[ident] = end
            hits.append(Hit(canary.tenant, canary.kind, start, end, encoding))
        return hits

    def redact(self, data: bytes) -> bytes:
        """Replace every occurrence of every canary (any encoding) with `<tenant:kind>`."""
        out = bytearray()
        pos = 0
        for hit in self.find(data):
            if hit.start < pos:  # overlaps the span just replaced: extend it, never leave a tail behind
                pos = max(pos, hit.end)
                continue
            out += data[pos : hit.start] + placeholder(hit.tenant, hit.kind).encode()
            pos = hit.end
        out += data[pos:]
        return bytes(out)

    def redact_text(self, text: str) -> str:
        return self.redact(text.encode("utf-8", "surrogateescape")).decode("utf-8", "replace")

    def snippet(self, data: bytes, hit: Hit, width: int = 48) -> str:
        """A short window around `hit`, every secret in it replaced; cut canaries at the edges are dropped."""
        lo, hi = max(0, hit.start - width), min(len(data), hit.end + width)
        margin = self.longest  # a canary cut by the window's edge starts or ends within this margin
        base = max(0, lo - margin)
        for other in self.find(data[base : hi + margin]):
            s, e = other.start + base, other.end + base
            if s < lo < e:
                lo = e if e <= hit.start else s
            if s < hi < e:
                hi = s if s >= hit.end else e
        text = self.redact(data[lo:hi]).decode("utf-8", "replace").strip("\ufffd")  # chars cut at the edges
        return "".join(c if c.isprintable() else " " for c in text)


_CACHE: OrderedDict[str, Matcher] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 8


def registry_fingerprint(registry: Registry) -> str:
    """A cheap digest of every (tenant, kind, value): equal for registries with the same canaries."""
    h = hashlib.blake2b(digest_size=16)
    for t in sorted(registry, key=lambda t: t.name):
        for kind, value in sorted(t.all_canaries().items()):
            h.update(f"{t.name}\0{kind}\0{value}\0".encode())
    return h.hexdigest()


def matcher_for(registry: Registry) -> Matcher:
    """The Matcher over every canary of `registry`, built once per distinct set of canaries."""
    key = registry_fingerprint(registry)
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    matcher = Matcher.for_registry(registry)
    with _CACHE_LOCK:
        _CACHE[key] = matcher
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return matcher

"""One multi-pattern automaton over every canary of every tenant, in every encoding.

A canary is found in one pass over the bytes, whatever encoding carries it: each encoded form of each
canary is a pattern of a single Aho-Corasick automaton (ahocorasick-rs, overlapping matches).

When every canary contains `TAG_MARKER` (every minted one does), a big buffer is first searched for the
marker's few encoded forms, which ahocorasick-rs does with SIMD at several GB/s; the full automaton then
runs only on the windows around them. Every encoded canary contains an encoded marker, so the windows
hold every match the full scan would find, and nothing else.

Three checks run after the automaton, all exact:
- a base64 form holds only the characters the canary alone determines; the partial characters at its
  edges (bits of the canary mixed with bits of its neighbours) are checked bit by bit, so a value that
  differs from a canary only in its first or last bits is not reported (`Edge`);
- around every JSON escape of an ASCII character (`\\u002f`, `\\/`, also escaped again inside a JSON
  string holding JSON) the text is unescaped and searched again, so a canary with any mix of escaped and
  plain characters is found at its span in the original bytes (encoding `json`);
- a canary encoded twice in base64 (encoding `base64/base64`) is found by decoding the base64 text around
  a trigger (`Doubles`): the marker's double-base64 forms, which every minted canary's double forms hold,
  or a hand-written canary's own double forms. They are not patterns of the automaton: they would double
  its size, and past `DFA_MAX_PATTERNS` its full passes lose the DFA.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import ahocorasick_rs

from harness.core.protocol import placeholder
from harness.core.registry import TAG_MARKER, Registry, is_secret_kind
from harness.detect.engine.cuts import OwnCuts
from harness.detect.engine.escapes import ESCAPE_STARTS, MAX_UNESCAPE, Unescaped, escape_triggers
from harness.detect.engine.forms import Doubles, Edge, encodings_of, encodings_with_edges
from harness.detect.engine.triggers import DOUBLE, ESCAPE, WINDOW, Triggers

DFA_MAX_PATTERNS = 12288
#: Buffers shorter than this are scanned by the full automaton at once (one call is cheaper than two).
PREFILTER_MIN_BYTES = 8192
#: Windows closer than this are scanned as one: a call costs about as much as scanning 1-2 KiB.
WINDOW_GAP = 1024
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


def _outermost(found: list[tuple[Canary, str, int, int]]) -> list[tuple[Canary, str, int, int]]:
    """The matches without those inside a longer match of another tenant's canary: `/home/.hermes` (the launch
    profile's home) found inside `/home/.hermes/profiles/alpha` is alpha's home, not the launch profile's."""
    kept = []
    reach: tuple[str, int, int] = ("", -1, 0)  # the tenant, end and length of the furthest-reaching match so far
    for m in sorted(found, key=lambda m: (m[2], -m[3])):
        canary, _, start, end = m
        tenant, reach_end, reach_len = reach
        if end <= reach_end and end - start < reach_len and canary.tenant != tenant:
            continue
        kept.append(m)
        if end > reach_end:
            reach = (canary.tenant, end, end - start)
    return kept


class Matcher:
    """Find every canary of the given set in a bytes buffer, in every encoding, in one pass."""

    def __init__(self, canaries: Iterable[Canary], *, prefilter: bool = True) -> None:
        self.canaries = list(canaries)
        patterns: dict[bytes, tuple[Canary, str]] = {}
        edges: dict[bytes, Edge | None] = {}
        for canary in self.canaries:
            for encoding, forms in encodings_with_edges(canary.value).items():
                for form, edge in forms:
                    if form not in patterns:
                        patterns[form], edges[form] = (canary, encoding), edge
        self._patterns = list(patterns)
        self._meta = [patterns[p] for p in self._patterns]
        self._edges = [edges[p] for p in self._patterns]
        self._doubles = Doubles(c.value for c in self.canaries)
        #: Length in bytes of the shortest / longest encoded form (shorter buffers cannot hold a canary).
        self.shortest = min(map(len, self._patterns), default=0)
        self.longest = max(max(map(len, self._patterns), default=0), self._doubles.longest)
        #: A canary is a directory of another tenant's path canary (the launch profile's home holds every other
        #: profile's home): a match of it inside a match of the longer one is the longer one's (`_outermost`).
        values = {c.value for c in self.canaries}
        self._nested = any(v.startswith(w + "/") for v in values for w in values if v != w)
        #: (tenant, kind) of a canary another tenant's extends as a path -> what each such path adds (bytes).
        self.extensions: dict[tuple[str, str], list[bytes]] = {}
        for a in self.canaries:
            for b in self.canaries:
                if b.tenant != a.tenant and b.value.startswith(a.value + "/"):
                    self.extensions.setdefault((a.tenant, a.kind), []).append(b.value[len(a.value):].encode())
        #: (tenant, kind) of a canary another tenant's extends as a path -> the most characters it adds.
        self.extended = {key: max(len(e.decode()) for e in ext) for key, ext in self.extensions.items()}
        self.own_cuts = OwnCuts(self.canaries)  # a recipient's own canary cut short reads as a shorter one
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
        markers, self._reach = self._prefilter() if prefilter else (None, (0, 0))
        self._prefiltered = markers is not None
        groups = {DOUBLE: self._doubles.triggers}
        if markers is not None:
            groups |= {WINDOW: markers, ESCAPE: [b"\\u00"]}
        self._triggers = Triggers(groups)
        #: The escapes of the characters of the marker's forms and the double-base64 triggers (`_escape_starts`).
        self._marker_escapes = frozenset(f"\\u{c:04{x}}".encode() for c in set(b"".join(self._triggers.strings))
                                         for x in "xX") if markers is not None else frozenset()

    def _prefilter(self) -> tuple[list[bytes] | None, tuple[int, int]]:
        """The marker's forms, if every pattern holds one (else a match could hide from them), and how far
        a match can reach before and after the start of a marker form found in the data."""
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
        return forms, (before, after)

    @property
    def prefiltered(self) -> bool:
        """Whether big buffers are searched for the marker first."""
        return self._prefiltered

    def _matches(self, data: bytes | bytearray | memoryview,
                 anchors: list[int] | None = None) -> list[tuple[int, int, int]]:
        """Every (pattern, start, end), overlapping: the same list a full scan gives, maybe reordered.
        `anchors`: where the marker's forms are in `data` (`Triggers.find`), if already known."""
        assert self._automaton is not None and self._local is not None
        if len(data) < PREFILTER_MIN_BYTES:
            return self._local.find_matches_as_indexes(data, overlapping=True)
        if not self._prefiltered:
            return self._automaton.find_matches_as_indexes(data, overlapping=True)
        if anchors is None:
            anchors = self._triggers.find(data)[WINDOW]
        before, after = self._reach  # overlapping windows are merged: no match is found twice
        after += self._triggers.longest  # a marker form skipped for overlapping a found string starts inside it
        size = len(data)
        windows: list[list[int]] = []
        for start in anchors:
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

    def may_find(self, data: bytes | bytearray | memoryview) -> bool:
        """False if `find` certainly finds nothing in `data`, nor in any part of it: with the prefilter, when
        no marker form, double-base64 trigger or escape is there (every match holds one)."""
        if self._automaton is None or not data:
            return False
        return not self._prefiltered or any(self._triggers.find(data).values())

    def find(self, data: bytes | bytearray | memoryview, *, exclude: str | None = None) -> list[Hit]:
        """Every occurrence, ordered by offset; overlapping forms of one canary are reported once.
        `exclude` names a tenant whose canaries are not reported (the rules apply to each canary alone)."""
        if self._automaton is None or not data:
            return []
        return self._find(data, self._triggers.find(data), exclude)

    def find_marked(self, data: bytes | bytearray | memoryview) -> tuple[list[Hit], list[int] | None]:
        """`find`'s hits, and where a form of the marker starts in `data`, in order (None without the prefilter: a
        canary need not hold one)."""
        if self._automaton is None or not data:
            return [], [] if self._prefiltered else None
        marks = self._triggers.find(data)
        return self._find(data, marks, None), marks[WINDOW] if self._prefiltered else None

    def _find(self, data: bytes | bytearray | memoryview, marks: dict[str, list[int]],
              exclude: str | None) -> list[Hit]:
        if self._prefiltered and not any(marks.values()):
            return []  # no marker form, no double-base64 trigger, no escape: nothing can match
        found = self._direct(data, marks)
        escaped = self._escaped(data, self._escape_starts(data, marks))
        if escaped:  # a span the automaton matched is reported as it matched it (a form is more exact)
            spans: dict[Canary, list[tuple[int, int]]] = {}
            for canary, _, s, e in found:
                spans.setdefault(canary, []).append((s, e))
            found += [m for m in escaped if not any(s < m[3] and m[2] < e for s, e in spans.get(m[0], ()))]
        if self._nested and len(found) > 1:
            found = _outermost(found)
        if found and exclude is not None:  # the excluded tenant's own, and its own canaries cut short (`cuts`)
            found = self.own_cuts.kept([m for m in found if m[0].tenant != exclude], data, exclude, self.longest)
        if not found:  # the common case (every header line, most bodies): nothing more to build
            return []
        hits: list[Hit] = []
        claimed: dict[tuple[str, str], int] = {}
        matches = sorted(found, key=lambda m: (m[2], -m[3]))
        # An ASCII canary in UTF-16 text matches both byte orders, one byte apart (BE at s, LE at s + 1):
        # the form aligned on an even offset is the text's real byte order.
        utf16 = {(canary, encoding, s) for canary, encoding, s, _ in matches if encoding in _UTF16_PAIR}
        for canary, encoding, start, end in matches:
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

    def _escape_starts(self, data: bytes | bytearray | memoryview, marks: dict[str, list[int]]) -> list[int]:
        """Where the escape pass looks: every escape of an ASCII character; with the prefilter, only those
        within reach of a marker form or a double-base64 trigger, and those of one of their characters.

        That is enough: a half-escaped minted canary either keeps one of its marker forms (or triggers)
        whole, and all its escapes lie within 2 * longest of it, or has a character of it escaped."""
        if not self._prefiltered:
            return escape_triggers(data)
        # An escape start skipped inside a found marker form is within that form's reach, below.
        starts = [pos for pos in marks[ESCAPE] if bytes(data[pos : pos + 6]) in self._marker_escapes]
        reach = 2 * self.longest + self._triggers.longest
        view = memoryview(data)
        near: list[list[int]] = []
        for pos in sorted(marks[WINDOW] + marks[DOUBLE]):
            lo, hi = max(0, pos - reach), min(len(data), pos + reach)
            if near and lo <= near[-1][1]:
                near[-1][1] = hi
            else:
                near.append([lo, hi])
        for lo, hi in near:
            starts += [lo + pos for _, pos, _ in ESCAPE_STARTS.find_matches_as_indexes(view[lo:hi])]
        return sorted(set(starts))

    def _escaped(self, data: bytes | bytearray | memoryview, triggers: list[int]) -> list[tuple[Canary, str, int, int]]:
        """Canaries written with some characters JSON-escaped (`\\u002f`, `\\/`, in any mix, escaped again
        inside JSON strings holding JSON): the regions around the escapes at `triggers` (in order),
        unescaped and searched again. Each hit is mapped back to its span in `data`, with encoding `json`
        (then what the unescaped text shows, e.g. `json/base64`). Hits the raw scan makes too (the same
        span) are dropped by `find`."""
        if not triggers:
            return []
        # A half-escaped canary is never longer than its longest form (all of it escaped) and holds an
        # escape, so the region of `reach` bytes around each escape holds all of it (escaped twice: 7/6).
        reach = 2 * self.longest
        regions: list[list[int]] = []
        for pos in triggers:
            lo, hi = max(0, pos - reach), min(len(data), pos + reach)
            if regions and lo <= regions[-1][1]:
                regions[-1][1] = hi
            else:
                regions.append([lo, hi])
        out = []
        for lo, hi in regions:
            chain: list[Unescaped] = []
            text = bytes(data[lo:hi])
            while len(chain) < MAX_UNESCAPE:
                level = Unescaped(text)
                if level.text == text:
                    break
                chain.append(level)
                text = level.text
                for canary, encoding, start, end in self._direct(text):
                    for step in reversed(chain):
                        start, end = step.raw_span(start, end)
                    out.append((canary, "json" if encoding == "plain" else f"json/{encoding}", lo + start, lo + end))
                if not ESCAPE_STARTS.find_matches_as_indexes(text):
                    break
        return out

    def _direct(self, data: bytes | bytearray | memoryview,
                marks: dict[str, list[int]] | None = None) -> list[tuple[Canary, str, int, int]]:
        """The automaton's matches and the canaries encoded twice in base64. `marks`: `Triggers.find`'s."""
        marks = self._triggers.find(data) if marks is None else marks
        return self._raw_matches(data, marks[WINDOW]) + self._double_base64(data, marks[DOUBLE])

    def _double_base64(self, data: bytes | bytearray | memoryview,
                       triggers: list[int]) -> list[tuple[Canary, str, int, int]]:
        """Canaries encoded twice in base64: a base64 form in the text around a trigger decoded once
        (`Doubles`), at the span of the characters it was decoded from; encoding `base64/base64`."""
        out = []
        for at, inner in self._doubles.decoded(data, triggers):
            for canary, encoding, start, end in self._raw_matches(inner):
                if encoding in ("base64", "base64url"):  # a plain form: base64 once, which the automaton sees
                    out.append((canary, "base64/base64", at + start * 4 // 3, at + (end * 4 + 2) // 3))
        return out

    def _raw_matches(self, data: bytes | bytearray | memoryview,
                     anchors: list[int] | None = None) -> list[tuple[Canary, str, int, int]]:
        """(canary, encoding, start, end) of every automaton match whose base64 edges agree."""
        meta, edges = self._meta, self._edges
        return [(*meta[i], s, e) for i, s, e in self._matches(data, anchors)
                if (edge := edges[i]) is None or edge.agrees(data, s, e)]

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

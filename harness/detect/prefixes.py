"""The conversations already scanned: a chat request resends every message so far, so a scan of each whole body
grows with the square of a conversation's length. A body whose messages extend a body scanned before for the same
tenant and endpoint is scanned only from near the end of what the two share; the rest of its hits are the earlier
scan's. The live addon and `reconcile` both scan request bodies through here (`checks.check_request_leaks`).

A prefix is known by the digest of the body's bytes up to the end of one of its messages (its canonical form for the
scanner: the decoded bytes it reads, so an offset in one body is the same offset in the other). The result is the
full scan's, hit for hit, snippet for snippet:

- the scan resumes at the start of a message (`cut`), at least `ahead` bytes before the end of the shared prefix:
  nothing the scanner looks for crosses from one JSON array element into the next (a run of base64, hex or
  percent-encoded characters, a wrapped block, a JSON string, a canary's form), and what a hit or a layer start
  before `cut` reads past itself (its snippet's context, the head a plausibility check decodes) stays within the
  shared prefix;
- the resumed window starts `overlap` bytes before `cut` and owns what ends after it, as the next window of a
  file's stream does (`LayerWalk.resume`); the earlier scan's hits that end before `cut`, and those in its layers
  that start before it, are kept;
- a decompressed stream is the exception: it may read on across messages (a zlib header is two characters of text,
  `x^`), and one that fails reads an unknown length. A body is scanned whole when a layer of the earlier scan that
  starts before `cut` may have read past it. Nothing is kept of a scan that decompressed anything (its budget,
  `Limits.total_bytes`, is the whole body's) or that a limit cut.

Memory: what is kept of a scan is its hits (with the context of their snippets), its layers' extents and a digest
per message. At most `budget` bytes of that are held (an estimate); past it the least recently used scans are
dropped, and the next request of their conversations is scanned whole: a full scan, never a missed canary.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

from harness.detect.engine.codecs import HEAD
from harness.detect.engine.hits import DEFAULT_LIMITS, SNIPPET_WIDTH, NotInspected, ScanHit
from harness.detect.engine.matcher import Matcher
from harness.detect.engine.walk import LayerWalk, bytes_reopen
from harness.detect.tools import message_spans

#: Bytes of scans kept, at most (an estimate of what their hits, extents and digests hold).
BUDGET = 64 << 20
#: Bytes counted for a hit besides its snippet's context, and for a message's digest.
_HIT, _DIGEST = 256, 96

Key = tuple[str | None, str]  # (tenant, endpoint): whose conversation, with which route and service


@dataclass(eq=False)
class _Scan:
    """What is kept of one body's scan: its hits before `LayerWalk.result` drops the repeats (`hits`), where each of
    its top-level layers read (`reads`), its size (an estimate) and the digests that name it."""

    hits: list[ScanHit]
    reads: list[tuple[int, int]]
    size: int
    names: set[tuple[Key, bytes]] = field(default_factory=set)


def _before(hit: ScanHit, cut: int) -> bool:
    """Whether a hit belongs to the part of a body before `cut`: a hit in the raw bytes if it ends there (as in a
    window of a stream), a hit in a layer if the layer starts there."""
    if hit.layers:
        return (hit.layers[0][1] or 0) < cut  # a top-level layer always has its start (None is a SQLite cell's)
    return hit.hit.end <= cut


class Prefixes:
    """The request bodies scanned so far, by the digest of each prefix of their messages (for one matcher: another
    one forgets them all)."""

    def __init__(self, budget: int = BUDGET) -> None:
        self.budget = budget
        self.matcher: Matcher | None = None
        self._named: dict[tuple[Key, bytes], tuple[_Scan, int]] = {}  # -> the scan and where the prefix ends
        self._held: OrderedDict[int, _Scan] = OrderedDict()  # by id, the least recently used first
        self._size = 0
        self.resumed = 0  # bodies scanned only from near the end of a known prefix

    @property
    def size(self) -> int:
        """Bytes held (the estimate `budget` bounds)."""
        return self._size

    def scan(self, data: bytes, matcher: Matcher, key: Key, *, not_inspected: list[NotInspected] | None = None
             ) -> list[ScanHit]:
        """`stream.scan_bytes(data, matcher, headerless=False, exclude=key[0])` of a request body (`key`: its tenant
        and endpoint), resumed after the longest prefix of its messages scanned before under `key`."""
        if matcher is not self.matcher:
            self._named.clear()
            self._held.clear()
            self._size, self.matcher = 0, matcher
        spans = message_spans(data)
        names = _digests(data, [end for _, end in spans], key)
        known = next((self._named[n] for n in reversed(names) if n in self._named), None)
        walk = self._resumed(data, matcher, key[0], spans, known) if known else None
        self.resumed += walk is not None
        if walk is None:
            walk = LayerWalk(matcher, DEFAULT_LIMITS, key[0])
            walk.stream((data,), (), bytes_reopen(data), top=False)
        if spans and not walk.skipped and walk.remaining == DEFAULT_LIMITS.total_bytes:  # nothing decompressed
            self._keep(walk, names, [end for _, end in spans], matcher)
        return walk.result(not_inspected, "bytes")

    def _resumed(self, data: bytes, matcher: Matcher, exclude: str | None, spans: tuple[tuple[int, int], ...],
                 known: tuple[_Scan, int]) -> LayerWalk | None:
        """The walk of `data` resumed after the prefix `known` scanned, or None where it would not be the full
        scan's (the module's docstring says when)."""
        scan, shared = known
        self._held.move_to_end(id(scan))
        ahead = SNIPPET_WIDTH + 2 * matcher.longest + HEAD
        cut = max((start for start, _ in spans if start <= shared - ahead), default=None)
        if cut is None or any(a < cut < b for a, b in scan.reads):
            return None
        walk = LayerWalk(matcher, DEFAULT_LIMITS, exclude)
        walk.hits = [h for h in scan.hits if _before(h, cut)]
        walk.reads = [r for r in scan.reads if r[0] < cut]
        walk.resume(data, cut)
        return walk

    def _keep(self, walk: LayerWalk, names: list[tuple[Key, bytes]], ends: list[int], matcher: Matcher) -> None:
        """Hold the scan of a body under the digest of each of its messages' prefixes (`names`, each ending at its
        `ends`), then drop the least recently used scans while more than `budget` bytes are held."""
        context = 2 * (SNIPPET_WIDTH + matcher.longest)
        size = len(walk.hits) * (_HIT + context) + len(names) * _DIGEST + 16 * len(walk.reads)
        scan = _Scan(walk.hits, walk.reads, size, set(names))
        for name, end in zip(names, ends, strict=True):
            if (old := self._named.get(name)) is not None:
                old[0].names.discard(name)
                if not old[0].names:
                    self._drop(old[0])
            self._named[name] = scan, end
        self._held[id(scan)] = scan
        self._size += size
        while self._size > self.budget:
            self._drop(next(iter(self._held.values())))

    def _drop(self, scan: _Scan) -> None:
        for name in scan.names:
            del self._named[name]
        del self._held[id(scan)]
        self._size -= scan.size


def _digests(data: bytes, ends: list[int], key: Key) -> list[tuple[Key, bytes]]:
    """(key, digest of `data` up to each of `ends`), in order."""
    h = hashlib.blake2b(digest_size=16)
    out, at = [], 0
    for end in ends:
        h.update(data[at:end])
        at = end
        out.append((key, h.copy().digest()))
    return out

"""The walk through a stream's layers: every canary of every tenant in a buffer or a file and in every layer inside it.

Built on `harness.detect.engine.matcher.Matcher` (one automaton, every encoding, one pass), the candidate layer
starts of `harness.detect.engine.containers` and the streaming decoders of `harness.detect.engine.codecs`. Everything is
read as a stream, in windows of `WINDOW` bytes that overlap by the longest encoded pattern, so memory stays
bounded whatever the size of a file or of what it inflates to.

One loop composes every layer with every other (`LayerWalk.stream`): in each window the scanner finds the
canaries, then every layer that starts there, of every kind, and scans what each decodes to exactly as it
scans a file (the same finders, the same decoders, a stream without a magic number tried at its start),
so a chain of layers is found in any order, to `Limits.depth`. SQLite files (`SQLite format 3\\0`) are
scanned twice: the raw bytes, and every value of every table, read logically (`harness.detect.engine.database`),
each value a stream of its own.

A decoded layer counts against `Limits` (`stream_bytes` per stream, `total_bytes` per file, `depth`,
`seconds`). A limit that stops reading is a `NotInspected` entry; one that left part of a file unread
(`partial`) makes an audit inconclusive. A corrupt or truncated stream still has its decodable prefix
scanned. A layer a weaker sign shows is held to more before it is taken: a stream without a magic number
inside another layer (or a cell) only if it ends properly, and past the depth cap a run (`containers.RUN`)
is listed only if its decoded bytes show what its raw bytes cannot (a canary in an encoding of its own, a
layer with a magic number): a run of base64 or hex characters decodes to something whatever it is.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path

from harness.detect.engine import codecs, containers, database, records, signs
from harness.detect.engine.containers import BARE, MAGIC, RUN, Start
from harness.detect.engine.hits import Layer, Limits, NotInspected, ScanHit, Snippet, where
from harness.detect.engine.matcher import Hit, Matcher
from harness.detect.engine.pages import SQLITE_MAGIC, cut_extension, free_spans, page_grid
from harness.detect.engine.progress import Reopen, bytes_reopen

#: Bytes read per window (each window also holds the last `Matcher.longest` bytes of the one before).
WINDOW = 4 << 20
#: Layers that re-encode bytes which are scanned raw too (a canary their raw bytes show is reported there).
TRANSFORMS = frozenset({*codecs.TEXT, *codecs.KEEPING, "records"})


class LayerWalk:
    """One top-level scan (a file or a buffer): its hits, what it could not read, its decoding budget."""

    def __init__(self, matcher: Matcher, limits: Limits, exclude: str | None = None,
                 recipient: str | None = None) -> None:
        self.matcher = matcher
        self.limits = limits
        self.exclude = exclude  # a tenant whose canaries are not looked for (`Matcher.find`)
        self.recipient = recipient or exclude  # whose own canaries cut short are no other's (`cuts`)
        self.remaining = limits.total_bytes
        self.deadline = time.monotonic() + limits.seconds
        self.late = False  # the time budget is spent (and listed once)
        self.min_bytes = max(matcher.shortest, 1)  # no layer shorter than a canary holds one
        self.hits: list[ScanHit] = []
        self.paged: dict[tuple[Layer, ...], tuple[int, int]] = {}  # a database's (or WAL's) raw stream -> its grid
        self.skipped: list[tuple[tuple[Layer, ...], str, int]] = []  # (layers, reason, bytes read)
        self.reads: list[tuple[int, int]] = []  # (start, end) of what each decoded top-level layer may have read
        # A hit must lie whole in one window with the base64 character on either side of it, a wrapped block's
        # line (up to `containers.LINE_LOOKBACK` bytes) with the break after it, and the records around a place a
        # value may be cut across them (`records.REACH` on either side: the next window reassembles those near
        # the end of this one).
        self.overlap = max(matcher.longest + 8, containers.LINE_LOOKBACK + 8, 2 * records.REACH + 8)

    def stream(self, chunks: Iterable[bytes], layers: tuple[Layer, ...], reopen: Reopen, *, top: bool,
               sqlite_path: Path | None = None) -> None:
        """Scan the bytes of `chunks` window by window, and every layer that starts in them. `top`: try the
        formats without a magic number at its start (a file, a decoded layer, a cell; not an HTTP body).

        A hit (or a layer start) belongs to the window its end falls in: each window owns the bytes up
        to its last one but one (the last one only in the final window), so a base64 form's closing
        character is always in the window that reports it.
        """
        skip: dict[str, int] = {}  # by codec ("*": every codec): where the layers decoded so far ended
        if type(chunks) is tuple and len(chunks) == 1:  # one buffer (a SQLite cell, a body): one window
            (window,) = chunks
            if (grid := page_grid(window[:100])) is not None:
                self.paged[layers] = grid
            first = len(self.hits)
            self._window(window, 0, (0, len(window), True), skip, layers, reopen, top)
            self._drop_cut_paths(window, layers, first)
            if window.startswith(SQLITE_MAGIC):
                database.read(self, layers, reopen, sqlite_path)
            return
        owned_from = 0  # absolute offset: what ends at or before it was handled by an earlier window
        base = 0  # absolute offset of the window's first byte
        tail = b""
        header = b""
        first = len(self.hits)
        for chunk, last in _windows(chunks):
            window = tail + chunk if tail else chunk
            limit = base + len(window) - (0 if last else 1)
            if base == 0:
                header = window[:100]
                if (grid := page_grid(header)) is not None:
                    self.paged[layers] = grid
            self._window(window, base, (owned_from, limit, last), skip, layers, reopen, top and base == 0)
            owned_from = limit
            if last:
                break
            tail = window[-self.overlap :]
            base += len(window) - len(tail)
        self._drop_cut_paths(header, layers, first)
        if header.startswith(SQLITE_MAGIC):
            database.read(self, layers, reopen, sqlite_path)

    def resume(self, data: bytes, cut: int) -> None:
        """Scan a buffer from `cut` on, as the window after one that ended at `cut` (whose hits and reads the walk
        holds already): it starts `overlap` bytes before `cut` and owns what ends after it."""
        base = max(0, cut - self.overlap)
        self._window(data[base:], base, (cut, len(data), True), {}, (), bytes_reopen(data), top=False)

    def _drop_cut_paths(self, header: bytes, layers: tuple[Layer, ...], first: int) -> None:
        """A database's raw bytes (and its WAL's) cut a value at every page boundary and where a cell's local
        part ends (its overflow page's number follows); its cells (read whole by `database.read`) do not. So a raw hit
        of a path that another tenant's path extends (the launch profile's home, which holds every other
        profile's) cannot tell the two apart when a page boundary follows it (within 6 bytes per character the
        longer path adds: its most expanded encoding) or a byte that is not text follows it, right after it or
        after the longer path's first bytes (`pages.cut_extension`): the cells decide.
        """
        grid = page_grid(header)
        if grid is None or not self.matcher.extended:
            return
        start, stride = grid

        def cut(h: ScanHit) -> bool:
            reach = self.matcher.extended.get((h.tenant, h.kind))
            if not reach or h.layers != layers:
                return False
            if (h.hit.end + 6 * reach - start) // stride >= -(-(h.hit.end - start) // stride):  # a page boundary
                return True
            extensions = self.matcher.extensions[(h.tenant, h.kind)] if h.hit.encoding == "plain" else None
            return h.snippet is not None and cut_extension(h.snippet.following, extensions, 6 * reach)

        self.hits[first:] = [h for h in self.hits[first:] if not cut(h)]

    def _window(self, window: bytes, base: int, owns: tuple[int, int, bool], skip: dict[str, int],
                layers: tuple[Layer, ...], reopen: Reopen, top: bool) -> None:
        """Scan one window (its first byte at absolute offset `base`): the hits and layer starts it owns
        (ending in (owned_from, limit] of `owns`, whose last item says whether the window ends the stream), and
        the records around the places a value may be cut across them (`_records`). A start inside a text layer
        or chunked body already decoded is skipped (`skip`) where that layer's output holds it again: inside one
        that keeps what it does not decode (`codecs.KEEPING`), every start but a framing's that joins lines
        (`codecs.LINES`); inside a base64 or hex run, one of the same codec."""
        owned_from, limit, last = owns
        found, markers = self.add_hits(window, base, owned_from, limit, layers, ends=last)
        text_signs = signs.find(window) if window.count(0, 0, 4096) < 4 else None
        points = self._cut_points(window, base, owns, (found, markers), text_signs)
        grid = self.paged.get(layers)
        starts = containers.layer_starts(window, top=top, min_bytes=self.min_bytes, paged=grid is not None,
                                         text_signs=text_signs)
        if points:  # records in a JSON string (a tool's output): decoded first, then reassembled
            starts += containers.escaped_strings(window, [p for p in points if records.in_escaped_records(window, p)])
        if points != []:
            self._records(window, base, owns, layers, points)
        islands: set[Start] = set()  # the runs in a database's free space (a deleted row's text: no cell holds it)
        if grid is not None and window.count(0, 0, 4096) >= 4:
            known = {(s.pos, s.codec) for s in starts}
            for a, b in free_spans(window, base, grid):
                islands |= {s._replace(pos=s.pos + a, seen=s.seen + a) for s in
                            containers.island_starts(window[a:b], self.min_bytes) if (s.pos + a, s.codec) not in known}
        for start in sorted([*starts, *islands], key=lambda s: s.pos):
            at = base + start.pos
            kept = 0 if start.codec in codecs.LINES else skip.get("*", 0)
            if not owned_from < base + start.seen <= limit or at < max(skip.get(start.codec, 0), kept):
                continue
            first = len(self.hits)
            end = self._layer(window, start, layers, reopen, base + len(window), at)
            if start in islands:  # a path a page boundary may have cut is the cells' to judge (`_drop_cut_paths`)
                self.hits[first:] = [h for h in self.hits[first:] if (h.tenant, h.kind) not in self.matcher.extended]
            if end is not None:
                key = "*" if start.codec in codecs.KEEPING else start.codec
                skip[key] = max(skip.get(key, 0), end)

    def _cut_points(self, window: bytes, base: int, owns: tuple[int, int, bool],
                    marked: tuple[list[Hit], list[int] | None], text_signs: signs.Signs | None) -> list[int] | None:
        """The places in a text window (`text_signs`: its signs; None for binary data, which holds no records)
        where a value may be cut across records (`records.cut_points`; `marked`: the window's hits, and where a
        form of the marker is) that this window reassembles: those within `records.REACH` of its end are the next
        window's, which holds `records.REACH` bytes before them. None: anywhere (without the prefilter)."""
        if text_signs is None or (b"\n" not in window and b"\\" not in window):
            return []  # records are lines (real ones, or a JSON string's escaped ones)
        points = records.cut_points(window, marked, text_signs[signs.PIECE_END], self.matcher.longest)
        if not points:
            return points
        owned_from, limit, last = owns
        lo = owned_from - records.REACH if owned_from else -1
        hi = limit if last else limit - records.REACH
        return [p for p in points if lo < base + p <= hi]

    def _records(self, window: bytes, base: int, owns: tuple[int, int, bool], layers: tuple[Layer, ...],
                 points: list[int] | None) -> None:
        """Reassemble the records around `points` (None: every record of the window's part) and scan each JSON
        path's text over them as a stream of its own (layer `records:PATH`, at its first record). Where a path's
        text near a point may go on past what was read, the bound is listed."""
        owned_from, limit, last = owns
        if points is None:
            spans = [(max(0, owned_from - records.REACH - base), limit - base - (0 if last else records.REACH))]
        else:
            spans = records.regions(window, points)
        for lo, hi in spans:
            here = (*layers, ("records", base + lo))
            if self.out_of_time(here):
                return
            edges = (lo > 0 or base > 0, hi < len(window) or not last)
            near = [p for p in points or () if lo <= p < hi]
            done = records.reassemble(window, (lo, hi), near, edges, self.matcher.longest)
            for s in done.streams:
                self.stream((s.text,), (*layers, (f"records:{s.path}", base + s.at)), bytes_reopen(s.text), top=False)
            if done.short:
                self.skipped.append((here, f"records: the text at {', '.join(done.short)} may go on past the "
                                     f"{records.REACH >> 10} KiB read around a value cut across records", hi - lo))

    def add_hits(self, window: bytes, base: int, owned_from: int, limit: int, layers: tuple[Layer, ...], *,
                 ends: bool = True) -> tuple[list[Hit], list[int] | None]:
        """Record the hits in `window` that end in (owned_from, limit] (offsets from `base`), but the excluded
        tenant's and the recipient's own canaries cut short (`cuts`: `ends`: whether the window ends the value); returns
        every hit in `window`, and where a form of the marker is (`Matcher.find_marked`)."""
        found, markers = self.matcher.find_marked(window)
        for hit in found:
            if owned_from < base + hit.end <= limit and hit.tenant != self.exclude and not self._cut_short(
                    window, hit, ends):
                self.hits.append(ScanHit(replace(hit, start=base + hit.start, end=base + hit.end), layers,
                                         Snippet(self.matcher, window, hit)))
        return found, markers

    def _cut_short(self, window: bytes, hit: Hit, ends: bool) -> bool:
        """Whether `hit` is a plain start of one of the recipient's own canaries, cut short (`cuts`)."""
        return hit.encoding == "plain" and self.matcher.own_cuts.cut_short(
            window[hit.end : hit.end + self.matcher.longest], (hit.tenant, hit.kind), self.recipient, ends)

    def _layer(self, window: bytes, start: Start, layers: tuple[Layer, ...], reopen: Reopen, after: int,
               at: int) -> int | None:
        """Decode the layer `start` shows (absolute offset `at`) and scan its output as a stream of its own;
        returns where it ended in its parent, for a text layer, a chunked body or the members of a compressed
        format (`codecs.MEMBERS`: a member after the first is in its output)."""
        codec = start.codec
        child = (*layers, (codec, at))
        head = memoryview(window)[start.pos : start.pos + codecs.HEAD]
        if not codecs.plausible(codec, head) or self.out_of_time(child):
            return None

        def source() -> Iterator[memoryview | bytes]:
            return _rest(memoryview(window)[start.pos :], reopen, after)

        if start.sign == BARE and (layers or at) and not self._ends(codec, source()):
            return None  # taken on its place alone only at the start of a file
        progress = codecs.Progress()
        pieces = codecs.decode(codec, source(), progress)
        if len(layers) >= self.limits.depth:
            if self._beyond(start, pieces):
                self.skipped.append((child, f"depth cap ({self.limits.depth} nested containers)", 0))
            return None
        if codec not in TRANSFORMS:
            pieces = self._capped(pieces, child)

        def again(offset: int) -> Iterator[bytes]:
            return _skip(codecs.decode(codec, reopen(at), codecs.Progress()), offset)

        self.stream(pieces, child, again, top=True)
        if not layers:  # a stream that did not end may have read (and failed) on to the end of the buffer
            self.reads.append((at, at + progress.consumed if progress.eof or codec in TRANSFORMS else after))
        return at + progress.consumed if codec in TRANSFORMS or codec in codecs.MEMBERS else None

    def _ends(self, codec: str, source: Iterable[memoryview | bytes]) -> bool:
        """Whether the stream without a magic number at `source` decodes to something and ends properly within
        the stream cap: a decoder fed other bytes may decode them for a while, but hardly ever to an end."""
        progress = codecs.Progress()
        size = 0
        for piece in codecs.decode(codec, source, progress):
            size += len(piece)
            if size > self.limits.stream_bytes:
                return False
        return size > 0 and progress.eof and not progress.error

    def _beyond(self, start: Start, pieces: Iterator[bytes]) -> bool:
        """Whether a layer past the depth cap holds something: what it decodes to, for a layer a magic
        number or a proper end shows; for a run, its first decoded piece shows what its raw bytes cannot (a
        canary in an encoding of its own, a layer with a magic number)."""
        first = next(pieces, b"")
        if start.sign != RUN or not first:
            return bool(first)
        return (any(h.encoding != "plain" for h in self.matcher.find(first))
                or any(s.sign == MAGIC for s in containers.layer_starts(first, top=False, min_bytes=self.min_bytes)))

    def out_of_time(self, layers: tuple[Layer, ...], read: int = 0) -> bool:
        """Whether the time budget is spent. The first layer it stops is listed: every later one is not
        decoded either."""
        if time.monotonic() < self.deadline:
            return False
        if not self.late:
            self.late = True
            self.skipped.append((layers, f"time budget ({self.limits.seconds:g} s per file) spent: this layer and "
                                 "every later one not decoded", read))
        return True

    def _capped(self, pieces: Iterator[bytes], layers: tuple[Layer, ...]) -> Iterator[bytes]:
        """`pieces` up to the stream and total limits; reaching one while output remains is recorded."""
        read = 0
        for piece in pieces:
            if self.out_of_time(layers, read):
                return
            room = min(self.limits.stream_bytes - read, self.remaining)
            if room <= 0 or len(piece) > room:
                if room > 0:
                    read += room
                    self.remaining -= room
                    yield piece[:room]
                if read >= self.limits.stream_bytes:
                    reason = f"decompression cap ({self.limits.stream_bytes} bytes per stream)"
                else:
                    reason = f"decompression budget ({self.limits.total_bytes} bytes per file) exhausted"
                self.skipped.append((layers, reason, read))
                return
            read += len(piece)
            self.remaining -= len(piece)
            yield piece

    def result(self, not_inspected: list[NotInspected] | None, label: str = "") -> list[ScanHit]:
        """The hits, without those a decoded block repeats from its own raw bytes (see the module docstring)."""
        if not_inspected is not None:
            not_inspected += [NotInspected(label + where(layers), reason, read)
                              for layers, reason, read in self.skipped]
        shown = {(h.tenant, h.kind, h.layers) for h in self.hits}
        return [h for h in self.hits
                if not (h.layers and h.layers[-1][0].partition(":")[0] in TRANSFORMS
                        and (h.tenant, h.kind, h.layers[:-1]) in shown)]

def _windows(chunks: Iterable[bytes]) -> Iterator[tuple[bytes, bool]]:
    """`chunks` regrouped into windows of about WINDOW bytes, each with whether it is the last."""
    pending: list[bytes] = []
    size = 0
    ready: bytes | None = None
    for chunk in chunks:
        if not chunk:
            continue
        pending.append(bytes(chunk))
        size += len(chunk)
        if size >= WINDOW:
            if ready is not None:
                yield ready, False
            ready = pending[0] if len(pending) == 1 else b"".join(pending)
            pending, size = [], 0
    if pending:
        if ready is not None:
            yield ready, False
        ready = pending[0] if len(pending) == 1 else b"".join(pending)
    if ready is not None:
        yield ready, True


def _rest(view: memoryview, reopen: Reopen, after: int) -> Iterator[memoryview | bytes]:
    """What follows a layer's start: the rest of the window, then (only if the decoder needs it) the
    stream read again from the window's end."""
    yield view
    yield from reopen(after)


def _skip(pieces: Iterator[bytes], offset: int) -> Iterator[bytes]:
    for piece in pieces:
        if offset >= len(piece):
            offset -= len(piece)
            continue
        yield piece[offset:]
        offset = 0

"""Line-delimited records: NDJSON and JSON lines (a streaming provider's chunks, a log of JSON-RPC frames), SSE
`data:` events and a JSON array written one element per line, whose text a stream spreads over the string fields
of consecutive records. `streams` reassembles it: every string at one JSON path, in order, concatenated
(schema-free: a provider's `message.content`, an event's `delta.text`, a frame's `params.text`), so a value cut
across records is whole again.

The walk (`harness.detect.engine.walk`) reassembles the records within `REACH` bytes around each place where a
value may be cut (`cut_points`), not every record of every stream: that would cost more than the rest of the scan
(a JSON log is records too). Every minted canary holds the marker (`TAG_MARKER`), so a value cut across records
leaves either a form of the marker that no canary found covers (the cut is elsewhere in the value) or a string
that ends in a proper prefix of the marker, written as it is or every character escaped (the cut is in the
marker: `signs.PIECE_END`). A value encoded before it was streamed (base64, hex) is found so when its marker's
form is whole in one record. Without the prefilter (a canary without the marker) the records are reassembled
everywhere.
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
import stringzilla

from harness.detect.engine import signs
from harness.detect.engine.matcher import Hit, Matcher

#: Bytes of records read on either side of a place a value may be cut.
REACH = 32 << 10
#: Longest line read as a record.
MAX_RECORD = 1 << 20
#: How deep the walk follows nested JSON; deeper strings are still in the raw bytes' scan.
MAX_DEPTH = 64


def loads(data: bytes) -> Any:
    """A JSON document, or None. orjson parses it where it can (3-4x faster on small events); json takes what
    orjson refuses (NaN, lone surrogate escapes, nesting past 1024 levels)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def record(line: bytes) -> dict[str, Any] | list[Any] | None:
    """The JSON object or array a line holds: the line itself, an SSE event's data (`data: {...}`), or an element
    of a JSON array written one per line (`[{...},`, `{...},`, `{...}]`)."""
    line = line.strip()
    if line.startswith(b"data:"):
        line = line[5:].lstrip()
    if not line or line[0] not in b"{[,":
        return None
    doc = loads(line) if line[0] != 0x2C else None
    if doc is None and line[0] in b"[,":
        doc = loads(line[1:].rstrip(b",]"))
    return doc if type(doc) is dict or type(doc) is list else None


def collect(node: dict[str, Any] | list[Any], path: str, streams: dict[str, list[str]], depth: int) -> None:
    """Append every string under `node` (down to `depth` levels) to `streams[its path]`, in document order. The
    paths of other leaves are never built: this walk is half of the reassembly's cost, so it also compares exact
    types (a parsed document holds no subclasses)."""
    if not depth:
        return
    if type(node) is dict:
        prefix = f"{path}." if path else ""
        for key, value in node.items():
            kind = type(value)
            if kind is str:
                _append(streams, prefix + key, value)
            elif kind is dict or kind is list:
                collect(value, prefix + key, streams, depth - 1)
    else:
        for i, value in enumerate(node):
            kind = type(value)
            if kind is str:
                _append(streams, f"{path}[{i}]", value)
            elif kind is dict or kind is list:
                collect(value, f"{path}[{i}]", streams, depth - 1)


def _append(streams: dict[str, list[str]], path: str, text: str) -> None:
    parts = streams.get(path)
    if parts is None:
        streams[path] = [text]
    else:
        parts.append(text)


def streams(lines: Iterable[bytes], *, sse: bool = False) -> dict[str, list[str]]:
    """Every string of the records among `lines`, by JSON path, in order (`sse`: only `data:` events, a string
    event's text at the path "")."""
    out: dict[str, list[str]] = {}
    for line in lines:
        if sse:
            if not line.startswith(b"data:"):
                continue
            event = loads(line[5:])
            if type(event) is str:
                _append(out, "", event)
                continue
        else:
            event = record(line)
        if type(event) is dict or type(event) is list:
            collect(event, "", out, MAX_DEPTH)
    return out


def utf8(text: str) -> bytes:
    """`text` as the bytes it came from (surrogateescape). A lone surrogate from a JSON escape (`"\\ud83d"`, or a
    pair cut across two records) cannot be written so; it is then written as surrogatepass does."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def cut_points(window: bytes, marked: tuple[list[Hit], list[int] | None], piece_ends: list[tuple[int, int]],
               longest: int) -> list[int] | None:
    """Where a value may be cut across records in `window`, in order: every form of the marker that no hit covers
    within `longest` bytes (the longest form of a canary) of a string's quote, where the piece holding it ends or
    starts (`marked`: the window's hits and where a form of the marker is, `Matcher.find_marked`), and every
    string's closing quote after a proper prefix of the marker (`piece_ends`: `signs.PIECE_END`). None without
    the marker's forms (a canary without the marker): anywhere."""
    hits, markers = marked
    if markers is None:
        return None
    points = [end - 1 for _, end in piece_ends]
    if markers:
        spans = sorted((h.start, h.end) for h in hits)
        starts = [s for s, _ in spans]
        reach = list(itertools.accumulate((e for _, e in spans), max))  # the furthest end of the hits so far
        points += [p for p in markers if not _covered(p, starts, reach)
                   and (window.find(b'"', p, p + longest) >= 0 or window.rfind(b'"', max(0, p - longest), p) >= 0)]
    return sorted(points)


def in_escaped_records(window: bytes, pos: int) -> bool:
    """Whether records written in a JSON string (escaped line breaks before a record: `\\n{`, `\\ndata:`) are
    within `REACH` of `pos`: a tool's output of line-delimited records, whose string is decoded before they are
    reassembled."""
    lo, hi = max(0, pos - REACH), pos + REACH
    return any(stringzilla.find(window, head, lo, hi) >= 0 for head in (b"\\n{", b"\\ndata:"))


def may_cut(data: bytes, matcher: Matcher) -> bool:
    """Whether a value may be cut across records in `data` (text): it has lines (a line break, real or escaped),
    and a form of the marker or a string's end in a piece of it (`cut_points` looks at no more)."""
    if b"\n" not in data and (b"\\" not in data or b"\\n" not in data):  # memchr first: a 2-byte search is slow
        return False
    return matcher.may_find(data) or bool(signs.find(data)[signs.PIECE_END])


def _covered(pos: int, starts: list[int], reach: list[int]) -> bool:
    """Whether a hit covers `pos` (`starts`: the hits' starts, in order; `reach`: the furthest end up to each)."""
    i = bisect.bisect_right(starts, pos)
    return i > 0 and reach[i - 1] > pos


@dataclass(frozen=True)
class Stream:
    """The text one JSON path spreads over the records of a region: where its first record starts (in the
    window), the path, the text (UTF-8)."""

    at: int
    path: str
    text: bytes


def regions(window: bytes, points: list[int]) -> list[tuple[int, int]]:
    """[lo, hi) of the whole lines within REACH bytes of each of `points` (in order), the point's own line always
    (unless longer than MAX_RECORD: no record), merged."""
    out: list[list[int]] = []
    for p in points:
        start = window.rfind(b"\n", max(0, p - MAX_RECORD), p) + 1
        end = window.find(b"\n", p, p + MAX_RECORD)
        if (not start and p > MAX_RECORD) or (end < 0 and len(window) > p + MAX_RECORD):
            continue
        end = len(window) if end < 0 else end + 1
        reach = max(0, p - REACH)
        if not reach:
            lo = 0
        elif start <= reach:
            lo = start
        else:  # the first line that starts within reach (the byte before `start` is a line break)
            lo = window.find(b"\n", reach - 1, start) + 1
        # the rest within reach is read to the text's end: a last line without its line break too
        hi = len(window) if p + REACH >= len(window) else window.rfind(b"\n", end, p + REACH) + 1 or end
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


@dataclass
class Reassembly:
    """The records of one region: each path's text over them (`streams`), and where a path's text near a point
    may go on past the region (`short`: the paths, so the bound is reported)."""

    streams: list[Stream]
    short: list[str]


def reassemble(window: bytes, span: tuple[int, int], points: list[int], edges: tuple[bool, bool],
               longest: int) -> Reassembly:
    """The streams of the records in `window[lo:hi]` (`span`) that span more than one record. `edges`: whether
    more of the stream is before and after the region; a path of a point's record that runs into such an edge (the
    region's first or last record holds it) with less than `longest` characters (the longest form of a canary)
    between the point and the edge may hold a value's rest past it: it is `short`."""
    lo, hi = span
    offsets: list[int] = []
    ends: list[int] = []
    texts: list[dict[str, list[str]]] = []
    pos = lo
    for line in window[lo:hi].split(b"\n"):
        doc = record(line)
        if doc is not None:
            found: dict[str, list[str]] = {}
            collect(doc, "", found, MAX_DEPTH)
            if found:
                offsets.append(pos)
                ends.append(pos + len(line))
                texts.append(found)
        pos += len(line) + 1
    by_path: dict[str, list[int]] = {}  # path -> the records holding it
    for i, found in enumerate(texts):
        for path in found:
            by_path.setdefault(path, []).append(i)
    out = [Stream(offsets[held[0]], path, utf8("".join(s for i in held for s in texts[i][path])))
           for path, held in by_path.items() if len(held) > 1]
    held_points = {r for p in points if (r := bisect.bisect_right(offsets, p) - 1) >= 0 and p <= ends[r]}
    return Reassembly(out, _short(texts, by_path, held_points, edges, longest))


def _short(texts: list[dict[str, list[str]]], by_path: dict[str, list[int]], at: set[int], edges: tuple[bool, bool],
           longest: int) -> list[str]:
    """The paths of the records holding a point (`at`: their indexes; a point on a line that is no record has
    none) that run into an edge where the region was cut (`edges`) with less than `longest` characters between
    the point's record and it."""
    cumulative: dict[str, dict[int, tuple[int, int]]] = {}  # path -> record -> its characters before, after it
    short = set()
    for r in at:
        for path in texts[r]:
            held = by_path[path]
            if len(held) < 2 or path in short:
                continue
            if path not in cumulative:
                sizes = [sum(map(len, texts[i][path])) for i in held]
                total, sums = sum(sizes), list(itertools.accumulate(sizes, initial=0))
                cumulative[path] = {i: (sums[k], total - sums[k + 1]) for k, i in enumerate(held)}
            before, after = cumulative[path][r]
            if (edges[0] and held[0] == 0 and before < longest) or (edges[1] and held[-1] == len(texts) - 1
                                                                   and after < longest):
                short.add(path)
    return sorted(short)

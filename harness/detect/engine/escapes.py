"""JSON string escapes in the matcher's search: where a canary may be written half escaped, and one level of
escapes undone with the map back to the escaped bytes (`Unescaped`).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re

import ahocorasick_rs

#: The start of a JSON escape of an ASCII character (`\\u002f`, `\\/`): where a canary may be written half
#: escaped. An automaton (the SIMD searcher, leftmost-first: no string can start inside another), not a regex:
#: in binary data (a backslash every 256 bytes) a regex took 2.5 ms per MiB, the automaton 0.1 ms.
ESCAPE_STARTS = ahocorasick_rs.BytesAhoCorasick([b"\\u00%d" % d for d in range(8)] + [b"\\/"],
                                                 matchkind=ahocorasick_rs.MatchKind.LeftmostFirst)
#: One JSON string escape: a UTF-16 surrogate pair (one character), a `\\uXXXX` or a simple escape
#: (captured, so that `split` returns the escapes too).
_JSON_ESCAPE = re.compile(rb'(\\(?:u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}'
                          rb'|u[0-9a-fA-F]{4}|["\\/bfnrt]))')
_SIMPLE_ESCAPES = {b'"': b'"', b"\\": b"\\", b"/": b"/", b"b": b"\b", b"f": b"\f", b"n": b"\n", b"r": b"\r",
                   b"t": b"\t"}
#: How many times a region is unescaped (a JSON string holding JSON holding JSON).
MAX_UNESCAPE = 3


def escape_triggers(data: bytes | bytearray | memoryview) -> list[int]:
    """Where an escape of an ASCII character starts (`ESCAPE_STARTS`), in order."""
    return [pos for _, pos, _ in ESCAPE_STARTS.find_matches_as_indexes(data)]


@functools.lru_cache(maxsize=4096)
def _unescape(escape: bytes) -> bytes:
    """The UTF-8 bytes of one `_JSON_ESCAPE` match (a lone surrogate is kept, as `surrogatepass` writes it)."""
    if len(escape) == 2:
        return _SIMPLE_ESCAPES[escape[1:]]
    unit = int(escape[2:6], 16)
    if len(escape) == 12:  # a surrogate pair
        unit = 0x10000 + ((unit - 0xD800) << 10) + (int(escape[8:12], 16) - 0xDC00)
    return chr(unit).encode("utf-8", "surrogatepass")


class Unescaped:
    """One level of JSON string escapes undone in `data`, with the map from offsets in the result back to
    offsets in `data` (every escape is one span; the text between them maps one to one). Built with list
    operations, not a loop over the escapes: a canary written all escaped has one escape per character."""

    def __init__(self, data: bytes) -> None:
        raw = _JSON_ESCAPE.split(data)  # text, escape, text, ..., escape, text
        out = raw.copy()
        out[1::2] = map(_unescape, raw[1::2])
        self.text = b"".join(out)
        out_at = list(itertools.accumulate(map(len, out), initial=0))  # where each piece starts in the result
        raw_at = list(itertools.accumulate(map(len, raw), initial=0))  # ... and in `data`
        #: Where each escape starts and ends in the result and in `data`.
        self.out_starts, self.out_ends = out_at[1:-1:2], out_at[2::2]
        self.raw_starts, self.raw_ends = raw_at[1:-1:2], raw_at[2::2]

    def raw_span(self, start: int, end: int) -> tuple[int, int]:
        """The span of `data` that the result's [start, end) was decoded from (an escape cut by either end
        counts whole)."""
        i = bisect.bisect_right(self.out_starts, start) - 1  # the last escape starting at or before `start`
        if i >= 0:
            o_end, r_end = self.out_ends[i], self.raw_ends[i]
            start = self.raw_starts[i] if start < o_end else r_end + (start - o_end)
        j = bisect.bisect_left(self.out_starts, end) - 1  # the last escape starting before `end`
        if j >= 0:
            o_end, r_end = self.out_ends[j], self.raw_ends[j]
            end = r_end if end <= o_end else r_end + (end - o_end)
        return start, end

"""The fixed strings of text the engine looks for besides magic numbers (`containers`), found in one pass over a
text window (`find`; three automata cost four times as much as one): the signs of the text framings (a soft line
break of quoted-printable, raw or in a JSON string; an encoded word; a numeric character reference), where a hex
dump's line may start (after a line break, real or escaped, an offset's zeros or a space: `dumps`), and where a JSON
string ends in a proper prefix of the marker (a value cut across records: `records`).
"""

from __future__ import annotations

import ahocorasick_rs

from harness.core.registry import TAG_MARKER

QP, QP_ESCAPED, WORD, REFERENCE, DUMP_HEAD, PIECE_END = "qp", "qp-escaped", "rfc2047", "html", "dump-head", "piece-end"
Signs = dict[str, list[tuple[int, int]]]  # by kind: (start, end) of each


def _piece_ends() -> list[bytes]:
    """How a JSON string that ends in a proper prefix of the marker ends: the prefix as it is or every character
    escaped (either case of hex digit), then the closing quote (escaped too: records in a JSON string)."""
    ends = set()
    for k in range(1, len(TAG_MARKER)):
        prefix = TAG_MARKER[:k]
        ends |= {prefix, *("".join(f"\\u{ord(c):04{x}}" for c in prefix) for x in "xX")}
    return sorted(end.encode() + quote for end in ends for quote in (b'"', b'\\"'))


_SIGNS = [
    (b"=\r\n", QP), (b"=\n", QP), (b"=\\n", QP_ESCAPED),  # a soft line break (its LF escaped in a JSON string)
    (b"=?", WORD),
    (b"&#", REFERENCE),
    *((head, DUMP_HEAD) for head in (b"\n000", b"\n ", b"\\n000", b"\\n ")),
    *((end, PIECE_END) for end in _piece_ends()),
]
# Leftmost-first, as the SIMD searcher needs: a sign skipped for overlapping another one is of no use to it.
_AUTOMATON = ahocorasick_rs.BytesAhoCorasick([s for s, _ in _SIGNS], matchkind=ahocorasick_rs.MatchKind.LeftmostFirst)
_KINDS = [kind for _, kind in _SIGNS]


def find(window: bytes) -> Signs:
    """(start, end) of every sign in a text window, by kind."""
    found: Signs = {QP: [], QP_ESCAPED: [], WORD: [], REFERENCE: [], DUMP_HEAD: [], PIECE_END: []}
    for i, start, end in _AUTOMATON.find_matches_as_indexes(window):
        found[_KINDS[i]].append((start, end))
    return found

"""The encoded forms of a canary the matcher looks for, and the checks their edges need.

A canary is looked for as itself and in every encoding a tool or a log may give it (`encodings_with_edges`):
base64 at its three byte alignments (with the bits of the partial characters at its edges, `Edge`), hex,
URL and JSON escapes, UTF-16, HTML entities and more. A canary encoded twice in base64 is found around a
trigger instead (`Doubles`): its forms are not patterns of the automaton.
"""

from __future__ import annotations

import base64
import binascii
import html
import json
import math
import re
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from harness.core.registry import TAG_MARKER

B64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
#: The 6-bit value of each base64 and base64url character (-1: not one).
_B64_VALUE = [-1] * 256
for _i, _c in enumerate(B64_ALPHABET):
    _B64_VALUE[_c] = _i
_B64_VALUE[ord("-")], _B64_VALUE[ord("_")] = 62, 63


@dataclass(frozen=True)
class Edge:
    """The canary's bits in the partial base64 characters just outside a form: before it (`lead`, in the
    low bits of the character before) and after it (`trail`, in the high bits of the character after)."""

    lead_bits: int
    lead: int
    trail_bits: int
    trail: int

    def agrees(self, data: bytes | bytearray | memoryview, start: int, end: int) -> bool:
        """Whether the characters around data[start:end] carry the canary's bits. A missing character (the
        buffer ends there) is accepted: what the buffer holds is the canary's, and no near miss."""
        if self.lead_bits and 0 < start <= len(data):
            value = _B64_VALUE[data[start - 1]]
            if value < 0 or value & ((1 << self.lead_bits) - 1) != self.lead:
                return False
        if self.trail_bits and end < len(data):
            value = _B64_VALUE[data[end]]
            if value < 0 or value >> (6 - self.trail_bits) != self.trail:
                return False
        return True


_TO_STANDARD = bytes.maketrans(b"-_", b"+/")


def _b64_alignments(raw: bytes) -> list[tuple[bytes, Edge]]:
    """At each of the three byte alignments: the base64 characters fully determined by `raw`, and the
    canary's bits in the partial characters on either side."""
    out = []
    for pad in range(3):
        enc = base64.b64encode(b"\0" * pad + raw + b"\0\0")
        first = math.ceil(pad * 8 / 6)
        last = (pad + len(raw)) * 8 // 6  # exclusive: chars fully inside the raw bits
        lead_bits = first * 6 - pad * 8
        trail_bits = (pad + len(raw)) * 8 - last * 6
        lead = _B64_VALUE[enc[first - 1]] & ((1 << lead_bits) - 1) if lead_bits else 0
        trail = _B64_VALUE[enc[last]] >> (6 - trail_bits) if trail_bits else 0
        out.append((enc[first:last], Edge(lead_bits, lead, trail_bits, trail)))
    return out


def _json_u(value: str, hexfmt: str = "04x", keep: str = "") -> str:
    """`value` with every character not in `keep` written as a JSON `\\uXXXX` escape (UTF-16 surrogate
    pairs above U+FFFF, as JSON encoders write them)."""
    out = []
    for c in value:
        if c in keep:
            out.append(c)
            continue
        units = c.encode("utf-16-be")
        out += [f"\\u{int.from_bytes(units[i:i + 2], 'big'):{hexfmt}}" for i in range(0, len(units), 2)]
    return "".join(out)


def _lower_percent(form: str) -> str:
    return re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), form)


def encodings_with_edges(value: str) -> dict[str, list[tuple[bytes, Edge | None]]]:
    """Every encoded form of `value` the scanner looks for, by encoding name, each with the bits its base64
    neighbours must carry (None: nothing to check)."""
    raw = value.encode()
    forms: dict[str, list[tuple[bytes, Edge | None]]] = {"plain": [(raw, None)]}
    written = json.dumps(value)[1:-1]  # as JSON encoders write it: non-ASCII escaped (surrogate pairs), `"`, `\\`
    json_forms = {
        written,
        re.sub(r"\\u[0-9a-f]{4}", lambda m: m.group().upper().replace("\\U", "\\u"), written),
        json.dumps(value, ensure_ascii=False)[1:-1],
        _json_u(value),
        _json_u(value, "04X"),
    }
    json_forms |= {f.replace("/", "\\/") for f in list(json_forms) if "/" in f}
    forms["json"] = [(f.encode(), None) for f in sorted(json_forms) if f != value]
    url_forms = {urllib.parse.quote(value, safe=""), urllib.parse.quote(value), urllib.parse.quote_plus(value),
                 "".join(f"%{b:02X}" for b in raw)}
    url_forms |= {_lower_percent(f) for f in url_forms}
    forms["url"] = [(f.encode(), None) for f in sorted(url_forms) if f != value]
    forms["html"] = [(f.encode(), None) for f in {html.escape(value)} if f != value]
    b64 = _b64_alignments(raw)
    forms["base64"] = [(f, e) for f, e in b64]
    forms["base64url"] = [(f.replace(b"+", b"-").replace(b"/", b"_"), e) for f, e in b64 if b"+" in f or b"/" in f]
    forms["hex"] = [(raw.hex().encode(), None), (raw.hex().upper().encode(), None)]
    forms["utf16le"] = [(value.encode("utf-16-le"), None)]
    forms["utf16be"] = [(value.encode("utf-16-be"), None)]
    return {enc: fs for enc, fs in forms.items() if fs}


def encodings_of(value: str) -> dict[str, list[bytes]]:
    """Every encoded form of `value` that the automaton looks for, by encoding name."""
    return {enc: [f for f, _ in fs] for enc, fs in encodings_with_edges(value).items()}


def double_base64_forms(value: str) -> list[bytes]:
    """The base64 characters that `value` encoded twice in base64 determines, at every alignment of both
    encodings (a token encoded twice). Found by `Doubles`, not by the automaton."""
    return sorted({outer for inner, _ in _b64_alignments(value.encode()) for outer, _ in _b64_alignments(inner)})


_B64_RUN = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_")


class Doubles:
    """Canaries encoded twice in base64 (a token encoded twice): where they may be, and the base64 text
    there decoded once.

    Every double form of a canary holds a trigger: one of the marker's double forms where it holds one
    (every minted canary's do), else the form itself (a hand-written canary). Around each trigger found
    (`decoded`), the run of base64 characters within `reach` is decoded at each of the four character
    phases (a trigger says nothing sure about where the groups start); the caller searches the decoded
    text for the canaries' base64 forms, whose edges are checked there (`Edge`), bit by bit."""

    def __init__(self, values: Iterable[str]) -> None:
        markers = double_base64_forms(TAG_MARKER)
        self.triggers: set[bytes] = set()
        #: The longest double form.
        self.longest = 0
        for value in values:
            for form in double_base64_forms(value):
                self.triggers.add(next((m for m in markers if m in form), form))
                self.longest = max(self.longest, len(form))
        #: How far from a trigger its canary's characters, and those carrying its edge bits, can be (a
        #: trigger skipped for overlapping a found one starts inside it: one trigger further).
        self.reach = self.longest + max(map(len, self.triggers), default=0) + 8

    def decoded(self, data: bytes | bytearray | memoryview, positions: list[int]) -> Iterator[tuple[int, bytes]]:
        """(offset in `data`, bytes) of the base64 text around each trigger position, decoded at each phase."""
        regions: list[list[int]] = []
        for pos in positions:
            lo, hi = pos, pos
            while lo > max(0, pos - self.reach) and data[lo - 1] in _B64_RUN:
                lo -= 1
            while hi < min(len(data), pos + self.reach) and data[hi] in _B64_RUN:
                hi += 1
            if regions and lo <= regions[-1][1]:
                regions[-1][1] = max(regions[-1][1], hi)
            else:
                regions.append([lo, hi])
        for lo, hi in regions:
            chars = bytes(data[lo:hi]).translate(_TO_STANDARD)
            for phase in range(4):
                run = chars[phase:]
                run = run[: len(run) - (len(run) % 4 == 1)]  # a last character alone holds no whole byte
                yield lo + phase, binascii.a2b_base64(run + b"=" * (-len(run) % 4))

"""Markup character references: text a page, a template or an export writes as `&#104;&#101;` (decimal), `&#x68;`
(hex) or `&amp;` (named), every character or a few. A run of text holding one (`starts`, from `&#`) is decoded
whole (`decode`), its other characters kept as they are.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator

from harness.detect.engine.progress import Progress, text_bytes

#: A run: the text between two delimiters of markup (a tag, a quote) or of lines (a line break, a control
#: character): a text node, an attribute's value, a line.
RUN = re.compile(rb"[^<>\"'\x00-\x08\x0a-\x1f\x7f]*")
_DELIMITERS = frozenset(b"<>\"'\x7f" + bytes(c for c in range(0x20) if c != 0x09))
#: A numeric character reference (what starts a run).
_REFERENCE = re.compile(rb"&#(?:[0-9]{1,7}|[xX][0-9a-fA-F]{1,6});")
#: A reference cut by the end of a step (decoded with the next).
_CUT = re.compile(rb"&[#A-Za-z0-9]{0,32}\Z")
#: How far back the start of a run is looked for.
LOOKBACK = 4096


def starts(window: bytes, positions: list[int], min_bytes: int) -> list[tuple[int, int]]:
    """(first character, end of the reference that shows it) of every run holding a numeric character reference
    (`positions`: where `&#` is, in order) and at least `min_bytes` long; one per run."""
    out = []
    run_end = -1
    for pos in positions:
        if pos < run_end or not _REFERENCE.match(window, pos):
            continue
        first, lo = pos, max(0, pos - LOOKBACK)
        while first > lo and window[first - 1] not in _DELIMITERS:
            first -= 1
        run_end = RUN.match(window, pos).end()  # type: ignore[union-attr]  # `*` matches anywhere
        if run_end - first >= min_bytes:
            out.append((first, pos + 2))
    return out


def decode(steps: Iterator[memoryview], progress: Progress) -> Iterator[bytes]:
    """Decode a run from its first character to the first delimiter: every reference as its character
    (`text_bytes`), the rest as it is."""
    carry = b""
    for step in steps:
        data = carry + bytes(step)
        end = RUN.match(data).end()  # type: ignore[union-attr]
        if end < len(data):
            yield _unescape(data[:end])
            progress.consumed += len(step) - (len(data) - end)
            progress.eof = True
            return
        cut = _CUT.search(data, max(0, len(data) - 34))
        keep = cut.start() if cut else len(data)
        if keep:
            yield _unescape(data[:keep])
        carry = data[keep:]
        progress.consumed += len(step)
    if carry:
        yield _unescape(carry)


#: A character reference: decimal, hex or named (the `;` optional, as browsers read them).
_ANY_REFERENCE = re.compile(r"&(?:#([0-9]{1,7})|#[xX]([0-9a-fA-F]{1,6})|([A-Za-z][A-Za-z0-9]{1,31}));?")


def _character(m: re.Match[str]) -> str:
    """The character a reference names: a numeric one the code point itself (`&#0;` and `&#128;` too, where a
    browser substitutes another character: binary data written so is byte for byte), a named one as HTML names it."""
    if m.group(3):
        return html.unescape(m.group())
    point = int(m.group(1)) if m.group(1) else int(m.group(2), 16)
    return chr(point) if point < 0x110000 else m.group()


def _unescape(raw: bytes) -> bytes:
    return text_bytes(_ANY_REFERENCE.sub(_character, raw.decode("utf-8", "surrogateescape")))

"""Mail's transfer encodings that cut or wrap a value: quoted-printable (RFC 2045: `=XX` escapes and soft line
breaks, `=` at a line's end, which a decoder joins to the next line) and encoded words (RFC 2047: `=?utf-8?B?...?=`
or `?Q?`, in headers; adjacent words separated by white space or a folded line are one text). A base64 body
wrapped at 76 columns is a wrapped base64 block (`containers`).
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Iterator

from harness.detect.engine.progress import Progress

#: Longest line a quoted-printable layer reads (RFC 2045 allows 76 characters; encoders in the wild write more).
MAX_LINE = 64 << 10
#: How far back the start of the line holding a soft line break is looked for.
LOOKBACK = 4096
#: The longest line quoted-printable writes, its soft line break's `=` included (RFC 2045, 6.7).
MAX_QP_LINE = 76
#: A line an encoder broke for being full (76 characters, or a few fewer for an escape that did not fit).
FULL_LINE = 60
_ESCAPE = re.compile(rb"=[0-9A-F]{2}")


#: The bytes a quoted-printable line may hold besides its characters: none of the control characters but tab and CR
#: (8-bit bytes too: encoders in the wild leave UTF-8 unescaped).
_CONTROLS = bytes(c for c in range(0x20) if c not in b"\t\r") + b"\x7f"


#: What no quoted-printable text holds: a control character but tab and CR (binary data, whose `=` and line feed
#: are chance), or an `=` that starts no escape (quoted-printable writes `=` as `=3D`: base64's padding, a dump's
#: ASCII column, `a = b` in code are no soft line break).
_NOT_QP = re.compile(rb"[\x00-\x08\x0a-\x0c\x0e-\x1f\x7f]|=(?![0-9A-Fa-f]{2})")


def qp_start(window: bytes, brk: int) -> int | None:
    """Where the quoted-printable text that a soft line break (its `=` at `brk`) ends starts on its line: after the
    last byte no such text holds (`_NOT_QP`: text before it on the line is no part of it). None if that leaves
    nothing, or the line is none of quoted-printable's (`soft_break`)."""
    lo = max(0, brk - LOOKBACK)
    line_start = max(lo, window.rfind(b"\n", lo, brk) + 1)
    if not soft_break(window[line_start:brk]):
        return None
    first = line_start
    for m in _NOT_QP.finditer(window, line_start, brk):
        first = m.end()
    return first if first < brk else None


def escaped_soft_break(window: bytes, brk: int) -> bool:
    """Whether the `=` at `brk`, an escaped line feed after it (`=\\n` in a JSON string), ends a line of
    quoted-printable text (`soft_break`): the line from the escaped line break or the quote before it."""
    lo = max(0, brk - 2 * MAX_QP_LINE)
    start = max(window.rfind(b"\\n", lo, brk) + 2, window.rfind(b'"', lo, brk) + 1, lo)
    return soft_break(window[start:brk])


def soft_break(line: bytes) -> bool:
    """Whether a line (without its last `=`) ends in a soft line break: it is no longer than `MAX_QP_LINE`, and holds
    a space or an escape, as text does, or is nearly as long as an encoder's full line. A token with an `=` after
    it is not (an env listing's `KEY=`, base64's padding on a block's last line, a base64 value)."""
    if len(line) >= MAX_QP_LINE:
        return False
    return len(line) >= FULL_LINE or b" " in line or _ESCAPE.search(line) is not None


def _text(line: bytes) -> bool:
    return len(line.translate(None, _CONTROLS)) == len(line)


def word_ends(window: bytes, brk: int) -> bool:
    """Whether the `=` at `brk`, at a line's end, closes an encoded word (`?=`) rather than breaking a line."""
    if brk < 1 or window[brk - 1] != ord("?"):
        return False
    return any(word.end() == brk + 1 for word in WORD.finditer(window, max(0, brk - 256), brk + 1))


def quoted_printable(steps: Iterator[memoryview], progress: Progress) -> Iterator[bytes]:
    """Decode quoted-printable lines from the first: each line that ends in a soft line break joined to the next,
    up to the end of the first line without one (its line break not included), or before a line that is no text."""
    carry = b""  # the line a step's end cut
    for step in steps:
        data = carry + bytes(step)
        pos = 0
        while (nl := data.find(b"\n", pos)) >= 0:
            line = data[pos:nl].rstrip(b"\r").rstrip(b" \t")  # trailing white space is transport padding
            if not _text(line):
                progress.consumed += max(0, pos - 1)
                progress.eof = True
                return
            if not line.endswith(b"="):
                yield binascii.a2b_qp(line)
                progress.consumed += nl
                progress.eof = True
                return
            yield binascii.a2b_qp(line[:-1])
            pos = nl + 1
        progress.consumed += pos
        carry = data[pos:]
        if len(carry) > MAX_LINE:
            progress.error = f"quoted-printable line longer than {MAX_LINE} bytes"
            return
    yield binascii.a2b_qp(carry)
    progress.consumed += len(carry)


#: One encoded word: `=?charset?B|Q?text?=` (RFC 2047; a language after `*` in the charset is allowed).
WORD = re.compile(rb"=\?([^?\s]{1,64})\?([BbQq])\?([^?\s]*)\?=")
#: What may separate two adjacent encoded words: white space, a folded line (CRLF or LF, then white space).
_GAP = re.compile(rb"[ \t]*(?:\r?\n[ \t]+)?")
#: Most input a run of encoded words is read from (a header is shorter; a longer run is read again from its next
#: word, which is a start of its own).
MAX_WORDS = 64 << 10


def encoded_words(steps: Iterator[memoryview], progress: Progress) -> Iterator[bytes]:
    """Decode adjacent encoded words from the first, as one text: base64 (`B`) or quoted-printable with `_` for a
    space (`Q`), each word's bytes as they are (whatever its charset names)."""
    data = b""
    for step in steps:
        data += bytes(step)
        if len(data) >= MAX_WORDS:
            break
    pos = 0
    while (m := WORD.match(data, pos)) is not None:
        text = m.group(3)
        if m.group(2) in b"Bb":
            text = text[: len(text) - (len(text) % 4 == 1)]
            try:
                yield binascii.a2b_base64(text + b"=" * (-len(text) % 4))
            except binascii.Error:
                progress.error = "invalid base64 in an encoded word"
                break
        else:
            yield binascii.a2b_qp(text, header=True)
        pos = m.end()
        following = _GAP.match(data, pos).end()  # type: ignore[union-attr]  # matches anywhere
        if not WORD.match(data, following):
            break
        pos = following
    progress.consumed, progress.eof = pos, pos > 0 and not progress.error

"""UTF-16 text as a layer: a Windows log, a line written by a UTF-16 tool or a UTF-16 string in binary data, decoded
to UTF-8 so that what it holds is found as in any text (a base64 block or a hex run inside a UTF-16 log line). A
canary written in UTF-16 itself is one of the matcher's forms; the layer is for what the text encodes further.

`starts` finds runs of ASCII characters in UTF-16 (a NUL byte beside each), only in windows that hold a NUL byte;
`decode` reads every character of the text (any but a control character or a lone surrogate).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import stringzilla

from harness.detect.engine.progress import Progress

_PRINTABLE = frozenset(b"\t\n\r" + bytes(range(0x20, 0x7F)))
#: What ends the text: a control character (NUL included), a lone surrogate, a non-character.
_END = re.compile(r"[^\t\n\r\x20-\x7e\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
CODECS = {"utf16le": "utf-16-le", "utf16be": "utf-16-be"}


#: Each byte as 2 if NUL, 1 if an ASCII character (tab and line breaks too), else 0.
_MARKS = bytes(2 if c == 0 else 1 if c in _PRINTABLE else 0 for c in range(256))
#: A run of ASCII characters in UTF-16, as marks, from its first character.
_PAIRS = re.compile(rb"(?:\x01\x02)+\x01?")


def starts(window: bytes, min_bytes: int) -> list[tuple[int, str, int]]:
    """(first byte, codec, end of the run that shows it) of every run of `min_bytes` or more ASCII characters in
    UTF-16: little-endian from its first character, and big-endian from the NUL byte before it or, with none, after
    it (the bytes alone do not tell the two apart; the wrong one decodes to characters no canary holds).
    StringZilla's SIMD `translate` and `find` look for the runs, from a character (0.3 ms per 4 MiB of zeros or of
    random bytes; a probe from a NUL byte found a candidate everywhere in zeros, a regex took 2.5 ms)."""
    marks = stringzilla.translate(window, _MARKS)
    probe = b"\x01\x02" * max(min_bytes - 1, 1) + b"\x01"
    out = []
    pos = stringzilla.find(marks, probe)
    while pos >= 0:
        end = _PAIRS.match(marks, pos).end()  # type: ignore[union-attr]  # the probe matched there
        out.append((pos, "utf16le", end))
        out.append((pos - 1 if pos and marks[pos - 1] == 2 else pos + 1, "utf16be", end))
        pos = stringzilla.find(marks, probe, end)
    return out


def decode(codec: str, steps: Iterator[memoryview], progress: Progress) -> Iterator[bytes]:
    """The text from the first byte up to its first control character or lone surrogate, as UTF-8."""
    carry = b""  # an odd byte, or a high surrogate, cut by the step's end
    for step in steps:
        data = carry + bytes(step)
        whole = len(data) // 2 * 2
        text = data[:whole].decode(CODECS[codec], "surrogatepass")
        if text and "\ud800" <= text[-1] <= "\udbff":  # a high surrogate: its pair may be in the next step
            text, whole = text[:-1], whole - 2
        end = _END.search(text)
        if end is not None:
            good = text[: end.start()]
            yield good.encode("utf-8")
            progress.consumed += len(good.encode(CODECS[codec], "surrogatepass"))
            progress.eof = True
            return
        yield text.encode("utf-8")
        carry = data[whole:]
        progress.consumed += whole

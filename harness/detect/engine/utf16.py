"""UTF-16 text as a layer: a Windows log, a line written by a UTF-16 tool or a UTF-16 string in binary data, decoded
to UTF-8 so that what it holds is found as in any text (a base64 block or a hex run inside a UTF-16 log line). A
canary written in UTF-16 itself is one of the matcher's forms; the layer is for what the text encodes further.

`starts` finds runs of ASCII characters in UTF-16 (a NUL byte beside each), only in windows that hold a NUL byte;
`decode` reads every character of the text (any but a control character or a lone surrogate).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator

from harness.detect.engine.progress import Progress

_PRINTABLE = frozenset(b"\t\n\r" + bytes(range(0x20, 0x7F)))
#: What ends the text: a control character (NUL included), a lone surrogate, a non-character.
_END = re.compile(r"[^\t\n\r\x20-\x7e\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
CODECS = {"utf16le": "utf-16-le", "utf16be": "utf-16-be"}


@functools.lru_cache(maxsize=16)
def _pairs(count: int) -> re.Pattern[bytes]:
    """`count` or more ASCII characters of UTF-16BE: each a NUL byte, then the character (in UTF-16LE the same
    bytes, one later). A regex that starts with a literal byte: fast where NUL bytes are rare."""
    return re.compile(rb"(?:\x00[\t\n\r\x20-\x7e]){%d,}" % count)


def starts(window: bytes, min_bytes: int) -> list[tuple[int, str, int]]:
    """(first byte, codec, end of the run that shows it) of every run of `min_bytes` or more ASCII characters in
    UTF-16. A run is little-endian when the byte before its first pair is a character that no NUL precedes."""
    out = []
    for m in _pairs(max(min_bytes, 1)).finditer(window):
        at = m.start()
        if at >= 1 and window[at - 1] in _PRINTABLE and (at < 2 or window[at - 2] != 0):
            out.append((at - 1, "utf16le", m.end()))
        else:
            out.append((at, "utf16be", m.end()))
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

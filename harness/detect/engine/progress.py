"""What every streaming decoder shares: the pieces it reads and yields, what it did (`Progress`), and how a stream is
read again from an offset (`Reopen`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

#: Output bytes per yielded piece.
PIECE = 1 << 20
#: Input bytes per decoder call (a corrupt zlib stream keeps the output of the calls before the damage).
STEP = 1 << 16
Chunk = bytes | bytearray | memoryview
Reopen = Callable[[int], Iterator[bytes]]  # a stream's bytes again, from an offset


@dataclass
class Progress:
    """What a decoder did: input consumed, whether the stream ended properly, and why it stopped early."""

    consumed: int = 0
    eof: bool = False
    error: str = ""


def in_steps(chunks: Iterable[Chunk]) -> Iterator[memoryview]:
    for chunk in chunks:
        view = memoryview(chunk)
        for i in range(0, len(view), STEP):
            yield view[i : i + STEP]


def bytes_reopen(data: bytes | memoryview) -> Reopen:
    """The bytes of `data` again, from an offset (a buffer's `Reopen`)."""

    def again(offset: int) -> Iterator[bytes]:
        if offset < len(data):
            yield bytes(data[offset:])

    return again


def text_bytes(text: str) -> bytes:
    """Decoded text as bytes: characters below U+0100 as one byte each when all are (binary data written as text, as
    `\\u001f\\u008b` or `&#31;&#139;`), else UTF-8 (raw undecodable bytes as they were)."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        pass
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")

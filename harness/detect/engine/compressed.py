"""The compression decoders: gzip, zlib and raw deflate (zlib), xz and lzma, bz2, zstd and brotli, each a
generator over input steps (`progress.in_steps`) yielding pieces of at most `PIECE` bytes. The stdlib does the
decoding; zstd is `backports.zstd` (the stdlib's `compression.zstd` from Python 3.14) and brotli the
`brotli` package, both already mitmproxy dependencies.
"""

from __future__ import annotations

import bz2
import lzma
import sys
import zlib
from collections.abc import Iterator

import brotli

from harness.detect.engine.progress import PIECE, Progress

if sys.version_info >= (3, 14):  # pragma: no cover
    from compression import zstd
else:
    from backports import zstd

#: Memory a decoder may use for its window (xz and zstd let a stream ask for up to 4 GiB).
DECODER_MEMORY = 128 << 20
COMPRESSION = ("gzip", "zlib", "deflate", "xz", "lzma", "bz2", "zstd", "br")
#: What a decoder raises on a corrupt stream.
ERRORS = (zlib.error, lzma.LZMAError, OSError, EOFError, ValueError, zstd.ZstdError, brotli.error)


#: Codecs whose decoder, on an error in a stream's first bytes, yields nothing at all (no recovery).
_CHECKED = {"zlib": 15, "deflate": -15, "br": 0}
#: Bytes `plausible` decodes.
HEAD = 64


def plausible(codec: str, head: bytes | memoryview) -> bool:
    """False if the stream of `codec` that starts with `head` (its first HEAD bytes) certainly decodes to
    nothing: its decoder fails on them. Cheaper than `decode`, which would fail on them too (errors in these
    decoders are monotonic in the input); most zlib magic numbers and streams without one in binary data
    are chance."""
    wbits = _CHECKED.get(codec)
    try:
        if wbits is None:
            return True
        if wbits:
            zlib.decompressobj(wbits).decompress(head, 1 << 16)
        else:
            brotli.Decompressor().process(head, output_buffer_limit=1 << 16)
    except zlib.error:
        return False
    except brotli.error:  # unless a whole stream ends in the head, other bytes after it
        return _brotli_end(bytes(head)) is not None
    return True


def _decompressor(codec: str):  # type: ignore[no-untyped-def]
    if codec == "xz":
        return lzma.LZMADecompressor(lzma.FORMAT_XZ, memlimit=DECODER_MEMORY)
    if codec == "lzma":
        return lzma.LZMADecompressor(lzma.FORMAT_ALONE, memlimit=DECODER_MEMORY)
    if codec == "bz2":
        return bz2.BZ2Decompressor()
    if codec == "zstd":
        return zstd.ZstdDecompressor(options={zstd.DecompressionParameter.window_log_max: 27})
    raise ValueError(f"unknown codec {codec!r}")


def _stdlib(d, steps: Iterator[memoryview], progress: Progress) -> Iterator[bytes]:  # type: ignore[no-untyped-def]
    """lzma, bz2 and zstd decompressors (`decompress(data, max_length)`, `needs_input`, `eof`)."""
    for step in steps:
        out = d.decompress(step, PIECE)
        while True:
            if out:
                yield out
            if d.eof:
                progress.consumed += len(step) - len(d.unused_data)
                progress.eof = True
                _give_back(steps, d.unused_data)
                return
            if d.needs_input:
                break
            out = d.decompress(b"", PIECE)
        progress.consumed += len(step)


def _zlib(d: zlib._Decompress, steps: Iterator[memoryview], progress: Progress, *,
          recover: bool) -> Iterator[bytes]:
    """gzip, zlib and raw deflate. On an error, the longest prefix of the failing step that decodes
    cleanly is decoded (errors are monotonic in the input's length), so nothing before the damage is lost."""
    for step in steps:
        saved, emitted = d.copy() if recover else d, 0
        try:
            for out in _zlib_step(d, step):
                emitted += len(out)
                yield out
        except zlib.error:
            if not recover:
                raise
            good = _longest_good_prefix(saved, step)
            skip = emitted
            for out in _zlib_step(saved, step[:good]):
                if len(out) > skip:
                    yield out[skip:]
                skip = max(0, skip - len(out))
            raise
        if d.eof:
            progress.consumed += len(step) - len(d.unused_data)
            progress.eof = True
            _give_back(steps, d.unused_data)
            return
        progress.consumed += len(step)


def _zlib_step(d: zlib._Decompress, data: memoryview) -> Iterator[bytes]:
    out = d.decompress(data, PIECE)
    while True:
        if out:
            yield out
        if not d.unconsumed_tail or d.eof:
            return
        out = d.decompress(d.unconsumed_tail, PIECE)


def _longest_good_prefix(d: zlib._Decompress, data: memoryview) -> int:
    lo, hi = 0, len(data) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        try:
            c = d.copy()
            out = c.decompress(data[:mid], PIECE)
            while c.unconsumed_tail and not c.eof and out:
                out = c.decompress(c.unconsumed_tail, PIECE)
            lo = mid
        except zlib.error:
            hi = mid - 1
    return lo


#: Input of a brotli stream kept so that, when other bytes follow it, it can be decoded again up to its end (brotli's
#: decoder fails on them and keeps nothing of the step); a longer stream is not decoded again.
BROTLI_RETRY = 1 << 16
#: Output `_brotli_ok` decodes before it takes a prefix for good (a bomb is cut by the caller's limits later).
_BROTLI_PROBE = 4 << 20


def _brotli(steps: Iterator[memoryview], progress: Progress) -> Iterator[bytes]:
    """brotli. A stream followed by other bytes (a value padded after it, data appended to a file) is decoded again
    up to its end, found by bisection, when it is short (`BROTLI_RETRY`); the output already given is not repeated."""
    d = brotli.Decompressor()
    fed, emitted = bytearray(), 0
    for step in steps:
        if len(fed) <= BROTLI_RETRY:
            fed += step
        try:
            for out in _brotli_step(d, step):
                emitted += len(out)
                yield out
        except brotli.error:
            end = _brotli_end(bytes(fed)) if len(fed) <= BROTLI_RETRY else None
            if end is None:
                raise
            skip = emitted
            for out in _brotli_step(brotli.Decompressor(), memoryview(fed)[:end]):
                if len(out) > skip:
                    yield out[skip:]
                skip = max(0, skip - len(out))
            progress.consumed += end - (len(fed) - len(step))
            progress.eof = True
            return
        if d.is_finished():
            progress.consumed += len(step)  # brotli does not say how much of the last step it used
            progress.eof = True
            return
        progress.consumed += len(step)


def _brotli_step(d: brotli.Decompressor, data: bytes | memoryview) -> Iterator[bytes]:
    out = d.process(data, output_buffer_limit=PIECE)
    while True:
        if out:
            yield out
        if d.is_finished() or d.can_accept_more_data():
            return
        out = d.process(b"", output_buffer_limit=PIECE)


def _brotli_ok(data: bytes) -> bool:
    """Whether `data` decodes without an error (a prefix of a stream, or a whole one)."""
    d, produced = brotli.Decompressor(), 0
    try:
        for out in _brotli_step(d, data):
            produced += len(out)
            if produced > _BROTLI_PROBE:
                return True
    except brotli.error:
        return False
    return True


def _brotli_end(data: bytes) -> int | None:
    """Where the whole brotli stream `data` starts with ends, when other bytes follow it (None: no whole stream,
    or a damaged one). Decoding fails on every prefix longer than the stream and on none shorter."""
    lo, hi = 0, len(data) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _brotli_ok(data[:mid]):
            lo = mid
        else:
            hi = mid - 1
    d = brotli.Decompressor()
    try:
        for _ in _brotli_step(d, data[:lo]):
            if not lo:
                break
    except brotli.error:
        return None
    return lo if lo and d.is_finished() else None


def decode(codec: str, steps: Iterator[memoryview], progress: Progress) -> Iterator[bytes]:
    """The output of the compressed stream of `codec` (one of COMPRESSION) read from `steps`; for a format of
    `MEMBERS`, of every member that follows it back to back (`_members`)."""
    if codec in MEMBERS:
        yield from _members(codec, Pushback(steps), progress)
    else:
        yield from _one(codec, steps, progress)


def _one(codec: str, steps: Iterator[memoryview], progress: Progress) -> Iterator[bytes]:
    if codec in ("gzip", "zlib", "deflate"):
        # Only a gzip member (a checked header) gets the failing step's prefix back: a zlib or deflate start
        # found by its two magic bytes is mostly chance, and the search would cost more than it saves.
        wbits = {"gzip": 31, "zlib": 15, "deflate": -15}[codec]
        yield from _zlib(zlib.decompressobj(wbits), steps, progress, recover=codec == "gzip")
    elif codec == "br":
        yield from _brotli(steps, progress)
    else:
        yield from _stdlib(_decompressor(codec), steps, progress)


#: Formats whose files may hold several streams back to back, which their own tools decompress as one output
#: (`cat a.gz b.gz`, pigz and bgzip write gzip members, pbzip2 bz2 streams, pzstd zstd frames, `xz` streams with
#: their padding): the magic number each member starts with, and the NUL bytes allowed before it.
MEMBERS = {"gzip": (b"\x1f\x8b\x08", 0), "bz2": (b"BZh", 0), "xz": (b"\xfd7zXZ\x00", 1024),
           "zstd": (b"\x28\xb5\x2f\xfd", 0)}


class Pushback:
    """Input steps, with bytes a decoder read past its stream's end given back (`give_back`) to be read first."""

    def __init__(self, steps: Iterator[memoryview]) -> None:
        self._steps = steps
        self._back: list[memoryview] = []

    def __iter__(self) -> Pushback:
        return self

    def __next__(self) -> memoryview:
        return self._back.pop() if self._back else next(self._steps)

    def give_back(self, data: bytes | memoryview) -> None:
        if data:
            self._back.append(memoryview(data))

    def drop(self, size: int) -> None:
        """Read `size` bytes and forget them."""
        while size > 0 and (step := next(self, None)) is not None:
            self.give_back(step[size:])
            size -= len(step)

    def peek(self, size: int) -> bytes:
        """Up to `size` next bytes, left to be read again."""
        taken: list[memoryview] = []
        have = 0
        while have < size and (step := next(self, None)) is not None:
            taken.append(step)
            have += len(step)
        self._back += reversed(taken)
        return b"".join(bytes(t) for t in taken)[:size]


def _give_back(steps: Iterator[memoryview], data: bytes) -> None:
    if isinstance(steps, Pushback):
        steps.give_back(data)


def _members(codec: str, steps: Pushback, progress: Progress) -> Iterator[bytes]:
    """Every member of a `MEMBERS` format from the first on, as one output: a value cut by a member's end is whole
    again. A member whose decoding fails ends the output where its decodable prefix does; the members before it
    count as ended (`eof`)."""
    magic, padding = MEMBERS[codec]
    yield from _one(codec, steps, progress)
    while progress.eof and not progress.error:
        head = steps.peek(padding + len(magic))
        skip = len(head) - len(head.lstrip(b"\0"))
        skip -= skip % 4  # xz stream padding comes in multiples of four bytes
        if not head.startswith(magic, skip):
            return
        steps.drop(skip)
        member = Progress()
        try:
            yield from _one(codec, steps, member)
        except ERRORS:
            member.eof = False  # damaged, or a magic number by chance: the output ends where its prefix does
        progress.consumed += skip + member.consumed
        if not member.eof:
            return

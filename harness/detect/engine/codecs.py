"""Streaming decoders for every layer a canary can hide in: compression (gzip, zlib, raw deflate, xz, lzma,
bz2, zstd, brotli), HTTP chunked transfer-encoding, and the text encodings: base64 blocks (wrapped at any
column, with real or JSON-escaped line breaks), hex, percent-encoding (`url`) and JSON string escapes
(`json`); and the framings that cut or wrap a value, each decoded in its own module: markup character
references (`html`, `markup`), quoted-printable and encoded words (`qp`, `rfc2047`, `mail`), UTF-16 text
(`utf16le`, `utf16be`, `utf16`) and hex dumps (`hexdump`, `dumps`).

`decode(codec, chunks, progress)` is a generator: it pulls input chunks only as it needs them and yields
output pieces of at most `PIECE` bytes, so no stream, however large, and no bomb is ever held whole. The
caller decides how much output it reads. What happened is left in `progress`: the input consumed (where
the stream ended in its parent), whether the stream ended properly (`eof`), and why decoding stopped
early (`error`). Output decoded before an error is still yielded: a corrupt or truncated stream keeps its
decodable prefix. The stdlib does the decoding (zlib, lzma, bz2, binascii); zstd is `backports.zstd`
(the stdlib's `compression.zstd` from Python 3.14) and brotli the `brotli` package, both already
mitmproxy dependencies.
"""

from __future__ import annotations

import binascii
import functools
import json
import re
import struct
import urllib.parse
from collections.abc import Iterable, Iterator

from harness.detect.engine import compressed, dumps, mail, markup, utf16
from harness.detect.engine.compressed import COMPRESSION, HEAD, MEMBERS, plausible
from harness.detect.engine.progress import PIECE, Chunk, Progress, in_steps, text_bytes

#: Text encodings and framings: each decodes a run of its characters (a JSON string, a run of character references,
#: quoted-printable lines, encoded words, UTF-16 text, a hex dump's lines) to fewer bytes.
TEXT = ("base64", "hex", "url", "json", "html", "qp", "rfc2047", "utf16le", "utf16be", "hexdump")
#: Archive members: a tar member, a zip entry stored as it is.
ARCHIVE = ("tar", "zip")
CODECS = (*COMPRESSION, "chunked", *TEXT, *ARCHIVE)
#: The decoders whose output keeps every byte they do not decode (an escape, a chunk's size line, a member's
#: header): what starts inside their input also starts in their output.
KEEPING = frozenset({"chunked", "json", "url", *ARCHIVE})
#: The framings that join lines: what they decode goes on past where a layer that keeps what it does not decode
#: (a percent-encoded run, a JSON string) ends, so starting inside one does not make them its output's.
LINES = frozenset({"qp", "rfc2047", "hexdump"})
__all__ = ["CODECS", "COMPRESSION", "HEAD", "KEEPING", "LINES", "MEMBERS", "PIECE", "TEXT", "Chunk", "Progress",
           "decode", "plausible"]


def decode(codec: str, chunks: Iterable[Chunk], progress: Progress) -> Iterator[bytes]:
    """The decoded output of the stream of `codec` at the start of `chunks`, piece by piece."""
    pieces = in_steps(chunks)
    try:
        if codec in _TEXT_DECODERS:
            yield from _TEXT_DECODERS[codec](pieces, progress)
        elif codec in ARCHIVE:
            yield from _member(codec, pieces, progress)
        else:
            yield from compressed.decode(codec, pieces, progress)
    except compressed.ERRORS as exc:
        progress.error = f"{type(exc).__name__}: {exc}"


# -- base64 blocks ------------------------------------------------------------------------------------------

#: A base64 block: alphabet characters (standard and URL-safe) and line breaks, real (`\r`, `\n`) or
#: written as JSON escapes (`\n`, `\r\n`, and `\\n` ... inside a JSON string holding JSON).
B64_BLOCK = re.compile(rb"[A-Za-z0-9+/_\-\r\n]*(?:\\+[rn][A-Za-z0-9+/_\-\r\n]*)*")
_ESCAPED_BREAK = re.compile(rb"\\+[rn]")
_TO_STANDARD = bytes.maketrans(b"-_", b"+/")


def _base64(steps: Iterator[memoryview], progress: Progress) -> Iterator[bytes]:
    """Decode one base64 block from its first character to the first byte that is neither an alphabet
    character nor a line break (padding `=` ends it too)."""
    carry = b""  # characters of an incomplete group, or backslashes of an escape cut by the step's end
    for step in steps:
        data = carry + bytes(step)
        m = B64_BLOCK.match(data)
        end = m.end() if m else 0
        rest = data[end:]
        cut_escape = rest and not rest.strip(b"\\")  # only backslashes left: an escape continues next step
        body = data[:end]
        if b"\\" in body:
            body = _ESCAPED_BREAK.sub(b"", body)
        body = body.translate(_TO_STANDARD, b"\r\n")
        if end == len(data) or cut_escape:
            whole = len(body) // 4 * 4
            if whole:
                yield binascii.a2b_base64(body[:whole])
            carry = body[whole:] + (rest if cut_escape else b"")
            progress.consumed += len(step)
            continue
        progress.consumed += len(step) - len(rest)
        progress.eof = True
        yield from _last_group(body)
        return
    yield from _last_group(carry.rstrip(b"\\"))  # the input ended inside the block


def _last_group(body: bytes) -> Iterator[bytes]:
    """The bytes of a block's last characters (2 or 3 characters hold 1 or 2 bytes; 1 holds none)."""
    body = body[: len(body) - (len(body) % 4 == 1)]
    if body:
        yield binascii.a2b_base64(body + b"=" * (-len(body) % 4))


# -- chunked transfer-encoding ------------------------------------------------------------------------------

_CHUNK_SIZE = re.compile(rb"([0-9a-fA-F]{1,16})[ \t]*(?:;[^\r\n]*)?\r\n")
CHUNK_HEADER_LIMIT = 4096


def _chunked(steps: Iterator[memoryview], progress: Progress) -> Iterator[bytes]:
    """The payload of an HTTP/1.1 chunked body: size line, data, CRLF, ... up to the zero-size chunk."""
    buf = b""
    used = 0  # input consumed, up to the start of `buf`

    def need(n: int) -> bool:
        nonlocal buf
        while len(buf) < n:
            step = next(steps, None)
            if step is None:
                return False
            buf += bytes(step)
        return True

    while True:
        while b"\r\n" not in buf[:CHUNK_HEADER_LIMIT]:
            if len(buf) >= CHUNK_HEADER_LIMIT or not need(len(buf) + 1):
                progress.consumed = used
                return
        m = _CHUNK_SIZE.match(buf)
        if m is None:
            progress.consumed = used
            progress.error = "not a chunk-size line"
            return
        size = int(m.group(1), 16)
        buf = buf[m.end() :]
        used += m.end()
        if size == 0:
            progress.consumed, progress.eof = used, True
            return
        while size:
            if not buf and not need(1):
                progress.consumed = used
                return
            piece, buf = buf[:size], buf[size:]
            size -= len(piece)
            used += len(piece)
            yield piece
        if not need(2) or buf[:2] != b"\r\n":
            progress.consumed = used
            progress.error = "chunk not followed by CRLF"
            return
        buf = buf[2:]
        used += 2


# -- hex, percent-encoding, JSON strings --------------------------------------------------------------------

_HEX_RUN = re.compile(rb"[0-9a-fA-F]*")


def _hex(steps: Iterator[memoryview], progress: Progress) -> Iterator[bytes]:
    """Decode a run of hex digits (either case) up to the first other byte; an odd last digit holds no byte."""
    carry = b""
    for step in steps:
        data = carry + bytes(step)
        end = _HEX_RUN.match(data).end()  # type: ignore[union-attr]  # `*` matches anywhere
        whole = end // 2 * 2
        if whole:
            yield binascii.unhexlify(data[:whole])
        if end < len(data):
            progress.consumed += len(step) - (len(data) - end)
            progress.eof = True
            return
        carry = data[whole:]
        progress.consumed += len(step)


#: A percent-encoded run: escapes and the characters URL encoders leave as they are (`+` is a space).
URL_RUN = re.compile(rb"(?:%[0-9a-fA-F]{2}|[A-Za-z0-9._~!*'()+/\-])*")
_CUT_ESCAPE = re.compile(rb"%[0-9a-fA-F]?\Z")


def _url(steps: Iterator[memoryview], progress: Progress) -> Iterator[bytes]:
    """Decode a percent-encoded run up to the first byte that is neither an escape nor left as it is."""
    carry = b""  # an escape cut by the step's end
    for step in steps:
        data = carry + bytes(step)
        end = URL_RUN.match(data).end()  # type: ignore[union-attr]
        if end:
            yield urllib.parse.unquote_to_bytes(data[:end].replace(b"+", b" "))
        if end < len(data) and not _CUT_ESCAPE.match(data, end):
            progress.consumed += len(step) - (len(data) - end)
            progress.eof = True
            return
        carry = data[end:]
        progress.consumed += len(step)


_JSON = json.JSONDecoder(strict=False)


def _json(steps: Iterator[memoryview], progress: Progress) -> Iterator[bytes]:
    """Decode the rest of a JSON string (from just after its opening quote) up to its closing quote.

    An escape of a character below U+0100 gives one byte (binary data written as a JSON string:
    `\\u001f\\u008b`); a string that holds a character above it gives UTF-8 (`text_bytes`)."""
    carry = b""  # an escape cut by the step's end
    for step in steps:
        data = carry + bytes(step)
        end = closing_quote(data)
        body = data if end < 0 else data[:end]
        cut = len(body) if end >= 0 else _escape_cut(body)
        out, good = _unescape(body[:cut])
        if out:
            yield out
        if good < cut:
            progress.consumed += len(step) - (len(data) - good)
            progress.error = "invalid JSON escape"
            return
        if end >= 0:
            progress.consumed += len(step) - (len(data) - end)
            progress.eof = True
            return
        carry = body[cut:]
        progress.consumed += len(step)


def closing_quote(data: bytes, start: int = 0) -> int:
    """The index of the first quote from `start` that no backslash escapes, or -1."""
    quote = data.find(b'"', start)
    while quote >= 0:
        first = quote
        while first and data[first - 1] == 0x5C:
            first -= 1
        if (quote - first) % 2 == 0:
            return quote
        quote = data.find(b'"', quote + 1)
    return -1


def _escape_cut(body: bytes) -> int:
    """Where `body` ends, or where the escape it ends inside starts (a surrogate pair is one escape)."""
    last = body.rfind(b"\\", max(0, len(body) - 12))
    if last < 0:
        return len(body)
    first = last
    while first and body[first - 1] == 0x5C:
        first -= 1
    if (last - first) % 2:  # an even run of backslashes: the last one is escaped, every escape is whole
        return len(body)
    if body[last + 1 : last + 2] != b"u":
        return len(body) if last + 2 <= len(body) else last
    if body[last + 2 : last + 4].lower() in (b"d8", b"d9", b"da", b"db"):  # a high surrogate: its pair too
        return len(body) if last + 12 <= len(body) else last
    return len(body) if last + 6 <= len(body) else last


def _unescape(raw: bytes) -> tuple[bytes, int]:
    """The bytes of the JSON string content `raw`, and how many bytes of `raw` were decoded (all of it, or
    up to its first invalid escape)."""
    text = raw.decode("utf-8", "surrogateescape")
    try:
        return text_bytes(_JSON.decode(f'"{text}"')), len(raw)
    except json.JSONDecodeError as exc:
        good = text[: max(0, exc.pos - 1)]
        good_raw = good.encode("utf-8", "surrogateescape")
        try:
            return text_bytes(_JSON.decode(f'"{good}"')), len(good_raw)
        except json.JSONDecodeError:
            return b"", 0


# -- archive members ----------------------------------------------------------------------------------------

_TAR_SIZE = re.compile(rb" *([0-7]{1,11})[ \x00]")  # a tar header's size field: octal digits


def _member(codec: str, steps: Iterator[memoryview], progress: Progress) -> Iterator[bytes]:
    """The bytes of the archive member whose header starts the input: a tar member (a 512-byte header), or a
    zip entry stored as it is (its local header; the size in it, so not one written with a data descriptor)."""
    if codec == "tar":
        head = _fill(steps, b"", 512)
        size_field = _TAR_SIZE.match(head, 124)
        if len(head) < 512 or size_field is None:
            progress.error = "not a tar header"
            return
        skip, size = 512, int(size_field.group(1), 8)
    else:
        head = _fill(steps, b"", 30)
        if len(head) < 30:
            progress.error = "not a zip local header"
            return
        (size,) = struct.unpack_from("<I", head, 18)
        nlen, xlen = struct.unpack_from("<HH", head, 26)
        skip = 30 + nlen + xlen
    data, left = _fill(steps, head, skip)[skip:], size
    while left and data:
        for i in range(0, min(len(data), left), PIECE):
            yield data[i : min(i + PIECE, left)]
        left -= min(len(data), left)
        data = bytes(next(steps, b""))
    progress.consumed, progress.eof = skip + size - left, not left


def _fill(steps: Iterator[memoryview], buf: bytes, size: int) -> bytes:
    """`buf` and the next steps, to at least `size` bytes (or to the input's end)."""
    while len(buf) < size:
        step = next(steps, None)
        if step is None:
            break
        buf += bytes(step)
    return buf


_TEXT_DECODERS = {"base64": _base64, "chunked": _chunked, "hex": _hex, "url": _url, "json": _json,
                  "html": markup.decode, "qp": mail.quoted_printable, "rfc2047": mail.encoded_words,
                  "utf16le": functools.partial(utf16.decode, "utf16le"),
                  "utf16be": functools.partial(utf16.decode, "utf16be"), "hexdump": dumps.decode}

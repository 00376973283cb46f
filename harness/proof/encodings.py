"""Every encoding the scanning engine claims to see through (docs/architecture.md, "A decoder"), as a chain of
steps applied to a canary, innermost first: the matcher's own forms (JSON escapes, percent-encoding, base64 at
each alignment and twice, hex, UTF-16), the containers (every compression, wrapped base64, hex and percent runs,
JSON strings of escaped bytes, chunked bodies, tar and zip members), chains of them, and the framings that cut or
wrap a value (`FRAMINGS`, written by `harness.proof.framings`).

Each encoding is named as findings name theirs, outermost first (`base64/gzip`: gzip inside base64). Every step
is deterministic (no time stamp, no random byte), so a seed gives the same bytes."""

from __future__ import annotations

import base64
import bz2
import io
import itertools
import json
import lzma
import tarfile
import urllib.parse
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import brotli

from harness.proof import framings as F

try:  # the stdlib's from 3.14
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - before 3.14
    from backports import zstd  # type: ignore[no-redef]

Step = Callable[[bytes], bytes]


def _gzip(data: bytes) -> bytes:
    import gzip

    return gzip.compress(data, mtime=0)


def _deflate(data: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


def _tar(data: bytes) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("member_")
        info.size, info.mtime = len(data), 0
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _zip(method: int) -> Step:
    def step(data: bytes) -> bytes:
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", compression=method) as z:
            z.writestr(zipfile.ZipInfo("member_", date_time=(1980, 1, 1, 0, 0, 0)), data, compress_type=method)
        return out.getvalue()
    return step


def _b64(align: int) -> Step:
    """Base64 of the data after `align` bytes of context, so the data starts at each of the three alignments."""
    return lambda data: base64.b64encode(b"##"[:align] + data)


def _wrapped(width: int, brk: bytes) -> Step:
    """Base64 wrapped at `width` characters with the line break `brk` (LF, CRLF or a JSON `\\n`)."""
    def step(data: bytes) -> bytes:
        text = base64.b64encode(data)
        return brk.join(text[i:i + width] for i in range(0, len(text), width))
    return step


def _json_u(data: bytes) -> bytes:
    """Every character as a `\\uXXXX` escape, as a JSON encoder escaping everything writes it."""
    return "".join(f"\\u{ord(c):04x}" for c in data.decode("latin-1")).encode()


def _json_mixed(data: bytes) -> bytes:
    """Every other character escaped (`\\u002d`), and `/` as `\\/`."""
    text = data.decode("latin-1")
    return "".join(f"\\u{ord(c):04X}" if i % 2 else ("\\/" if c == "/" else c) for i, c in enumerate(text)).encode()


def _json_bytes(data: bytes) -> bytes:
    """A JSON string's content holding bytes (each byte a character, non-ASCII ones escaped `\\u00XX`)."""
    return json.dumps(data.decode("latin-1"))[1:-1].encode()


def _chunked(data: bytes) -> bytes:
    """A saved HTTP response whose chunked body is cut in three chunks (a canary split over two of them)."""
    cut = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    parts = [data[a:b] for a, b in itertools.pairwise(cut)]
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p) + b"0\r\n\r\n"
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks


#: What a mail's quoted-printable body says before the value: its first line (76 characters) ends inside it.
QP_TEXT = b"Hello, as promised here is the value you asked me to keep for later: "
#: The framings (`harness.proof.framings`): each cuts or wraps the value it carries.
FRAMING_STEPS: dict[str, Step] = {
    "records-ndjson": F.records("ndjson", 5), "records-sse": F.records("sse", 4), "records-jsonrpc": F.records(
        "jsonrpc", 6),
    "html-dec": F.references(False), "html-hex": F.references(True),
    "qp": lambda d: b"\r\n" + F.quoted_printable(76)(QP_TEXT + d), "rfc2047-b": F.encoded_words(9, "B"),
    "rfc2047-q": F.encoded_words(7, "Q", b" "), "base64-mime": lambda d: b"\r\n" + F.mime_base64(b"#" + d),
    "gzip-members": F.members("gzip", (333, 666)), "bz2-streams": F.members("bz2", (500,)),
    "xz-streams": F.members("xz", (500,)), "zstd-frames": F.members("zstd", (250, 500, 750)),
    "utf16le": F.utf16("le"), "utf16be": F.utf16("be"),
    "xxd": F.dump("xxd"), "hexdump-C": F.dump("hexdump -C"), "od-tx1": F.dump("od -An -tx1"), "xxd-p": F.dump("xxd -p"),
}
STEPS: dict[str, Step] = {
    "json": _json_u, "json-mixed": _json_mixed, "json-bytes": _json_bytes,
    "url": lambda d: "".join(f"%{b:02X}" for b in d).encode(),
    "url-lower": lambda d: urllib.parse.quote(d, safe="").lower().encode(),
    "base64": _b64(0), "base64+1": _b64(1), "base64+2": _b64(2),
    "base64url": lambda d: base64.urlsafe_b64encode(b"?" + d).rstrip(b"="),
    "base64-lf76": _wrapped(76, b"\n"), "base64-crlf64": _wrapped(64, b"\r\n"), "base64-jsonn20": _wrapped(20, b"\\n"),
    "hex": lambda d: d.hex().encode(), "HEX": lambda d: d.hex().upper().encode(),
    "utf16le": lambda d: d.decode("latin-1").encode("utf-16-le"),
    "utf16be": lambda d: d.decode("latin-1").encode("utf-16-be"),
    "gzip": _gzip, "zlib": zlib.compress, "deflate": _deflate, "xz": lzma.compress,
    "lzma": lambda d: lzma.compress(d, format=lzma.FORMAT_ALONE), "bz2": bz2.compress,
    "zstd": lambda d: zstd.compress(d), "br": brotli.compress,
    "tar": _tar, "zip": _zip(zipfile.ZIP_STORED), "zip-deflate": _zip(zipfile.ZIP_DEFLATED), "chunked": _chunked,
    **FRAMING_STEPS,
}
#: Formats the engine tries only at the start of a stream (no magic number): in an HTTP body, only as its
#: Content-Encoding (the value to send); in a file, a log or a database value, as the whole of it.
HEADERLESS = {"deflate": "deflate", "br": "br", "lzma": "lzma"}


def at_start(encoding: str) -> bool:
    """Whether the encoding's outer format is recognised only where a stream starts."""
    steps = BY_NAME[encoding].steps
    return bool(steps) and steps[-1] in HEADERLESS


@dataclass(frozen=True)
class Encoding:
    """A chain of steps, innermost first, named outermost first."""

    name: str
    steps: tuple[str, ...]

    def apply(self, data: bytes) -> bytes:
        for step in self.steps:
            data = STEPS[step](data)
        return data


def _enc(name: str, *steps: str) -> Encoding:
    return Encoding(name, steps)


ENCODINGS: tuple[Encoding, ...] = (
    _enc("plain"), _enc("json", "json"), _enc("json-mixed", "json-mixed"), _enc("url", "url"),
    _enc("url-lower", "url-lower"), _enc("base64", "base64"), _enc("base64+1", "base64+1"),
    _enc("base64+2", "base64+2"), _enc("base64url", "base64url"), _enc("base64/base64", "base64", "base64+1"),
    _enc("hex", "hex"), _enc("HEX", "HEX"), _enc("utf16le", "utf16le"), _enc("utf16be", "utf16be"),
    _enc("gzip", "gzip"), _enc("zlib", "zlib"), _enc("deflate", "deflate"), _enc("xz", "xz"), _enc("lzma", "lzma"),
    _enc("bz2", "bz2"), _enc("zstd", "zstd"), _enc("br", "br"), _enc("tar", "tar"), _enc("zip", "zip"),
    _enc("zip-deflate", "zip-deflate"), _enc("chunked", "chunked"),
    _enc("base64/gzip", "gzip", "base64"), _enc("base64-lf/gzip", "gzip", "base64-lf76"),
    _enc("base64-crlf/zlib", "zlib", "base64-crlf64"), _enc("base64-jsonn/bz2", "bz2", "base64-jsonn20"),
    _enc("gzip/base64", "base64+1", "gzip"), _enc("url/base64/br", "br", "base64", "url"),
    _enc("hex/zlib", "zlib", "hex"), _enc("url/gzip", "gzip", "url"), _enc("json/gzip", "gzip", "json-bytes"),
    _enc("gzip/gzip", "gzip", "gzip"), _enc("gzip/tar", "tar", "gzip"), _enc("zip/base64", "base64+2", "zip"),
    _enc("xz/hex", "hex", "xz"), _enc("base64/zstd", "zstd", "base64+2"),
    *(_enc(name, name) for name in FRAMING_STEPS if not name.startswith("utf16")),
    _enc("utf16le/base64", "base64+1", "utf16le"), _enc("utf16be/hex", "hex", "utf16be"),
)
#: The framings (docs/detection.md, "Framings"), each scored on its own too: what it is.
FRAMINGS: dict[str, str] = {
    "records-ndjson": "a streaming provider's NDJSON chunks, 5 characters of the value each",
    "records-sse": "SSE events of a stream, 4 characters each",
    "records-jsonrpc": "JSON-RPC notifications of a backend's log, 6 characters each",
    "html-dec": "every character a decimal character reference (`&#109;`)",
    "html-hex": "every character a hex character reference (`&#x6d;`)",
    "qp": "a quoted-printable mail body (76 columns), its first soft line break in the value",
    "rfc2047-b": "RFC 2047 encoded words (base64) of 9 bytes, on folded header lines",
    "rfc2047-q": "RFC 2047 encoded words (quoted-printable) of 7 bytes",
    "base64-mime": "a MIME body's base64, 76 columns, CRLF",
    "gzip-members": "three gzip members back to back, the value cut by both ends",
    "bz2-streams": "two bz2 streams back to back", "xz-streams": "two xz streams, padded",
    "zstd-frames": "four zstd frames back to back",
    "utf16le/base64": "base64 in a UTF-16LE line", "utf16be/hex": "hex in a UTF-16BE line",
    "xxd": "`xxd`'s dump", "hexdump-C": "`hexdump -C`'s dump", "od-tx1": "`od -An -tx1`'s dump",
    "xxd-p": "`xxd -p`'s dump (hex lines of 60)",
}
#: Framings whose text structure (lines, runs, words) is looked for in text: a deleted row's bytes in a database's
#: raw pages carry none (`channels`: sqlite.freed).
TEXT_FRAMINGS = frozenset(FRAMINGS) - {"base64-mime", "gzip-members", "bz2-streams", "xz-streams", "zstd-frames"}
BY_NAME = {e.name: e for e in ENCODINGS}

"""The framings that cut or wrap a value, as steps the scorecard (`encodings`) and the tests apply to bytes: each
writes its input as a tool, a provider or a mail client does, deterministically (no time stamp, no random byte).

Line-delimited records (a streaming provider's NDJSON chunks, SSE events, a log of JSON-RPC frames: the text over
the records' string fields), markup character references, quoted-printable with soft line breaks, RFC 2047 encoded
words, a MIME body's base64 at 76 columns, compressed members back to back, UTF-16 text and hex dumps as `xxd`,
`hexdump` and `od` print them. A framing whose output is lines starts on a line of its own.
"""

from __future__ import annotations

import base64
import bz2
import gzip
import itertools
import json
import lzma
import string
from collections.abc import Callable

try:  # the stdlib's from 3.14
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - before 3.14
    from backports import zstd  # type: ignore[no-redef]

Step = Callable[[bytes], bytes]


def pieces(data: bytes, size: int) -> list[bytes]:
    """`data` in pieces of `size` bytes (the last shorter)."""
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


# -- line-delimited records ---------------------------------------------------------------------------------

#: A record holding a piece of text, by style: an NDJSON chunk of a streaming provider (Ollama's chat), an SSE
#: event of an OpenAI stream, an Anthropic stream's delta event, a JSON-RPC notification in a backend's log.
RECORDS: dict[str, Callable[[str, int], str]] = {
    "ndjson": lambda text, i: json.dumps({"model": "m", "created_at": f"2026-01-01T00:00:{i % 60:02d}Z",
                                          "message": {"role": "assistant", "content": text}, "done": False}),
    "sse": lambda text, i: "data: " + json.dumps({"id": "c1", "choices": [{"index": 0, "delta": {"content": text}}]})
    + "\n",
    "anthropic": lambda text, i: "event: content_block_delta\ndata: " + json.dumps(
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}) + "\n",
    "jsonrpc": lambda text, i: json.dumps({"t": i / 10, "dir": "out", "frame": {
        "jsonrpc": "2.0", "method": "message.delta", "params": {"session_id": "s1", "text": text}}}),
}


def records(style: str, size: int) -> Step:
    """The text (UTF-8) in records of `style`, `size` characters each, one per line, after a line break."""
    def step(data: bytes) -> bytes:
        text = data.decode("utf-8", "surrogateescape")
        lines = [RECORDS[style](text[i : i + size], n) for n, i in enumerate(range(0, len(text), size))]
        return ("\n" + "\n".join(lines) + "\n").encode("utf-8", "surrogateescape")
    return step


# -- markup, mail -------------------------------------------------------------------------------------------

def references(hexadecimal: bool) -> Step:
    """Every byte as a numeric character reference (`&#109;` or `&#x6d;`)."""
    return lambda data: "".join(f"&#x{b:x};" if hexadecimal else f"&#{b};" for b in data).encode()


_QP_SAFE = frozenset((string.ascii_letters + string.digits + " !\"#$%&'()*+,-./:;<>?@[\\]^_`{|}~").encode())


def quoted_printable(width: int, brk: bytes = b"\r\n") -> Step:
    """Quoted-printable (RFC 2045) with soft line breaks (`=` and `brk`) every `width` characters or fewer, an
    escape never cut; every byte but the safe ones (printable ASCII but `=`) escaped."""
    def step(data: bytes) -> bytes:
        out, line = [], b""
        for b in data:
            char = bytes([b]) if b in _QP_SAFE else b"=%02X" % b
            if len(line) + len(char) > width - 1:
                out.append(line + b"=")
                line = b""
            line += char
        return brk.join([*out, line])
    return step


#: What an encoded word of kind Q writes as it is (RFC 2047, 5(3)), and a space as `_`.
_Q = {**{b: bytes([b]) for b in (string.ascii_letters + string.digits + "!*+-/").encode()}, 0x20: b"_"}


def encoded_words(size: int, kind: str = "B", fold: bytes = b"\r\n ") -> Step:
    """RFC 2047 encoded words of `size` bytes each (`B`: base64, `Q`: quoted-printable with `_` for a space), one
    after another with `fold` between them (a folded header line)."""
    def word(piece: bytes) -> bytes:
        if kind == "B":
            return b"=?utf-8?B?" + base64.b64encode(piece) + b"?="
        return b"=?utf-8?Q?" + b"".join(_Q.get(b, b"=%02X" % b) for b in piece) + b"?="
    return lambda data: fold.join(word(p) for p in pieces(data, size))


def mime_base64(data: bytes) -> bytes:
    """A MIME body's base64: lines of 76 characters, CRLF (RFC 2045)."""
    return b"\r\n".join(pieces(base64.b64encode(data), 76))


# -- compressed members, UTF-16 -----------------------------------------------------------------------------

_COMPRESS: dict[str, Step] = {"gzip": lambda d: gzip.compress(d, mtime=0), "bz2": bz2.compress,
                              "xz": lzma.compress, "zstd": lambda d: zstd.compress(d)}


def members(codec: str, cuts: tuple[int, ...]) -> Step:
    """The data cut at `cuts` (fractions of 1000 of its length), each part a member of its own, back to back (as
    pigz, pbzip2, pzstd or `cat a.xz b.xz` write them; xz streams padded to four bytes, as xz pads them)."""
    def step(data: bytes) -> bytes:
        at = [0, *(len(data) * c // 1000 for c in cuts), len(data)]
        parts = [_COMPRESS[codec](data[a:b]) for a, b in itertools.pairwise(at)]
        pad = b"\0\0\0\0" if codec == "xz" else b""
        return pad.join(parts)
    return step


def utf16(order: str) -> Step:
    """Text (UTF-8) as UTF-16 of that byte order, as a Windows tool writes a log line."""
    return lambda data: data.decode("utf-8", "surrogateescape").encode(f"utf-16-{order}", "surrogatepass")


# -- hex dumps ----------------------------------------------------------------------------------------------

def _ascii(chunk: bytes) -> str:
    return "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in chunk)


def _words(chunk: bytes) -> list[str]:
    """Little-endian 16-bit words, as `od -x` and `hexdump` print them (an odd last byte padded with zero)."""
    padded = chunk + b"\0" * (len(chunk) % 2)
    return [f"{padded[i + 1]:02x}{padded[i]:02x}" for i in range(0, len(padded), 2)]


def _xxd(data: bytes) -> list[str]:
    out = []
    for off in range(0, len(data), 16):
        chunk = data[off : off + 16]
        groups = " ".join(chunk[i : i + 2].hex() for i in range(0, len(chunk), 2))
        out.append(f"{off:08x}: {groups:<39}  {_ascii(chunk)}")
    return out


def _hexdump_c(data: bytes) -> list[str]:
    out = []
    for off in range(0, len(data), 16):
        chunk = data[off : off + 16]
        left, right = " ".join(f"{b:02x}" for b in chunk[:8]), " ".join(f"{b:02x}" for b in chunk[8:])
        out.append(f"{off:08x}  {left:<23}  {right:<23}  |{_ascii(chunk)}|")
    return [*out, f"{len(data):08x}"]


def _od_tx1(data: bytes) -> list[str]:
    return ["".join(f" {b:02x}" for b in data[off : off + 16]) for off in range(0, len(data), 16)]


def _od_x(data: bytes) -> list[str]:
    out = [f"{off:07o} " + " ".join(_words(data[off : off + 16])) for off in range(0, len(data), 16)]
    return [*out, f"{len(data):07o}"]


def _hexdump(data: bytes) -> list[str]:
    out = [f"{off:07x} " + f"{' '.join(_words(data[off : off + 16])):<39}" for off in range(0, len(data), 16)]
    return [*out, f"{len(data):07x}"]


def _xxd_p(data: bytes) -> list[str]:
    return [data[off : off + 30].hex() for off in range(0, len(data), 30)]


#: Each tool's dump of some bytes, line by line (its default width: 16 bytes a line; `xxd -p` 30).
DUMPS: dict[str, Callable[[bytes], list[str]]] = {"xxd": _xxd, "hexdump -C": _hexdump_c, "od -An -tx1": _od_tx1,
                                                  "od -x": _od_x, "hexdump": _hexdump, "xxd -p": _xxd_p}


def dump(tool: str) -> Step:
    """The bytes as `tool` dumps them, after a line break."""
    return lambda data: ("\n" + "\n".join(DUMPS[tool](data)) + "\n").encode()

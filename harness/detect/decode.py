"""Decoding what an HTTP message carries: content-encodings (bounded, by the same streaming decoders the
file scanner uses, `harness.detect.engine.codecs`), JSON, SSE streams reassembled, and the header values the
detectors need (first values, the presented credential).

Whatever cannot be decoded or parsed is left as the raw bytes it is (and said so in `Body.note`), so no
body can crash an inspection or hide from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from harness.detect.engine import codecs, records

MAX_BODY = 16 * 1024 * 1024
#: How deep the SSE walk follows nested JSON; deeper strings are still in the raw body's scan.
MAX_SSE_DEPTH = records.MAX_DEPTH
#: Headers that carry a provider credential (OpenAI `Authorization: Bearer`, Azure/Anthropic style keys).
KEY_HEADERS = ("authorization", "api-key", "x-api-key")
Headers = Sequence[tuple[str, str]]


@dataclass(frozen=True)
class Body:
    """A body as inspected: the decoded bytes (or the raw ones) and what happened on the way."""

    data: bytes
    encoding: str | None = None  # the content-encoding that was undone, e.g. "gzip"
    note: str = ""  # "", "undecodable", "truncated", "too large", "too large to decode"

    @property
    def partial(self) -> bool:
        """Whether part of what the body carries was not inspected (its decoded form was cut, or it was too
        large to decode): a secret may be in what was not read."""
        return self.note in ("truncated", "too large to decode")


#: HTTP content-codings and the codec that undoes each (`deflate` is tried as zlib, then as raw deflate).
CONTENT_CODECS = {"gzip": "gzip", "x-gzip": "gzip", "br": "br", "zstd": "zstd", "xz": "xz", "x-xz": "xz",
                  "lzma": "lzma", "bzip2": "bz2", "x-bzip2": "bz2", "bz2": "bz2"}


def _inflate(data: bytes, enc: str) -> bytes:
    """Undo one content-encoding, returning at most MAX_BODY + 1 bytes (bombs stay small)."""
    if enc == "deflate":
        try:
            return _decode_all("zlib", data)
        except ValueError:
            return _decode_all("deflate", data)
    if enc not in CONTENT_CODECS:
        raise ValueError(f"unknown content-encoding {enc!r}")
    return _decode_all(CONTENT_CODECS[enc], data)


def _decode_all(codec: str, data: bytes) -> bytes:
    progress = codecs.Progress()
    out = bytearray()
    for piece in codecs.decode(codec, (data,), progress):
        out += piece
        if len(out) > MAX_BODY:
            return bytes(out[: MAX_BODY + 1])
    if progress.error or not (out or progress.eof):
        raise ValueError(f"{codec}: {progress.error or 'no stream'}")
    return bytes(out)


def decode_body(raw: bytes | None, content_encoding: str = "", transfer_encoding: str = "") -> Body:
    """Decode `raw` from `content_encoding` (a header value, possibly a list); never raises. A body saved with
    its chunked framing (`transfer_encoding` names `chunked` and the bytes are chunks up to the last one) is
    unframed first: a canary split over two chunks is whole again."""
    raw = raw or b""
    encodings = [e.strip().lower() for e in content_encoding.split(",") if e.strip()]
    encodings = [e for e in encodings if e != "identity"]
    unframed = _unframe(raw) if "chunked" in transfer_encoding.lower() else None
    layers = encodings if unframed is None else ["chunked", *encodings]  # the outermost first, as in the headers
    raw = raw if unframed is None else unframed
    if len(raw) > MAX_BODY:
        return Body(raw, None, "too large to decode" if layers else "too large")
    if not layers or not raw:
        return Body(raw)
    data = raw
    try:
        for enc in reversed(encodings):
            data = _inflate(data, enc)
            if len(data) > MAX_BODY:
                return Body(data[:MAX_BODY], "+".join(layers), "truncated")
    except ValueError:
        return Body(raw, None if unframed is None else "chunked", "undecodable")
    return Body(data, "+".join(layers))


def _unframe(raw: bytes) -> bytes | None:
    """The payload of a body kept with its chunked framing, or None when it is not chunks up to the last one
    (mitmproxy keeps the header of a body it has unframed already) or too large to unframe."""
    if not raw or len(raw) > MAX_BODY:
        return None
    try:
        return _decode_all("chunked", raw)
    except ValueError:
        return None


#: A JSON document, or None (orjson where it can, json where orjson refuses: `records.loads`).
loads = records.loads


def parse_json(body: Body) -> Any:
    """The JSON document in a fully decoded body, or None."""
    if body.note or body.data.lstrip()[:1] not in (b"{", b"["):
        return None
    return loads(body.data)


def first_values(headers: Headers) -> dict[str, str]:
    """Every header's first value, by its lower-case name."""
    first: dict[str, str] = {}
    for name, value in headers:
        first.setdefault(name.lower(), value)
    return first


#: Authorization schemes whose credential is the rest of the value (`Bot` is Discord's).
AUTH_SCHEMES = ("bearer ", "bot ", "token ")


def bearer_of(first: dict[str, str]) -> str | None:
    """The credential a request presents (`first`: its `first_values`): `Authorization: Bearer X` (or `Bot X`,
    `Token X`), or an api-key style header."""
    for name in KEY_HEADERS:
        value = first.get(name, "").strip()
        if value:
            scheme = next((s for s in AUTH_SCHEMES if value.lower().startswith(s)), "")
            return value[len(scheme):].strip()
    return None


#: The content types of a body of line-delimited records (a streaming provider's NDJSON, JSON lines, JSON text
#: sequences), besides SSE's.
NDJSON_TYPES = ("application/x-ndjson", "application/ndjson", "application/jsonl", "application/x-jsonlines",
                "application/json-seq", "application/stream+json")


def stream_kind(content_type: str) -> str | None:
    """`sse` for an SSE body, `ndjson` for one of line-delimited records (`NDJSON_TYPES`), else None."""
    content_type = content_type.lower()
    if "text/event-stream" in content_type:
        return "sse"
    return "ndjson" if any(t in content_type for t in NDJSON_TYPES) else None


def reassembled(data: bytes, kind: str) -> dict[str, str]:
    """Reassemble a streamed body (`kind`: `stream_kind`'s): every string at the same JSON path across its events
    (SSE's `data:` lines) or records (every line), concatenated (`records.streams`, as the engine reassembles
    line-delimited records anywhere, around the places a value may be cut: here, all of them).

    A streamed completion splits text and tool-call arguments over many events, so a canary can be cut
    in two on the wire; it is whole again in the reassembled stream (schema-free: OpenAI, Anthropic, Ollama).
    """
    streams = records.streams(data.splitlines(), sse=kind == "sse")
    return {path: "".join(parts) for path, parts in streams.items() if len(parts) > 1}


def json_streams(docs: Iterable[Any]) -> dict[str, str]:
    """Every string at the same JSON path across `docs` (parsed JSON documents, in order; a top-level string is at
    the path ""), concatenated: the paths seen in more than one document. A websocket's JSON messages are
    reassembled so, as a streamed body's records are (`reassembled`)."""
    streams: dict[str, list[str]] = {}
    for doc in docs:
        if type(doc) is str:
            streams.setdefault("", []).append(doc)
        elif type(doc) is dict or type(doc) is list:
            records.collect(doc, "", streams, MAX_SSE_DEPTH)
    return {path: "".join(parts) for path, parts in streams.items() if len(parts) > 1}


def sse_streams(data: bytes) -> dict[str, str]:
    """An SSE body reassembled (`reassembled`)."""
    return reassembled(data, "sse")


#: `text` as the bytes it came from (`records.utf8`).
utf8_bytes = records.utf8

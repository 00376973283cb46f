"""What a scan reports: each canary found (`ScanHit`), what it could not read (`NotInspected`), and the
bounds it reads within (`Limits`).

Reporting scheme (`ScanHit`):
- `container` is None for the raw bytes, else the layers joined by `/`: `gzip`, `zlib`, `deflate`, `xz`,
  `lzma`, `bz2`, `zstd`, `br`, `chunked`, `base64`, `hex`, `url` (percent-encoding), `json` (a JSON string's
  escapes), the framings `html`, `qp`, `rfc2047`, `utf16le`, `utf16be`, `hexdump` and `records:<JSON path>` (the
  text records spread over that path), `sqlite:<table>.<column>#<rowid>`, e.g.
  `sqlite:messages.content#3/gzip` for a gzip blob in a cell, `base64/gzip` for a gzip in a base64 block.
- `offset` is the canary's byte offset inside the innermost layer (decoded bytes, or the cell value as
  UTF-8 / blob bytes); `layers` also records where each layer starts in its parent (None for a cell).
- `encoding` is the matcher's encoding prefixed by every decoded layer, a trailing `plain` dropped:
  `plain`, `base64`, `gzip` (plain text in a gzip stream), `gzip/base64`, `base64/gzip`, `zlib/utf16le`; a
  layer's name without what follows its `:` (`records/base64`).
  SQLite is a container, not an encoding: a plain canary in a cell has encoding `plain`.
- `location(label)`: `path@OFFSET` for the raw bytes, `path@AT:gzip@OFFSET` in a stream that starts at AT,
  `path:sqlite:messages.content#3@OFFSET` in a cell.
- A text layer or chunked body is also scanned as raw bytes; a canary its raw bytes already show (an
  unwrapped base64 form, a hex form) is reported there, once, not again in the decoded layer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from harness.detect.engine.matcher import Hit, Matcher

#: Characters of evidence on either side of a hit.
SNIPPET_WIDTH = 48
Layer = tuple[str, int | None]  # (name, where it starts in its parent; None for a SQLite cell)


@dataclass(frozen=True)
class Limits:
    """What the scanner reads at most. Each limit it reaches is reported (`NotInspected`), never silent."""

    stream_bytes: int = 256 << 20  # decoded bytes read from one compressed stream
    total_bytes: int = 1 << 30  # decoded bytes read from all the compressed streams of one file
    depth: int = 4  # layers inside layers: a gzip in a base64 block in a SQLite cell ...
    seconds: float = 300.0  # decoding layers of one file (or buffer); its raw bytes are always read to the end


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class NotInspected:
    """A file, or a layer of one, that was not read to its end: where, why, how many bytes were read, and
    whether part of it went unread (`partial`: a secret could be there, so the audit is inconclusive)."""

    path: str
    reason: str
    bytes_read: int = 0
    partial: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "reason": self.reason, "bytes_read": self.bytes_read, "partial": self.partial}

    def summary(self) -> str:
        return f"{self.path}: {self.reason} ({self.bytes_read} bytes read)"


class Snippet:
    """The redacted text around a hit (`Matcher.snippet`), made the first time it is asked for: most hits are
    never reported (another tenant's in a tenant's own home, a decoded layer's that its raw bytes show)."""

    __slots__ = ("_context", "_hit", "_matcher", "_text")

    def __init__(self, matcher: Matcher, window: bytes, hit: Hit) -> None:
        reach = SNIPPET_WIDTH + matcher.longest  # all that `Matcher.snippet` reads around the hit
        lo = max(0, hit.start - reach)
        self._matcher, self._context = matcher, bytes(window[lo : hit.end + reach])
        self._hit = replace(hit, start=hit.start - lo, end=hit.end - lo)
        self._text: str | None = None

    @property
    def following(self) -> bytes:
        """The bytes after the hit that it keeps (`SNIPPET_WIDTH` and the longest pattern, at most)."""
        return self._context[self._hit.end :]

    def __str__(self) -> str:
        if self._text is None:
            self._text = self._matcher.snippet(self._context, self._hit, SNIPPET_WIDTH)
        return self._text


@dataclass(frozen=True)
class ScanHit:
    """One canary occurrence, with the containers it was found in."""

    hit: Hit
    layers: tuple[Layer, ...] = ()
    snippet: Snippet | None = field(default=None, compare=False, repr=False)

    @property
    def evidence(self) -> str:
        return "" if self.snippet is None else str(self.snippet)

    @property
    def tenant(self) -> str:
        return self.hit.tenant

    @property
    def kind(self) -> str:
        return self.hit.kind

    @property
    def offset(self) -> int:
        return self.hit.start

    @property
    def container(self) -> str | None:
        return "/".join(name for name, _ in self.layers) or None

    @property
    def encoding(self) -> str:
        codecs_ = [name.partition(":")[0] for name, at in self.layers if at is not None]
        if self.hit.encoding != "plain" or not codecs_:
            codecs_.append(self.hit.encoding)
        return "/".join(codecs_)

    def location(self, label: str) -> str:
        return label + where(self.layers) + f"@{self.offset}"


def where(layers: Iterable[Layer]) -> str:
    return "".join(f"@{at}:{name}" if at is not None else f":{name}" for name, at in layers)

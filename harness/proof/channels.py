"""The channels the scorecard seeds: every kind of evidence an audit reads, where a case is put in it, and which
findings count as seeing it.

Flow channels go through a live mitmdump with the addon (`traffic.py`) and are judged from its ledger; the same
flows are judged again from `flows.mitm` by `reconcile` (`saved-flows`). The others are files of an evidence
folder (`folder.py`), judged by `reconcile` as `tenancy-audit reconcile` judges a run's folder."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from harness.proof.encodings import TEXT_FRAMINGS, at_start

LIVE, RECONCILE = "live", "reconcile"
#: The decoys every channel gets (`cases.decoy_value`).
DECOYS = ("prefix", "suffix", "truncated", "flipped", "retagged", "stranger", "own", "hash", "random")
REQUEST = frozenset({"request_leak", "wrong_identity", "wrong_key"})
RESPONSE = frozenset({"response_leak"})
FILE = frozenset({"file_leak"})
TEXT = frozenset({"text_leak"})
ENV = frozenset({"env_leak", "wrong_path"})


def anything(_: bytes) -> bool:
    return True


def printable(data: bytes) -> bool:
    """ASCII without control characters: what a header value, an env line or a file name can hold."""
    return bool(data) and all(0x20 <= b < 0x7F for b in data) and data.strip() == data


def ascii_text(data: bytes) -> bool:
    """ASCII (what a JSON string of an SSE event carries unchanged)."""
    return data.isascii()


_URL_SAFE = re.compile(rb"[A-Za-z0-9._~%/+-]+")


def url_safe(data: bytes) -> bool:
    return _URL_SAFE.fullmatch(data) is not None


def name_safe(data: bytes) -> bool:
    """A file name: printable, no `/`, not `.` or `..`, at most 255 bytes."""
    return printable(data) and b"/" not in data and data not in (b".", b"..") and len(data) <= 255


@dataclass(frozen=True)
class Channel:
    """A place a case goes: `reader` judges it (the live addon or `reconcile`), `kinds` are the finding kinds that
    see a positive, `fits` whether an encoded value can be put there at all."""

    name: str
    reader: str
    kinds: frozenset[str]
    what: str
    fits: Callable[[bytes], bool] = anything
    secrets_only: bool = False
    decoys: tuple[str, ...] = DECOYS
    carries: Callable[[str], bool] = lambda _: True  # which encodings (by name) it carries at all


CHANNELS: tuple[Channel, ...] = (
    Channel("provider.body", LIVE, REQUEST, "a provider request's body (JSON, or raw with its content-encoding)"),
    Channel("provider.headers", LIVE, REQUEST, "a provider request's header", printable),
    Channel("provider.path", LIVE, REQUEST, "a provider request's query string", url_safe),
    Channel("response.body", LIVE, RESPONSE, "a provider response's body"),
    Channel("response.sse", LIVE, RESPONSE, "an SSE response, the value split over three deltas", ascii_text),
    Channel("response.ndjson", LIVE, RESPONSE, "an NDJSON streaming response, the value split over three chunks",
            ascii_text),
    Channel("service.mcp", LIVE, REQUEST, "a request to the tenant's MCP server"),
    Channel("service.memory", LIVE, REQUEST, "a request to the tenant's mem0 memory provider"),
    Channel("service.web", LIVE, REQUEST, "a request to the tenant's web search API"),
    Channel("service.aux", LIVE, REQUEST, "a request to the tenant's auxiliary model"),
    Channel("env", RECONCILE, ENV, "a tool subprocess's env snapshot (the probe's output in a tool result)",
            printable),
    Channel("file", RECONCILE, FILE, "a file in the tenant's home"),
    Channel("file.name", RECONCILE, FILE, "a file's name in the tenant's home", name_safe),
    Channel("sqlite", RECONCILE, FILE, "a SQLite database's row"),
    Channel("sqlite.freed", RECONCILE, FILE, "a SQLite database's deleted row (a free page or freeblock)",
            carries=lambda e: not at_start(e) and e not in TEXT_FRAMINGS),
    Channel("sqlite.overflow", RECONCILE, FILE, "a SQLite row long enough to spill onto overflow pages"),
    Channel("sqlite.wal", RECONCILE, FILE, "a SQLite row still in the WAL (its frames not checkpointed)"),
    Channel("versions", RECONCILE, FILE, "a kept version of a home file, rewritten clean by the end"),
    Channel("log", RECONCILE, TEXT, "a log of the tenant's own"),
    Channel("log.shared", RECONCILE, TEXT, "a log every tenant shares (only secrets count)", secrets_only=True,
            decoys=(*(d for d in DECOYS if d != "own"), "public")),
    Channel("rpc.stdio", RECONCILE, TEXT, "a JSON-RPC frame of the stdio backend (tui)"),
    Channel("rpc.websocket", RECONCILE, TEXT, "a JSON-RPC frame of the websocket backend (serve)"),
)
#: The flow channels' cases judged again from the saved flow file (not seeded on their own).
SAVED = Channel("saved-flows", RECONCILE, REQUEST | RESPONSE, "the flow channels, judged from flows.mitm")
BY_NAME = {c.name: c for c in (*CHANNELS, SAVED)}
FLOW_CHANNELS = (*(c.name for c in CHANNELS if c.reader == LIVE), "env")

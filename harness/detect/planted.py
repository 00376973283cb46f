"""The paths the audit's own probe put in a tenant's replies, and the home hits they explain.

The `messaging` phase's scripted model ends a tenant's replies with `MEDIA:` lines naming files in its neighbour's
home, relative to the shared HOME (`~/.hermes/profiles/NAME/...`), so the reply carries no canary. Hermes resolves
such a path and may write it down in the asking tenant's own files (F31.patch's `Skipping unsafe MEDIA directive
path: /.../profiles/NAME/tenancy-media.txt` in its `logs/agent.log`): the neighbour's `home` is then in the tenant's
own log, but only as the path its own reply named. That is the probe's plant, not a crossing. Read from the evidence
alone: the reply text of every response on the tenant's provider route (`reply_paths`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from mitmproxy import http

from harness.core.registry import Registry
from harness.detect.decode import loads, reassembled, stream_kind
from harness.detect.engine import records

#: What a planted path is: (the tenant whose home it is in, the rest of the path after that home: `/FILE`).
Planted = frozenset[tuple[str, str]]

#: A `MEDIA:` line naming a path relative to HOME (Hermes' directive; an absolute path would carry the canary).
_MEDIA = re.compile(r"^\s*MEDIA:\s*(~/\S+)\s*$", re.MULTILINE)
#: A byte that may go on in a path: what follows a planted path must not be one.
_PATH_BYTE = re.compile(rb"[\w.~/+-]")


def media_paths(text: str) -> set[str]:
    """The `~/...` paths of a reply's `MEDIA:` lines."""
    return set(_MEDIA.findall(text))


def reply_paths(flow: http.HTTPFlow) -> set[str]:
    """The `MEDIA:` paths in the text of a provider's response (streamed or not, in any schema: every string of
    it, a stream's reassembled at each JSON path)."""
    if flow.response is None:
        return set()
    data = flow.response.get_content(strict=False) or b""
    kind = stream_kind(flow.response.headers.get("content-type", ""))
    if kind is not None:
        texts = list(reassembled(data, kind).values())
    else:
        doc, streams = loads(data), {}
        if isinstance(doc, dict | list):
            records.collect(doc, "", streams, records.MAX_DEPTH)
        texts = [s for parts in streams.values() for s in parts]
    return {p for text in texts if "MEDIA:" in text for p in media_paths(text)}


def resolve(named: Iterable[str], registry: Registry) -> Planted:
    """Each `~/...` path as (tenant, rest): the tenant whose home (a path under HOME) the path goes on from, and
    what follows it there (`/FILE`). A home is known by its end (`/.hermes/profiles/NAME`): the relative form the
    probe names it by."""
    out = set()
    for path in named:
        rel = path.removeprefix("~")
        cuts = [i for i, c in enumerate(rel) if c == "/" and i > 0]
        for t in registry:
            out |= {(t.name, rel[i:]) for i in cuts if t.home and t.home.rstrip("/").endswith(rel[:i])}
    return frozenset(out)


def names_planted(tenant: str, following: bytes, planted: Planted) -> bool:
    """Whether a `home` of `tenant` followed by `following` is a planted path, whole (nothing path-like after it)."""
    for owner, rest in planted:
        tail = following[len(rest.encode()):]
        if owner == tenant and following.startswith(rest.encode()) and not _PATH_BYTE.match(tail[:1]):
            return True
    return False

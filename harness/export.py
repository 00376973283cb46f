"""Redacted exports of saved flows: HAR 1.2 for browsers' devtools and HAR viewers, and a redacted .mitm.

Every canary of every tenant (in any encoding the matcher knows) becomes `<tenant:kind>`; credential
headers keep only that label (or become `<redacted>`). Fail closed: a body that cannot be decoded, or
that still holds a canary after redaction (inside a container, or split across SSE events), is withheld.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mitmproxy import http
from mitmproxy import io as mio
from mitmproxy.addons.savehar import SaveHar

from harness import scan
from harness.inspect import decode_body, sse_streams
from harness.matcher import Matcher
from harness.registry import write_private

CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "api-key", "x-api-key", "cookie",
                                "set-cookie"})
_LABELLED = re.compile(r"(?:[A-Za-z]+ )?<[a-z][a-z0-9_-]*:[a-z][a-z0-9_]*>")


def _credential(value: str, matcher: Matcher) -> str:
    red = matcher.redact_text(value)
    return red if _LABELLED.fullmatch(red) else "<redacted>"


def _headers(headers: http.Headers, matcher: Matcher) -> None:
    for name in list(dict.fromkeys(headers.keys())):
        values = headers.get_all(name)
        if name.lower() in CREDENTIAL_HEADERS:
            headers.set_all(name, [_credential(v, matcher) for v in values])
        else:
            headers.set_all(name, [matcher.redact_text(v) for v in values])


def redact_body(raw: bytes, content_encoding: str, matcher: Matcher, *, sse: bool) -> bytes:
    """The decoded body with every canary replaced, or a placeholder when that cannot be guaranteed."""
    body = decode_body(raw, content_encoding)
    if body.note:
        return f"<body withheld: {body.note}, {len(raw)} bytes>".encode()
    red = matcher.redact(body.data)
    if scan.scan_bytes(red, matcher):
        return f"<body withheld: a canary survives redaction inside a container, {len(raw)} bytes>".encode()
    if sse and any(matcher.find(text.encode()) for text in sse_streams(red).values()):
        streams = {path: matcher.redact_text(text) for path, text in sse_streams(red).items()}
        return b"data: " + json.dumps({"tenancy_redacted_sse": streams}).encode() + b"\n\n"
    return red


def _message(msg: http.Message, matcher: Matcher) -> None:
    encoding = msg.headers.get("content-encoding", "")
    sse = "event-stream" in msg.headers.get("content-type", "")
    _headers(msg.headers, matcher)
    if msg.raw_content is None:
        return
    red = redact_body(msg.raw_content, encoding, matcher, sse=sse)
    msg.headers.pop("content-encoding", None)
    msg.content = red
    if "content-length" in msg.headers:
        msg.headers["content-length"] = str(len(red))


def _redact_json(value: Any, matcher: Matcher) -> Any:
    return json.loads(matcher.redact_text(json.dumps(value)))


def redact_flow(flow: http.HTTPFlow, matcher: Matcher) -> http.HTTPFlow:
    """A redacted copy of `flow` that keeps its id, marker, comment and (redacted) metadata."""
    out = http.HTTPFlow.from_state(flow.get_state())
    out.request.path = matcher.redact_text(out.request.path)
    _message(out.request, matcher)
    if out.response is not None:
        _message(out.response, matcher)
    if out.websocket is not None:
        for m in out.websocket.messages:
            m.content = matcher.redact(m.content)
    out.comment = matcher.redact_text(out.comment)
    out.metadata = _redact_json(out.metadata, matcher)
    return out


def har(flows: Iterable[http.HTTPFlow], matcher: Matcher) -> dict[str, Any]:
    """HAR 1.2 of the redacted flows; each entry names its flow id, the addon's comment and metadata."""
    redacted = [redact_flow(f, matcher) for f in flows]
    doc = SaveHar().make_har(redacted)
    doc["log"]["creator"] = {"name": "tenancy-audit", "version": doc["log"]["creator"]["version"],
                             "comment": "built with mitmproxy's HAR exporter; every canary redacted"}
    for entry, f in zip(doc["log"]["entries"], redacted, strict=True):
        entry["_flowId"] = f.id
        if f.comment:
            entry["comment"] = f.comment
        if "tenancy" in f.metadata:
            entry["_tenancy"] = f.metadata["tenancy"]
    return doc


def write_har(path: Path, flows: Iterable[http.HTTPFlow], matcher: Matcher) -> int:
    """Write the HAR (0600); returns the number of entries."""
    doc = har(flows, matcher)
    write_private(path, json.dumps(doc, indent=1).encode())
    return len(doc["log"]["entries"])


def write_flows(path: Path, flows: Iterable[http.HTTPFlow], matcher: Matcher) -> int:
    """Write a redacted flow file (0600) that mitmweb/mitmdump `-r` and `tenancy-audit reconcile` read."""
    buf = io.BytesIO()
    writer = mio.FlowWriter(buf)
    n = 0
    for f in flows:
        writer.add(redact_flow(f, matcher))
        n += 1
    write_private(path, buf.getvalue())
    return n

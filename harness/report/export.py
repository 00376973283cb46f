"""Redacted exports of saved flows to share: HAR 1.2 (devtools, HAR viewers) and a .mitm flow file.

Unlike `run --redact` (secrets only, so the copy re-verifies), every canary of every tenant (in any
encoding the matcher knows) becomes `<tenant:kind>`; credential headers keep only that label (or become
`<redacted>`). Fail closed: a body that may still hold a canary after redaction (inside a container, or
split across SSE events) is withheld.
"""

from __future__ import annotations

import io
import json
import re
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mitmproxy import http
from mitmproxy import io as mio

from harness.core.files import write_private
from harness.core.protocol import PLACEHOLDER_PATTERN
from harness.detect.decode import sse_streams
from harness.detect.engine import stream
from harness.detect.engine.matcher import Matcher
from harness.report import redact

CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "api-key", "x-api-key", "cookie",
                                "set-cookie"})
_LABELLED = re.compile(f"(?:[A-Za-z]+ )?{PLACEHOLDER_PATTERN}")


def _credential(value: str, matcher: Matcher) -> str:
    red = matcher.redact_text(value)
    return red if _LABELLED.fullmatch(red) else "<redacted>"


def _credentials(headers: http.Headers, matcher: Matcher) -> None:
    for name in list(dict.fromkeys(headers.keys())):
        if name.lower() in CREDENTIAL_HEADERS:
            headers.set_all(name, [_credential(v, matcher) for v in headers.get_all(name)])


def _withheld(msg: http.Message, matcher: Matcher) -> str | None:
    """Why a redacted body may still hold a canary (in a container, or split across SSE events), if it may."""
    raw = msg.raw_content or b""
    if stream.scan_bytes(raw, matcher):
        return "a canary survives redaction inside a container"
    if "event-stream" in msg.headers.get("content-type", "") and any(
            matcher.find(text.encode("utf-8", "surrogatepass")) for text in sse_streams(raw).values()):
        return "a canary is split across SSE events"
    return None


def redact_for_sharing(flow: http.HTTPFlow, matcher: Matcher) -> http.HTTPFlow:
    """`harness.report.redact.redact_flow` (bodies decoded, every string of the flow's state redacted), then fail
    closed: credential headers keep only a tenant label, and a body that may still hold a canary is withheld."""
    out = redact.redact_flow(flow, matcher)
    for msg in (out.request, out.response):
        if msg is None:
            continue
        _credentials(msg.headers, matcher)
        if reason := _withheld(msg, matcher):
            msg.headers.pop("content-encoding", None)
            msg.content = f"<body withheld: {reason}, {len(msg.raw_content or b'')} bytes>".encode()
    return out


def har(flows: Iterable[http.HTTPFlow], matcher: Matcher) -> dict[str, Any]:
    """HAR 1.2 of the redacted flows; each entry names its flow id, the addon's comment and metadata."""
    with warnings.catch_warnings():  # mitmproxy.addons imports ldap3, which warns about pyasn1's old names
        warnings.simplefilter("ignore", DeprecationWarning)
        from mitmproxy.addons.savehar import SaveHar
    redacted = [redact_for_sharing(f, matcher) for f in flows]
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
        writer.add(redact_for_sharing(f, matcher))
        n += 1
    write_private(path, buf.getvalue())
    return n

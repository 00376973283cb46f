"""A redacted copy of an evidence folder: every secret canary replaced by `<tenant:kind>`.

`redacted/` holds the flows, ledger, stub log, reports and logs with every secret (any encoding the
matcher knows) replaced, plus a registry whose secrets are those same placeholders: `tenancy-audit
reconcile` re-verifies the copy on its own, and `tenancy-audit scan` with the real registry finds no
secret in it. The tenant homes (which hold the secrets by design) are not copied.
"""

from __future__ import annotations

import io as stdio
from pathlib import Path
from typing import Any

from mitmproxy import http, io

from harness.core.files import FLOWS, REGISTRY, write_private
from harness.core.protocol import placeholder
from harness.core.registry import Registry, Tenant
from harness.detect.engine.matcher import Matcher
from harness.detect.reconcile import read_flows

REDACTED = "redacted"
SKIP = frozenset({REDACTED, "sandbox"})


def redacted_registry(registry: Registry) -> Registry:
    """The same tenants with every secret replaced by its placeholder (and no home: it is not copied)."""
    tenants = {}
    for t in registry:
        secret = t.secrets()
        tenants[t.name] = Tenant(
            t.name, placeholder(t.name, "key") if "key" in secret else t.key, t.model, dict(t.route), t.upstream,
            None, {k: placeholder(t.name, k) if k in secret else v for k, v in t.canaries.items()},
            derived=dict(t.derived),
        )
    return Registry(tenants)


def _walk(value: Any, matcher: Matcher) -> Any:
    if isinstance(value, bytes):
        return matcher.redact(value)
    if isinstance(value, str):
        return matcher.redact_text(value)
    if isinstance(value, dict):
        return {_walk(k, matcher): _walk(v, matcher) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_walk(v, matcher) for v in value)
    return value


def redact_flow(flow: http.HTTPFlow, matcher: Matcher) -> http.HTTPFlow:
    """Bodies decoded first (a secret inside gzip would survive otherwise), then every str/bytes of the
    flow's state (URL, headers, bodies, comment, metadata) redacted."""
    for message in (flow.request, flow.response):
        if message is not None and message.headers.get("content-encoding"):
            message.decode(strict=False)
    return http.HTTPFlow.from_state(_walk(flow.get_state(), matcher))


def write_redacted(out: Path, registry: Registry) -> Path:
    """Write `out/redacted/` from the evidence in `out`; returns that folder."""
    matcher = Matcher.for_registry(registry, secrets_only=True)
    dest = out / REDACTED
    flows, _ = read_flows(out / FLOWS, empty_ok=True)
    buf = stdio.BytesIO()
    writer = io.FlowWriter(buf)
    for flow in flows:
        writer.add(redact_flow(flow, matcher))
    write_private(dest / FLOWS, buf.getvalue())
    redacted_registry(registry).save(dest / REGISTRY)
    for path in sorted(out.rglob("*")):
        rel = path.relative_to(out)
        if rel.parts[0] in SKIP or str(rel) in (FLOWS, REGISTRY):
            continue
        if path.is_symlink() or not path.is_file():
            continue
        write_private(dest / rel, matcher.redact(path.read_bytes()))
    return dest

"""The "Tenancy" content view: a body as the tenancy addon sees it, safe to show and to screenshot.

Every canary (in any encoding the matcher knows) is replaced by `<tenant:kind>`; one that is not the flow's
tenant's own, the leak, is marked `>>>LEAK <tenant:kind><<<`. A first line names the flow's tenant and how
many foreign canaries the body holds. mitmproxy picks this view by itself for a flagged flow's bodies; for
any other body, choose "Tenancy" in the view menu.
"""

from __future__ import annotations

from collections.abc import Callable

from mitmproxy.contentviews import Contentview, Metadata

from harness.core.protocol import placeholder
from harness.detect.engine.matcher import Matcher


class TenancyContentview(Contentview):
    """Registered by the addon (`contentviews.add`); `matcher` gives the loaded registry's matcher, if any."""

    def __init__(self, matcher: Callable[[], Matcher | None]) -> None:
        self._matcher = matcher

    @property
    def name(self) -> str:
        return "Tenancy"

    def prettify(self, data: bytes, metadata: Metadata) -> str:
        matcher = self._matcher()
        if matcher is None:
            raise ValueError("no tenancy registry is loaded (--set tenancy_registry=...)")
        tenant = _meta(metadata).get("tenant")
        out, pos, foreign = bytearray(), 0, 0
        for hit in matcher.find(data):
            if hit.start < pos:  # another form of a canary already replaced
                pos = max(pos, hit.end)
                continue
            label = placeholder(hit.tenant, hit.kind)
            if hit.tenant != tenant:
                label, foreign = f">>>LEAK {label}<<<", foreign + 1
            out += data[pos : hit.start] + label.encode()
            pos = hit.end
        out += data[pos:]
        head = (f"tenancy: {tenant or 'no tenant'}'s flow; {foreign} foreign canary(ies) marked >>>LEAK "
                "<tenant:kind><<<; every canary redacted")
        return head + "\n\n" + out.decode("utf-8", "replace")

    def render_priority(self, data: bytes, metadata: Metadata) -> float:
        """First choice for a flagged flow's non-empty bodies (above JSON's 1); never chosen by itself otherwise."""
        return 2.0 if data and _meta(metadata).get("flagged") and self._matcher() is not None else -1.0


def _meta(metadata: Metadata) -> dict:
    meta = metadata.flow.metadata.get("tenancy") if metadata.flow is not None else None
    return meta if isinstance(meta, dict) else {}

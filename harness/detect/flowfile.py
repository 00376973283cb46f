"""A saved flow file (`flows.mitm`) read back: its complete HTTP flows, and every other flow (a raw TCP
connection) apart, as the live addon saw them."""

from __future__ import annotations

from pathlib import Path

from mitmproxy import http, io
from mitmproxy.exceptions import FlowReadException
from mitmproxy.flow import Flow

from harness.core.record import EvidenceError


def read_flows(path: Path, *, empty_ok: bool = False, others: list[Flow] | None = None
               ) -> tuple[list[http.HTTPFlow], str | None]:
    """All complete HTTP flows of a flow file, and why reading stopped early (None if it did not); `others`, if
    given, receives every other flow (a raw TCP stream, ...). An empty file is an error unless `empty_ok` (a live
    run whose proxy recorded nothing: a reason)."""
    try:
        fh = path.open("rb")
    except OSError as exc:
        if empty_ok and isinstance(exc, FileNotFoundError):
            return [], f"flows: {path} was never written (the proxy recorded nothing)"
        raise EvidenceError(f"flows: cannot read {path}: {exc.strerror}") from None
    flows: list[http.HTTPFlow] = []
    with fh:
        if not path.stat().st_size:
            if empty_ok:
                return flows, f"flows: {path} is empty (no flow was recorded)"
            raise EvidenceError(f"flows: {path} is empty (no flow was recorded)")
        try:
            for flow in io.FlowReader(fh).stream():
                if isinstance(flow, http.HTTPFlow):
                    flows.append(flow)
                elif others is not None:
                    others.append(flow)
        except FlowReadException as exc:
            if not flows:
                raise EvidenceError(f"flows: {path} is not a readable mitmproxy flow file ({exc})") from None
            return flows, f"flows: {path} is truncated after {len(flows)} complete flows"
        except (ValueError, KeyError, TypeError) as exc:
            raise EvidenceError(f"flows: {path} is not a mitmproxy flow file ({type(exc).__name__})") from None
    return flows, None

"""Plain mitmdump's fair SSE baseline: stream `text/event-stream` responses as the tenancy addon does."""

from mitmproxy import http


def responseheaders(flow: http.HTTPFlow) -> None:
    if flow.response and "text/event-stream" in flow.response.headers.get("content-type", "").lower():
        flow.response.stream = True

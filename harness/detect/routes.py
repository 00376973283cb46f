"""Whose a flow is: how it reached the proxy (`Route`) and the tenant and service that route belongs to
(`Endpoint`). The addon's routing part decides a flow's endpoint once and hands it on to the inspection; the
reconciler resolves it again from the saved flow (`route_of`, `endpoint_of`), with the same result.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from mitmproxy import http
from mitmproxy.net.http import url
from mitmproxy.proxy.mode_specs import ReverseMode

from harness.core.registry import PROVIDER, Registry, Tenant


@dataclass(frozen=True)
class Route:
    """How a flow reached the proxy: a reverse listener's port, or a forward request's host."""

    topology: str  # "reverse" or "forward"
    listen_port: int | None = None
    host: str | None = None

    def __str__(self) -> str:
        return f"listen:{self.listen_port}" if self.topology == "reverse" else f"host:{self.host}"


@dataclass(frozen=True)
class Endpoint:
    """A flow's route and what it belongs to: the tenant (None when no tenant's) and which of its services."""

    route: Route
    tenant: Tenant | None
    service: str = PROVIDER


def endpoint_of(registry: Registry, route: Route) -> Endpoint:
    """The tenant and service `route` belongs to in `registry`."""
    if route.listen_port is not None:
        found = registry.endpoint(listen_port=route.listen_port)
    else:
        found = registry.endpoint(host=route.host) if route.host else None
    return Endpoint(route, *found) if found else Endpoint(route, None)


def route_of(flow: http.HTTPFlow) -> Route:
    """Reverse listeners name the tenant by port (kept in saved flows); anything else goes by host."""
    mode = flow.client_conn.proxy_mode
    if isinstance(mode, ReverseMode):
        port = mode.custom_listen_port
        if port is None and flow.client_conn.sockname:
            port = flow.client_conn.sockname[1]
        return Route("reverse", listen_port=port)
    return Route("forward", host=pretty_host(flow.request).lower().rstrip("."))


def pretty_host(request: http.Request) -> str:
    """`request.pretty_host`, remembered for each Host header: parsing one costs as much as parsing a
    256 KiB body's JSON does in a busy proxy, and a proxy sees the same few hosts over and over."""
    return _pretty_host(request.host_header, request.host)


@functools.lru_cache(maxsize=1024)
def _pretty_host(host_header: str | None, host: str) -> str:
    return url.parse_authority(host_header, check=False)[0] if host_header else host

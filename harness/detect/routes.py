"""Whose a flow is: how it reached the proxy (`Route`) and the tenant and service that route belongs to
(`Endpoint`). The addon's routing part decides a flow's endpoint once and hands it on to the inspection; the
reconciler resolves it again from the saved flow (`route_of`, `endpoint_of`, `claimed`), with the same result.

A host every tenant of a service shares (a platform's API host fixed in its SDK: registry route `{host: H, by:
...}`) is told apart by the credential a request carries (`claimed`): the tenant whose canary of a kind the route
names appears first in the request's headers, else its path, else its body. A request that carries none is no
tenant's; it goes to the `fallback` tenant's stub (the first that routes the host), which answers it with an error.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, replace

from mitmproxy import http
from mitmproxy.flow import Flow
from mitmproxy.net.http import url
from mitmproxy.proxy.mode_specs import ReverseMode

from harness.core.protocol import FLOW_HEADER
from harness.core.registry import PROVIDER, Registry, Tenant
from harness.detect.decode import Headers, decode_body, first_values
from harness.detect.engine.matcher import Matcher

#: The hosts of a loopback URL: a forward request to one names a reverse listener of the proxy by its port.
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
#: How much of a request's (decoded) body is searched for the credential that claims a shared host.
CLAIM_BYTES = 64 * 1024


@dataclass(frozen=True)
class Route:
    """How a flow reached the proxy: a reverse listener's port, or a forward request's host (and, for a loopback URL
    sent through the proxy, the port of the reverse listener it names)."""

    topology: str  # "reverse" or "forward"
    listen_port: int | None = None
    host: str | None = None

    def __str__(self) -> str:
        return f"listen:{self.listen_port}" if self.listen_port is not None else f"host:{self.host}"


@dataclass(frozen=True)
class Endpoint:
    """A flow's route and what it belongs to: the tenant (None when no tenant's) and which of its services. On a
    shared host, `fallback` is the tenant whose stub answers a request no tenant's credential claims."""

    route: Route
    tenant: Tenant | None
    service: str = PROVIDER
    fallback: Tenant | None = None

    @property
    def owned(self) -> bool:
        """Whether the route is the audit's (a tenant's, or a host the tenants share), not egress."""
        return self.tenant is not None or self.fallback is not None

    @property
    def upstream(self) -> str:
        """Where the proxy sends the flow: its tenant's stub of the service, else the fallback's ("": none)."""
        target = self.tenant or self.fallback
        return target.upstream_of(self.service) if target is not None else ""


def endpoint_of(registry: Registry, route: Route) -> Endpoint:
    """The tenant and service `route` belongs to in `registry`; on a shared host, not yet `claimed`."""
    if route.listen_port is not None:
        found = registry.endpoint(listen_port=route.listen_port)
    else:
        found = registry.endpoint(host=route.host) if route.host else None
    if found:
        return Endpoint(route, *found)
    shared = registry.sharing(route.host) if route.host else []
    return Endpoint(route, None, shared[0][1], fallback=shared[0][0]) if shared else Endpoint(route, None)


def claimed(registry: Registry, matcher: Matcher, endpoint: Endpoint, path: str, headers: Headers,
            body: bytes | None) -> Endpoint:
    """The endpoint of a request to a shared host: the tenant whose credential (a canary of a kind its route
    names, in any encoding the matcher knows) the request carries first, looking in its headers, then its path
    and query, then the first `CLAIM_BYTES` of its decoded body. Any other endpoint is returned as it is."""
    if endpoint.fallback is None or endpoint.route.host is None:
        return endpoint
    claims = {(t.name, kind): t for t, _, kinds in registry.sharing(endpoint.route.host) for kind in kinds}
    for part in _claim_parts(path, headers, body):
        hit = next((h for h in matcher.find(part) if (h.tenant, h.kind) in claims), None)
        if hit is not None:
            return replace(endpoint, tenant=claims[hit.tenant, hit.kind])
    return endpoint


def _claim_parts(path: str, headers: Headers, body: bytes | None) -> Iterator[bytes]:
    """Where a request carries its credential, in the order `claimed` looks."""
    yield "\n".join(value for name, value in headers if name.lower() != FLOW_HEADER).encode("utf-8", "surrogateescape")
    yield path.encode("utf-8", "surrogateescape")
    if body:
        first = first_values(headers)
        decoded = decode_body(body, first.get("content-encoding", ""), first.get("transfer-encoding", ""))
        yield decoded.data[:CLAIM_BYTES]


def flow_endpoint(registry: Registry, matcher: Matcher, flow: http.HTTPFlow) -> Endpoint:
    """Whose a flow is, from the flow alone (its route, and on a shared host the credential its request carries)."""
    req = flow.request
    return claimed(registry, matcher, endpoint_of(registry, route_of(flow)), req.path,
                   list(req.headers.items(multi=True)), req.raw_content)


def route_of(flow: Flow) -> Route:
    """Reverse listeners name the tenant by port (kept in saved flows); anything else goes by host (a raw TCP
    connection's: the address it was going to)."""
    mode = flow.client_conn.proxy_mode
    if isinstance(mode, ReverseMode):
        port = mode.custom_listen_port
        if port is None and flow.client_conn.sockname:
            port = flow.client_conn.sockname[1]
        return Route("reverse", listen_port=port)
    if not isinstance(flow, http.HTTPFlow):
        address = flow.server_conn.address
        return Route("forward", host=str(address[0]).lower().rstrip(".") if address else None)
    host = pretty_host(flow.request).lower().rstrip(".")
    if host in LOOPBACK:  # a client that sends a loopback URL through the proxy too (Telegram's adapter, whose proxy
        return Route("forward", listen_port=addressed_port(flow.request), host=host)  # skips NO_PROXY)
    return Route("forward", host=host)


def addressed_port(request: http.Request) -> int:
    """The port a forward request was addressed to: its Host header's (kept when the request is routed on to a stub,
    so a saved flow still names it), else its own."""
    if request.host_header:
        port = url.parse_authority(request.host_header, check=False)[1]
        if port:
            return port
    return request.port


def pretty_host(request: http.Request) -> str:
    """`request.pretty_host`, remembered for each Host header: parsing one costs as much as parsing a
    256 KiB body's JSON does in a busy proxy, and a proxy sees the same few hosts over and over."""
    return _pretty_host(request.host_header, request.host)


@functools.lru_cache(maxsize=1024)
def _pretty_host(host_header: str | None, host: str) -> str:
    return url.parse_authority(host_header, check=False)[0] if host_header else host

"""The routing part of the tenancy addon: the registry in force, whose each flow is (its `Endpoint`, decided once
and handed on to the inspection), each forward-mode request sent to its tenant's upstream, egress to a host no
tenant owns flagged or blocked, and every request stamped with its flow id.

It runs before `Inspection` in every hook (`harness.capture.addon.Tenancy` composes the two), so the registry
is current and the request is routed when the inspection sees it. See docs/addon.md.
"""

from __future__ import annotations

import ipaddress
import logging
import urllib.parse
from pathlib import Path
from typing import Any

from mitmproxy import ctx, exceptions, http, tcp
from mitmproxy.net.http import url as mitmproxy_url
from mitmproxy.proxy.server_hooks import ServerConnectionHookData

from harness.capture.watched import RegistryFile
from harness.core import registry
from harness.core.protocol import FLOW_HEADER, REFUSED_CONNECTION
from harness.detect import routes
from harness.detect.routes import Endpoint

log = logging.getLogger("tenancy")
EGRESS_CHOICES = ("flag", "block")


class Routing:
    """Owns the options `tenancy_registry` (loaded into `tenants`, which `Inspection` reads too) and
    `tenancy_egress`. `script` is True for the instance `addons/tenancy.py` gives `mitmdump -s`: a bad
    `tenancy_registry` at startup is then one error line (mitmproxy exits on it) instead of the traceback
    mitmproxy prints for any exception a script raises; later `--set`s are rejected with OptionsError.

    Each flow's endpoint is resolved once, in its first hook, and kept until the flow is finished (`release`)."""

    def __init__(self, tenants: RegistryFile, *, script: bool = False) -> None:
        self.tenants = tenants
        self.script = script
        self._running = False
        self._foreign_ports: set[int] = set()  # reverse listeners of no tenant, warned about once each
        #: The endpoint of every flow in flight, with the registry it was resolved in.
        self._decided: dict[str, tuple[registry.Registry, Endpoint]] = {}
        self._upstream_cache: tuple[registry.Registry | None, frozenset[tuple[str, int]]] = (None, frozenset())

    def load(self, loader: Any) -> None:
        loader.add_option(
            "tenancy_registry", str | None, None,
            "Path to the tenancy registry (registry.yaml): tenants, keys, models, routes, canaries.",
        )
        loader.add_option(
            "tenancy_egress", str, "flag",
            "What to do with a forward-mode request to a host no tenant owns: flag it, or block it with 403 "
            "(and refuse any connection outside loopback).",
            choices=EGRESS_CHOICES,
        )

    def configure(self, updated: set[str]) -> None:
        if "tenancy_egress" in updated and ctx.options.tenancy_egress not in EGRESS_CHOICES:
            raise exceptions.OptionsError(
                f"tenancy_egress must be one of {', '.join(EGRESS_CHOICES)}, not {ctx.options.tenancy_egress!r}"
            )
        if "tenancy_registry" not in updated:
            return
        path = ctx.options.tenancy_registry
        if not path:
            self.tenants.clear()
            return
        try:
            self.tenants.load(Path(path))
        except registry.RegistryError as exc:
            if not (self.script and not self._running):
                raise exceptions.OptionsError(f"tenancy_registry: {exc}") from None
            log.error(f"tenancy: tenancy_registry: {exc}")  # at startup: mitmproxy exits on an error line
            self.tenants.clear()
        eager = getattr(ctx.options, "connection_strategy", "lazy") == "eager"
        if eager and any(t.host for t in self.tenants.registry or []):
            log.warning("tenancy: forward tenants need --set connection_strategy=lazy "
                        "(their hostnames exist only inside the proxy)")

    def running(self) -> None:
        self._running = True

    def http_connect(self, flow: http.HTTPFlow) -> None:
        """With egress `block` and the eager strategy (which would dial at once), refuse a CONNECT to a host no
        tenant owns. With the lazy one nothing is dialled yet: the request inside is read and refused
        (`request`), so the flow file shows what it would have sent."""
        if self.tenants.registry is None or ctx.options.tenancy_egress != "block":
            return
        if getattr(ctx.options, "connection_strategy", "lazy") != "eager":
            return
        self.tenants.refresh()
        reg = self.tenants.registry
        endpoint = routes.endpoint_of(reg, routes.route_of(flow))
        if not endpoint.owned:
            self._decided[flow.id] = (reg, endpoint)  # answered here: the inspection finishes it at once
            block(flow)

    def request(self, flow: http.HTTPFlow) -> Endpoint | None:
        """Decide whose the request is, route it and stamp it; the endpoint is what the inspection reads."""
        if self.tenants.registry is None or flow.response or flow.error:
            return None
        self.tenants.refresh()
        reg, route = self.tenants.registry, routes.route_of(flow)
        endpoint = routes.endpoint_of(reg, route)
        if endpoint.fallback is not None and self.tenants.matcher is not None:  # a shared host: by its credential
            req = flow.request
            endpoint = routes.claimed(reg, self.tenants.matcher, endpoint, req.path,
                                      list(req.headers.items(multi=True)), req.raw_content)
        self._decided[flow.id] = (reg, endpoint)
        if endpoint.tenant is None and route.topology == "reverse" and route.listen_port not in self._foreign_ports:
            self._foreign_ports.add(route.listen_port)
            log.warning(f"tenancy: listener port {route.listen_port} belongs to no tenant of {self.tenants.path}: "
                        "its flows are recorded, not inspected (add `route: {listen: PORT}` to a tenant to audit them)")
        if route.topology == "forward":
            if not endpoint.owned and ctx.options.tenancy_egress == "block":
                block(flow)
            elif upstream := endpoint.upstream:
                route_to(flow.request, upstream)
        flow.request.headers[FLOW_HEADER] = flow.id  # a stub request without it bypassed the proxy
        return endpoint

    def tcp_start(self, flow: tcp.TCPFlow) -> Endpoint | None:
        """Whose a raw TCP connection on a reverse listener is (a line protocol's: its listener's); the endpoint is
        what the inspection reads. A raw stream after a CONNECT is none of the audit's: `server_connect` refuses it
        before anything is dialled, and `reconcile` counts it among the refused."""
        route = routes.route_of(flow)
        if self.tenants.registry is None or route.topology != "reverse":
            return None
        self.tenants.refresh()
        reg = self.tenants.registry
        endpoint = routes.endpoint_of(reg, route)
        self._decided[flow.id] = (reg, endpoint)
        return endpoint

    def server_connect(self, data: ServerConnectionHookData) -> None:
        """With egress `block`, no connection leaves the machine: one to an address outside loopback is refused
        before it is dialled (a request to a host no tenant owns never gets here, `request` answers it; this
        refuses whatever else would: a raw TCP stream or TLS the proxy does not read after a CONNECT)."""
        if self.tenants.registry is None or ctx.options.tenancy_egress != "block" or data.server.address is None:
            return
        host, port = data.server.address[0], data.server.address[1]
        if not is_loopback(host) and (host.lower(), port) not in self._upstreams():
            data.server.error = f"{REFUSED_CONNECTION}: a connection to {host}:{port} (no tenant routes it)"
            log.warning(f"tenancy: refused a connection to {host}:{port}: the audit routes no such host")

    def _upstreams(self) -> frozenset[tuple[str, int]]:
        """(host, port) of every upstream the registry in force names (remembered for that registry)."""
        reg = self.tenants.registry
        if self._upstream_cache[0] is not reg:
            urls = [t.upstream_of(service) for t in reg or [] for service, _ in t.routes()]
            self._upstream_cache = (reg, frozenset(address(u) for u in urls if u))
        return self._upstream_cache[1]

    def release(self, flow: http.HTTPFlow | tcp.TCPFlow) -> Endpoint | None:
        """The endpoint decided for a flow now finished (and forgotten here), if the registry it was resolved in
        is still in force (a reloaded registry may own the route otherwise)."""
        reg, endpoint = self._decided.pop(flow.id, (None, None))
        return endpoint if reg is not None and reg is self.tenants.registry else None


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or a name) is this machine's loopback."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def address(upstream: str) -> tuple[str, int]:
    """(host, port) an upstream URL is dialled at."""
    url = urllib.parse.urlsplit(upstream)
    return (url.hostname or "").lower(), url.port or (443 if url.scheme == "https" else 80)


def block(flow: http.HTTPFlow) -> None:
    """Answer 403 without dialling anything. The flow is attributed here (egress, no tenant, `refused`): the
    inspection never sees this request in its `request` hook, only the finished flow."""
    host = flow.request.pretty_host
    flow.metadata["tenancy"] = {"tenant": None, "route": f"host:{host}", "kind": "egress", "refused": True}
    flow.response = http.Response.make(
        403, f"tenancy-audit: egress to {host} blocked\n", {"content-type": "text/plain"}
    )


def route_to(request: http.Request, upstream: str) -> None:
    """Send a forward-mode request to its tenant's provider, keeping the Host (and port) it was addressed to."""
    url = urllib.parse.urlsplit(upstream)
    host_header = request.host_header or mitmproxy_url.hostport(request.scheme, request.host, request.port)
    request.scheme = url.scheme or "http"
    request.host = url.hostname or "127.0.0.1"
    request.port = url.port or (443 if request.scheme == "https" else 80)
    request.host_header = host_header

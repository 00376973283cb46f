"""The tenancy addon: its parts `Routing` and `Inspection` loaded as one, routing first in every hook.

`addons/tenancy.py` (the file users pass to `mitmdump -s`) and the harness's mitmdump entry point load this
one class. The two parts share one `RegistryFile`: routing loads it from `tenancy_registry` and reloads it when
the file changes; inspection reads it. Routing decides each flow's endpoint (tenant and service) once and hands
it on; inspection runs the detection core's checks on it. See docs/addon.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import IO, Any

import mitmproxy.types
from mitmproxy import command, http, tcp
from mitmproxy.proxy.server_hooks import ServerConnectionHookData

from harness.capture.inspection import Inspection
from harness.capture.routing import Routing
from harness.capture.watched import RegistryFile
from harness.core.registry import Registry


class Tenancy:
    """Routing and inspection side by side: each hook runs routing's part first, so a request is routed (or
    blocked) and stamped with its flow id before it is inspected, on the endpoint routing decided. `script` is
    True for the instance `addons/tenancy.py` gives `mitmdump -s` (see `Routing`).

    The parts are called here rather than listed as sub-addons in `addons`: mitmproxy runs a parent's hooks
    before its children's, the endpoint is handed from one part to the other, and the addon tests drive the
    hooks of this one object directly."""

    def __init__(self, *, script: bool = False) -> None:
        tenants = RegistryFile()
        self.routing = Routing(tenants, script=script)
        self.inspection = Inspection(tenants)

    @property
    def registry(self) -> Registry | None:
        """The registry in force."""
        return self.routing.tenants.registry

    @property
    def ledger(self) -> IO[bytes] | None:
        """The open ledger file, if any (the inspection's)."""
        return self.inspection.ledger

    @ledger.setter
    def ledger(self, ledger: IO[bytes] | None) -> None:
        self.inspection.ledger = ledger

    def load(self, loader: Any) -> None:
        self.routing.load(loader)
        self.inspection.load(loader)

    def configure(self, updated: set[str]) -> None:
        self.routing.configure(updated)
        self.inspection.configure(updated)

    def running(self) -> None:
        self.routing.running()
        self.inspection.running()

    def done(self) -> None:
        self.inspection.done()

    # A hook that returns an awaitable (a scan in the inspection's pool) is awaited by mitmproxy before the
    # flow goes on to the next addon (`save` among them) and the network.

    def http_connect(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        self.routing.http_connect(flow)
        return self.inspection.http_connect(flow, self.routing.release(flow))

    def server_connect(self, data: ServerConnectionHookData) -> None:
        self.routing.server_connect(data)

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        endpoint = self.routing.request(flow)
        return None if endpoint is None else self.inspection.request(flow, endpoint)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        self.inspection.responseheaders(flow)

    def response(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        return self.inspection.finish(flow, self.routing.release(flow))

    def error(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        return self.inspection.finish(flow, self.routing.release(flow))

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        self.inspection.websocket_message(flow)

    def websocket_end(self, flow: http.HTTPFlow) -> None:
        self.inspection.websocket_end(flow)

    def tcp_start(self, flow: tcp.TCPFlow) -> None:
        endpoint = self.routing.tcp_start(flow)
        if endpoint is not None:
            self.inspection.tcp_start(flow, endpoint)

    def tcp_message(self, flow: tcp.TCPFlow) -> None:
        self.inspection.tcp_message(flow)

    def tcp_end(self, flow: tcp.TCPFlow) -> None:
        self.routing.release(flow)
        self.inspection.tcp_end(flow)

    def tcp_error(self, flow: tcp.TCPFlow) -> None:
        self.routing.release(flow)
        self.inspection.tcp_end(flow)

    @command.command("tenancy.findings")
    def findings_cmd(self) -> Sequence[str]:
        """The findings of this session so far, one summary line each."""
        return self.inspection.summaries()

    @command.command("tenancy.report")
    def report_cmd(self, path: mitmproxy.types.Path) -> None:
        """Write the findings of this session as JSON (mode 0600)."""
        self.inspection.write_report(path)

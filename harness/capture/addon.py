"""The tenancy addon: `Routing` and `Inspection` loaded as one, routing first in every hook.

`addons/tenancy.py` (the file users pass to `mitmdump -s`) and the harness's mitmdump entry point load this
one class. The two parts share one `RegistryFile`: routing loads it from `tenancy_registry` and reloads it when
the file changes; inspection reads it. See docs/addon.md.
"""

from __future__ import annotations

from typing import Any

from mitmproxy import http

from harness.capture.inspection import Inspection
from harness.capture.routing import Routing
from harness.capture.watched import RegistryFile


class Tenancy(Inspection):
    """The inspection addon with the routing addon in front of it: each hook both have runs routing's first,
    so a request is routed (or blocked) and stamped with its flow id before it is inspected. `script` is
    True for the instance `addons/tenancy.py` gives `mitmdump -s` (see `Routing`).

    The parts are called here rather than listed as sub-addons in `addons`: mitmproxy runs a parent's hooks
    before its children's, and the addon tests drive the hooks of this one object directly."""

    def __init__(self, *, script: bool = False) -> None:
        tenants = RegistryFile()
        super().__init__(tenants)
        self.routing = Routing(tenants, script=script)

    def load(self, loader: Any) -> None:
        self.routing.load(loader)
        super().load(loader)

    def configure(self, updated: set[str]) -> None:
        self.routing.configure(updated)
        super().configure(updated)

    def running(self) -> None:
        self.routing.running()

    def http_connect(self, flow: http.HTTPFlow) -> None:
        self.routing.http_connect(flow)
        super().http_connect(flow)

    def request(self, flow: http.HTTPFlow) -> None:
        self.routing.request(flow)
        super().request(flow)

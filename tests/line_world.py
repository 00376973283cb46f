"""A real mitmdump with the addon in front of every tenant's stub of a line-protocol platform (IRC, email), no
Hermes gateway: the stub tests run Hermes' own adapter in the Hermes venv against a tenant's listener (`run`), then
read the ledger and the saved flows (`stop`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.capture.proxy import Proxy, free_port
from harness.capture.stubs.base import stop_all
from harness.core.procs import ProcessSet
from harness.core.registry import Registry, mint
from harness.drive import services
from harness.drive.services import SERVICES
from tests import platform_adapters


@dataclass
class World:
    reg: Registry
    stubs: dict[str, Any]
    proxy: Proxy
    tmp: Path

    def listener(self, tenant: str, platform: str) -> int:
        port = self.reg[tenant].services[platform].listen
        assert port is not None
        return port

    def run(self, hermes_python: Path, code: str, env: dict[str, str], timeout: float = 90) -> dict[str, Any]:
        """`code` (dedented) in the Hermes venv with `env` and the proxy's CA trusted; the JSON of its last line."""
        extra = {"SSL_CERT_FILE": self.proxy.child_env()["SSL_CERT_FILE"], **env}
        return platform_adapters.run(hermes_python, code, self.tmp / "home", env=extra, timeout=timeout).out

    def stop(self) -> list[dict[str, Any]]:
        """Stop the proxy; its ledger's lines."""
        self.proxy.stop()
        return [json.loads(x) for x in self.proxy.ledger_path.read_text().splitlines()]


@contextmanager
def world(tmp_path: Path, platform: str) -> Iterator[World]:
    """default and alpha, each with its stub of `platform` behind a reverse listener of a real mitmdump."""
    reg = mint(["default", "alpha"], tmp_path / "work", {n: {"listen": free_port()} for n in ("default", "alpha")},
               upstreams={n: "http://127.0.0.1:9" for n in ("default", "alpha")})  # no provider here
    services.mint(reg, [platform])
    stubs = {t.name: SERVICES[platform].make(t, "observe").start() for t in reg}
    try:
        for t in reg:
            services.attach(reg, platform, t.name, {"listen": free_port()}, stubs[t.name].url)
        reg.save(tmp_path / "registry.yaml")
        proxy = Proxy(reg, tmp_path / "registry.yaml", tmp_path, ProcessSet()).start()
        try:
            yield World(reg, stubs, proxy, tmp_path)
        finally:
            proxy.stop()
    finally:
        stop_all(list(stubs.values()))

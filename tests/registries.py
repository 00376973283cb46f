"""Registries the tests share: three tenants with a share link among their canaries (the detection core's tests),
and two tenants each with one service of its own behind a listener of its own (a service's traffic through the
addon)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.core.registry import Registry, Service, mint


def with_share_links(work: Path, route: Callable[[int, str], dict[str, Any]]) -> Registry:
    """alice, bob and carol (`route(i, name)`: each one's route), each with a `share_link` canary: a URL whose query
    holds characters every URL and form encoding writes otherwise."""
    names = ["alice", "bob", "carol"]
    reg = mint(names, work, {n: route(i, n) for i, n in enumerate(names)})
    for t in reg:
        tag = t.key.rsplit("-", 1)[1]
        reg.add_canary(t.name, "share_link", f"https://share.test/{t.name}/{tag}?a=1&b=~x y+z")
    return reg


def with_service(tmp_path: Path, ports: dict[str, int], name: str, scheme: str) -> Registry:
    """Tenants `ports` (name: its provider listener), each with service `name` (credential `NAME_key`, identity
    `NAME_user`) on the listener 50 ports above, its stub (`scheme`://, 1050 above) speaking that scheme."""
    registry = mint(list(ports), tmp_path / "work", {n: {"listen": p} for n, p in ports.items()})
    for tenant, port in ports.items():
        t = registry[tenant]
        t.upstream = f"http://127.0.0.1:{port + 1000}"
        t.canaries |= {f"{name}_key": f"{name}key-{tenant}-{t.key[-18:]}",
                       f"{name}_user": f"{name}user-{tenant}-{t.key[-18:]}"}
        t.services[name] = Service(name, {"listen": port + 50}, f"{scheme}://127.0.0.1:{port + 1050}", f"{name}_key",
                                   (f"{name}_user",))
    registry.validate()
    return registry

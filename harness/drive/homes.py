"""Every tenant's Hermes home as an audit lays it down: its provider, and what each service the run drives adds."""

from __future__ import annotations

from pathlib import Path

from harness.core.evidence import EvidenceFolder
from harness.core.files import write_private
from harness.drive import phases, services
from harness.drive.context import Context
from harness.drive.hermes.agent import write_home
from harness.drive.platforms.base import ChatStub
from harness.drive.services import SERVICES
from harness.drive.surface import Where, merged


def write_homes(ctx: Context) -> None:
    """Every tenant's Hermes home: its provider, and every service the release supports (`ctx.services()`)."""
    active = ctx.services()
    for t in ctx.registry:
        where = {s: Where(ctx.proxy.service_url(t.name, s) if SERVICES[s].proxied else "",
                          ctx.registry_path, EvidenceFolder(ctx.out).service_records, _direct(ctx, t.name, s))
                 for s in active}
        extra = services.setup(t, active, where, second=t.name == ctx.registry.names()[1],
                               unset=tuple(ctx.unset_by(t.name)))
        phased = phases.settings(ctx, t.name)
        home = ctx.sandbox.home_of(t.name)
        config = merged(merged(ctx.extra_config(t.name), phased.config), extra.config)
        write_home(t, home, ctx.proxy.base_url(t.name), launch=t.name == ctx.sandbox.launch,
                   extra_config=config, extra_env={**extra.env, **phased.env})
        for rel, data in extra.files.items():
            write_private(home / rel, data)
        for rel, data in extra.workdir_files.items():
            (Path(t.canaries["workdir"]) / rel).write_bytes(data)


def _direct(ctx: Context, tenant: str, service: str) -> str:
    """Where a client reaches the tenant's stub of `service` before the proxy can take it, if anywhere."""
    stub = ctx.service_stubs.get((tenant, service))
    return stub.direct if isinstance(stub, ChatStub) else ""

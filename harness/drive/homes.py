"""Every tenant's Hermes home as an audit lays it down: its provider, and what each service the run drives adds."""

from __future__ import annotations

from pathlib import Path

from harness.core.evidence import EvidenceFolder
from harness.core.files import write_private
from harness.drive import approvals, kanban, redaction, services, toolsets
from harness.drive.context import Context
from harness.drive.hermes import write_home
from harness.drive.services import SERVICES


def write_homes(ctx: Context) -> None:
    """Every tenant's Hermes home: its provider, and every service the release supports (`ctx.services()`)."""
    active = ctx.services()
    for t in ctx.registry:
        where = {s: services.Where(ctx.proxy.service_url(t.name, s) if SERVICES[s].proxied else "",
                                   ctx.registry_path, EvidenceFolder(ctx.out).service_records) for s in active}
        extra = services.setup(t, active, where, second=t.name == ctx.registry.names()[1])
        phase_config, phase_env = redaction.settings(ctx, t.name)
        home = ctx.sandbox.home_of(t.name)
        for more in (approvals.settings(ctx, t.name), kanban.settings(ctx), toolsets.settings(ctx, t.name)):
            phase_config = services.merged(phase_config, more)
        config = services.merged(services.merged(ctx.extra_config(t.name), phase_config), extra.config)
        write_home(t, home, ctx.proxy.base_url(t.name), launch=t.name == ctx.sandbox.launch,
                   extra_config=config, extra_env={**extra.env, **phase_env})
        for rel, data in extra.files.items():
            write_private(home / rel, data)
        for rel, data in extra.workdir_files.items():
            (Path(t.canaries["workdir"]) / rel).write_bytes(data)

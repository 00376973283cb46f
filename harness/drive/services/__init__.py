"""Every credentialed service a tenant's Hermes profile talks to: one module per service in this package, each
declaring one `SERVICE` (`base.ServiceSpec`: its stub, canary kinds, profile set-up, battery steps, coverage and
plants). This registry finds them; the rest of the harness iterates it and names no service.

Every stub is one instance per tenant, behind the proxy on a listener of its own unless it is reached over
stdio. A credential is the same variable NAME in every profile's `.env` with a different VALUE (the shape that
exposed F1). docs/services.md describes each service; docs/architecture.md how to add one.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable
from typing import Any

from harness.core.protocol import TOOL_GROUPS as OWN_TOOL_GROUPS
from harness.core.registry import Registry, Tenant, new_tag
from harness.core.registry import Service as RegistryService
from harness.drive.surface import ISSUED, ServiceSpec, Setup, Unset, Where, issued_host, merge


def _discover() -> dict[str, ServiceSpec]:
    """Every module of this package and of `harness.drive.platforms` (the messaging platforms) that declares one."""
    from harness.drive import platforms

    found = []
    for package in (__name__, platforms.__name__):
        path = importlib.import_module(package).__path__
        modules = [importlib.import_module(f"{package}.{m.name}") for m in pkgutil.iter_modules(path)]
        found += [m.SERVICE for m in modules if isinstance(getattr(m, "SERVICE", None), ServiceSpec)]
    return {s.name: s for s in sorted(found, key=lambda s: s.rank)}


#: Every service, the LLM provider first.
ALL_SERVICES: dict[str, ServiceSpec] = _discover()
PROVIDER_SERVICE = next(s for s in ALL_SERVICES.values() if not s.optional)
#: The services `--services` chooses from (every one but the provider).
SERVICES: dict[str, ServiceSpec] = {n: s for n, s in ALL_SERVICES.items() if s.optional}
#: The messaging platforms of the gateway (the modules of `harness.drive.platforms`), chosen with `--platforms`.
PLATFORMS: dict[str, ServiceSpec] = {n: s for n, s in SERVICES.items() if s.messaging is not None}
#: Every setting a profile may leave unset, by `SERVICE.NAME` (`--unset`).
UNSETTABLE: dict[str, Unset] = {f"{n}.{u.name}": u for n, s in ALL_SERVICES.items() for u in s.unsettable}
#: How a release is asked whether it has each service (`Coverage.probe`), for the feature probe.
PROBES: dict[str, str] = {n: s.coverage.probe for n, s in SERVICES.items()}
#: The services of a run without `--services`: every one but those chosen by name only (another holder of a slot).
DEFAULT_SERVICES: tuple[str, ...] = tuple(n for n, s in SERVICES.items() if s.by_default)
#: The tool battery by group (`--tools`): Hermes' own tools, then each service's.
TOOL_GROUPS: dict[str, tuple[str, ...]] = dict(OWN_TOOL_GROUPS)
for _spec in SERVICES.values():
    if _spec.battery.tools:
        TOOL_GROUPS[_spec.battery.group] = (*TOOL_GROUPS.get(_spec.battery.group, ()), *_spec.battery.tools)
BATTERY_TOOLS: tuple[str, ...] = tuple(t for tools in TOOL_GROUPS.values() for t in tools)
#: The groups a service brings: each runs only where one of its services is on.
GROUP_SERVICES: dict[str, tuple[str, ...]] = {}
for _spec in SERVICES.values():
    if _spec.battery.tools:
        GROUP_SERVICES[_spec.battery.group] = (*GROUP_SERVICES.get(_spec.battery.group, ()), _spec.name)


def unavailable(offered: Callable[[str], bool], names: list[str]) -> str | None:
    """Why a run that asks for the services `names` cannot be audited on a release (`offered`: whether it has a
    service), or None: a messaging platform asked for that it lacks (its adapter, or the SDK of Hermes' extra)."""
    for name in names:
        spec = SERVICES.get(name)
        if spec is not None and spec.messaging is not None and not offered(name):
            return f"platform {name}: {spec.coverage.lacks}"
    return None


def check(names: list[str]) -> list[str]:
    """Unknown service names (for the option check)."""
    return [n for n in names if n not in SERVICES]


def conflicts(names: list[str]) -> str:
    """Why these services cannot run together ("" when they can): two of them hold the same profile slot."""
    holder: dict[str, str] = {}
    for name in names:
        slot = SERVICES[name].slot
        if not slot:
            continue
        if slot in holder:
            return f"services {holder[slot]!r} and {name!r} both set the profile's {slot}: choose one"
        holder[slot] = name
    return ""


def mint(registry: Registry, names: list[str]) -> None:
    """Mint the canaries of the services `names` for every tenant (one tag per tenant and call; a kind of a
    service's `words` with `_` between its parts, a kind of its `shapes` in its own shape)."""
    for t in registry:
        tag = new_tag()
        for name in names:
            spec = SERVICES[name]
            for kind in spec.kinds():
                if kind not in t.canaries:
                    value = f"{kind.replace('_', '')}-{t.name}-{tag}"
                    if kind in spec.words:  # letters, digits and single "_" (a sanitised tag keeps it)
                        value = re.sub(r"[^A-Za-z0-9]+", "_", value)
                    if kind in spec.shapes:
                        value = spec.shapes[kind](tag, value)
                    registry.add_canary(t.name, kind, value)


def attach(registry: Registry, name: str, tenant: str, route: dict[str, Any] | None, upstream: str) -> None:
    """Record a tenant's service in the registry: its listener (None over stdio), upstream and canary kinds. A
    service whose SDK fixes its host (`FixedHost`) is routed there by its tokens instead, and its stub's issued
    URLs by the tenant's own host (a service `<name>_issued` of the same stub, without a credential)."""
    spec = SERVICES[name]
    credential = None if spec.keyless else spec.credential
    services = registry[tenant].services
    if spec.fixed is not None:
        route = {"host": spec.fixed.host, "by": list(spec.fixed.by)}
        services[name + ISSUED] = RegistryService(name + ISSUED, {"host": issued_host(name, tenant)}, upstream,
                                                  None, spec.identity)
        for entry, host in list(spec.fixed.entries(name).items())[1:]:  # its other fixed hosts
            services[entry] = RegistryService(entry, {"host": host, "by": list(spec.fixed.by)}, upstream, credential,
                                              spec.identity)
    services[name] = RegistryService(name, route, upstream, credential, spec.identity)
    registry.validate()


def listens(name: str) -> bool:
    """Whether the service has a listener of its own in the reverse topology (not over stdio, not a fixed host)."""
    return SERVICES[name].proxied and SERVICES[name].fixed is None


def setup(tenant: Tenant, names: list[str], where: dict[str, Where], *, second: bool = False,
          unset: tuple[str, ...] = ()) -> Setup:
    """Everything the services `names` add to one profile, merged (`second`: the run's second tenant; `unset`: the
    settings, `SERVICE.NAME`, it leaves unset)."""
    merged = Setup()
    for name in names:
        if second and SERVICES[name].but_second:
            continue
        part = SERVICES[name].configure(tenant, where[name])
        for setting in unset:
            if setting.split(".", 1)[0] == name:
                part = UNSETTABLE[setting].drop(part)
        merge(merged.config, part.config)
        merged.env.update(part.env)
        merged.files.update(part.files)
        merged.workdir_files.update(part.workdir_files)
    return merged

"""Reading a registry file: safe YAML (no aliases, no repeated keys), every field checked, each problem one
line of `RegistryError`; what it reads is then validated as a whole by `harness.core.registry.Registry`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from harness.core.derived import Derived
from harness.core.registry import (
    KIND,
    MAX_REGISTRY_BYTES,
    PROVIDER,
    READABLE_VERSIONS,
    Registry,
    RegistryError,
    Service,
    Tenant,
)

_TENANT_FIELDS = {"key", "model", "route", "upstream", "home", "canaries", "services", "derived"}
_SERVICE_FIELDS = {"route", "upstream", "credential", "identity"}


class _NoAliasLoader(yaml.SafeLoader):
    """Safe YAML without anchors/aliases: the registry never needs them, and they enable bombs."""

    def compose_node(self, parent, index):  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise RegistryError(f"registry: YAML aliases are not allowed (line {event.start_mark.line + 1})")
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):  # type: ignore[override]
        """Reject a repeated key: YAML would silently keep the last one (a tenant or key would vanish)."""
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, str | int):
                    continue
                if key in seen:
                    raise RegistryError(f"registry: duplicate key {key!r} (line {key_node.start_mark.line + 1})")
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse(text: str) -> Registry:
    """Parse and validate registry YAML text."""
    try:
        doc = yaml.load(text, Loader=_NoAliasLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise RegistryError(f"registry: not valid YAML{at}") from None
    if not isinstance(doc, dict):
        raise RegistryError("registry: top level must be a mapping with 'version' and 'tenants'")
    unknown = set(doc) - {"version", "tenants"}
    if unknown:
        raise RegistryError(f"registry: unknown top-level field {sorted(unknown)[0]!r}")
    if doc.get("version") not in READABLE_VERSIONS or isinstance(doc.get("version"), bool):
        raise RegistryError(f"registry: version must be 1 or 2, got {doc.get('version')!r}")
    raw = doc.get("tenants")
    if not isinstance(raw, dict) or not raw:
        raise RegistryError("registry: 'tenants' must be a non-empty mapping")
    tenants = {}
    for name, spec in raw.items():
        tenants[str(name)] = _tenant(str(name), spec)
    return Registry(tenants)


def _tenant(name: str, spec: Any) -> Tenant:
    where = f"registry: tenant {name!r}"
    if not isinstance(spec, dict):
        raise RegistryError(f"{where}: must be a mapping")
    unknown = set(spec) - _TENANT_FIELDS
    if unknown:
        raise RegistryError(f"{where}: unknown field {sorted(map(str, unknown))[0]!r}")
    for req in ("key", "model", "route"):
        if req not in spec:
            raise RegistryError(f"{where}: missing field {req!r}")
    route = _route(spec["route"], where)
    canaries = spec.get("canaries") or {}
    if not isinstance(canaries, dict):
        raise RegistryError(f"{where}: field 'canaries' must be a mapping")
    for kind in ("key", "model"):
        if kind in canaries:
            raise RegistryError(f"{where}: canary {kind!r} is a reserved name (it is a tenant field)")
    for fld in ("upstream", "home"):
        if spec.get(fld) is not None and not isinstance(spec[fld], str):
            raise RegistryError(f"{where}: field {fld!r} must be a string")
    services = spec.get("services") or {}
    if not isinstance(services, dict):
        raise RegistryError(f"{where}: field 'services' must be a mapping")
    return Tenant(
        name=name,
        key=spec["key"],
        model=spec["model"],
        route=route,
        upstream=spec.get("upstream") or "",
        home=spec.get("home"),
        canaries={str(k): v for k, v in canaries.items()},
        services={str(n): _service(str(n), s, where) for n, s in services.items()},
        derived=_derived(spec.get("derived"), where),
    )


def _derived(spec: Any, where: str) -> dict[str, Derived]:
    """A tenant's derived canaries' provenance (`Registry.validate` checks them against its canaries)."""
    spec = spec or {}
    if not isinstance(spec, dict) or not all(
            isinstance(d, dict) and set(d) == {"text", "by"} and all(isinstance(v, str) for v in d.values())
            for d in spec.values()):
        raise RegistryError(f"{where}: field 'derived' must map canary kinds to {{text: TEXT, by: TENANT}}")
    return {str(kind): Derived(d["text"], d["by"]) for kind, d in spec.items()}


def _route(route: Any, where: str) -> dict[str, Any]:
    """`{listen: PORT}`, `{host: HOSTNAME}`, or a host every tenant of a service shares, each request told apart by
    the credential it carries: `{host: HOSTNAME, by: credential}` or `{host: HOSTNAME, by: [KIND, ...]}`."""
    listen = isinstance(route, dict) and set(route) == {"listen"} and isinstance(route["listen"], int) \
        and not isinstance(route["listen"], bool)
    by = route.get("by", "credential") if isinstance(route, dict) else None
    host = isinstance(route, dict) and set(route) in ({"host"}, {"host", "by"}) and isinstance(route["host"], str) \
        and bool(route["host"]) and (by == "credential" or (
            isinstance(by, list) and bool(by) and all(isinstance(k, str) and KIND.match(k) for k in by)))
    if not (listen or host):
        raise RegistryError(f"{where}: field 'route' must be {{listen: PORT}}, {{host: HOSTNAME}} or "
                            "{host: HOSTNAME, by: credential | [KIND, ...]}")
    return dict(route)


def _service(name: str, spec: Any, where: str) -> Service:
    where = f"{where}: service {name!r}"
    if not KIND.match(name) or name == PROVIDER:
        raise RegistryError(f"{where}: name is not a lowercase identifier other than {PROVIDER!r}")
    if not isinstance(spec, dict):
        raise RegistryError(f"{where}: must be a mapping")
    unknown = set(spec) - _SERVICE_FIELDS
    if unknown:
        raise RegistryError(f"{where}: unknown field {sorted(map(str, unknown))[0]!r}")
    route = _route(spec["route"], where) if spec.get("route") is not None else None
    if spec.get("upstream") is not None and not isinstance(spec["upstream"], str):
        raise RegistryError(f"{where}: field 'upstream' must be a string")
    credential = spec.get("credential")
    if credential is not None and not isinstance(credential, str):
        raise RegistryError(f"{where}: field 'credential' must be a canary kind")
    identity = spec.get("identity") or []
    if not isinstance(identity, list) or not all(isinstance(k, str) for k in identity):
        raise RegistryError(f"{where}: field 'identity' must be a list of canary kinds")
    return Service(name, route, spec.get("upstream") or "", credential, tuple(identity))


def load(path: Path | str) -> Registry:
    """Read and validate a registry file; any problem is a one-line RegistryError."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_REGISTRY_BYTES:
            raise RegistryError(f"registry: {path} is {size} bytes, more than {MAX_REGISTRY_BYTES}")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RegistryError(f"registry: {path} does not exist") from None
    except UnicodeDecodeError:
        raise RegistryError(f"registry: {path} is not UTF-8 text") from None
    except OSError as exc:
        raise RegistryError(f"registry: cannot read {path}: {exc.strerror}") from None
    return parse(text)

"""The canary registry: every tenant's key, model, route, services and canaries (`registry.yaml`, version 2; read by
`harness.core.registry_file`).

A tenant's own `route`/`upstream`/`key`/`model` are its LLM provider's. Every other service the tenant holds
credentials for (an MCP server, a memory provider, a web search API, its auxiliary models) is one entry of
`services`: its own listener (`route`; none for a service reached over stdio), its upstream stub, the canary
kind of the credential it must receive (`credential`) and the canary kinds that identify the tenant to it
(`identity`). Version 1 (no `services`) is still read.

A *derived* canary is minted while the run goes on, for text a model generates from what it was asked (a title, a
summary, a reply): one per tenant whose data the request carried, kind `derived_TEXT` (`derived_TEXT_via_OTHER` when
another tenant's model generated it), with its provenance in the tenant's `derived` (`Derived`). Each has one owner,
as every canary does: a request that carried two tenants' data gets one of each.
"""

from __future__ import annotations

import re
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ahocorasick_rs
import yaml

from harness.core.derived import DERIVED_TEXTS, Derived, derived_kind, is_derived_kind
from harness.core.files import write_private
from harness.core.protocol import PLACEHOLDER

VERSION = 2
READABLE_VERSIONS = (1, 2)
#: The service name of a tenant's own route: its LLM provider.
PROVIDER = "provider"
MIN_CANARY_LEN = 12
MAX_CANARY_LEN = 4096
MAX_REGISTRY_BYTES = 4 * 1024 * 1024
TAG_BYTES = 6  # 48 random bits in every canary: a hit is never a coincidence
#: The fixed start of every minted tag, so of every minted canary: `Matcher` looks for its few encoded
#: forms first and runs the full automaton only around them (its hex nibbles are digits, its base64 has
#: no `+` or `/`, which keeps the forms few).
TAG_MARKER = "qxcvyb"

#: Canary kinds minted for every tenant besides `key` and `model`.
MINTED_KINDS = (
    "api_server_key",
    "env_marker",
    "memory",
    "soul",
    "workdir",
    "cron_prompt",
    "shell_state",
)
#: Kinds whose leak is a credential leak (text scans without an owner look for these only).
SECRET_KINDS = frozenset({"key", "api_server_key"})

_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
KIND = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


class RegistryError(ValueError):
    """The registry file is missing, malformed or violates a rule; the message is one line."""


#: Kinds whose value is a path of the tenant's (its Hermes home, its terminal cwd, a cwd set mid-scenario).
PATH_KINDS = frozenset({"home", "workdir", "workdir_set"})


def is_path_kind(kind: str) -> bool:
    return re.sub(r"_\d+$", "", kind) in PATH_KINDS


def is_secret_kind(kind: str) -> bool:
    """Keys are secrets; so is any canary minted later whose kind ends in `key` (or `key_N`: a second one of
    that kind, see `Registry.free_kind`); a derived canary never is (its kind may end in a tenant's name)."""
    base = re.sub(r"_\d+$", "", kind)
    return base in SECRET_KINDS or (base.endswith("key") and not is_derived_kind(base))


@dataclass
class Service:
    """One credentialed service of a tenant besides its provider: where the proxy listens for it, its
    upstream, the canary kind of its credential and the canary kinds of the tenant's identity there."""

    name: str
    route: dict[str, Any] | None = None  # None: not behind the proxy (an MCP server over stdio)
    upstream: str = ""
    credential: str | None = None
    identity: tuple[str, ...] = ()

    @property
    def listen(self) -> int | None:
        return (self.route or {}).get("listen")

    @property
    def host(self) -> str | None:
        return (self.route or {}).get("host")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.route is not None:
            out["route"] = dict(self.route)
        if self.upstream:
            out["upstream"] = self.upstream
        if self.credential:
            out["credential"] = self.credential
        if self.identity:
            out["identity"] = list(self.identity)
        return out


@dataclass
class Tenant:
    """One tenant (a Hermes profile) and the canaries that identify it."""

    name: str
    key: str
    model: str
    route: dict[str, Any]
    upstream: str = ""
    home: str | None = None
    canaries: dict[str, str] = field(default_factory=dict)
    services: dict[str, Service] = field(default_factory=dict)
    derived: dict[str, Derived] = field(default_factory=dict)  # derived canary kind -> its provenance

    def all_canaries(self) -> dict[str, str]:
        """Every canary by kind name, `key` and `model` included."""
        return {"key": self.key, "model": self.model, **self.canaries}

    def secrets(self) -> dict[str, str]:
        return {k: v for k, v in self.all_canaries().items() if is_secret_kind(k)}

    @property
    def listen(self) -> int | None:
        return self.route.get("listen")

    @property
    def host(self) -> str | None:
        return self.route.get("host")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "model": self.model, "route": dict(self.route)}
        if self.upstream:
            out["upstream"] = self.upstream
        if self.home:
            out["home"] = self.home
        out["canaries"] = dict(self.canaries)
        if self.services:
            out["services"] = {s.name: s.to_dict() for s in self.services.values()}
        if self.derived:
            out["derived"] = {kind: d.to_dict() for kind, d in self.derived.items()}
        return out

    def credential(self, service: str) -> str | None:
        """The credential `service` must receive from this tenant (the provider's is the key)."""
        if service == PROVIDER:
            return self.key
        kind = self.services[service].credential
        return self.canaries.get(kind) if kind else None

    def credentials(self, service: str) -> tuple[str, ...]:
        """Every credential `service` accepts from this tenant: its `credential` first, then, on a host the tenants
        share, the other secrets its route's `by` names (a platform's bot token and app token)."""
        own = self.credential(service)
        route = self.route if service == PROVIDER else self.services[service].route or {}
        by = route.get("by")
        extra = [self.canaries.get(k) for k in by if is_secret_kind(k)] if isinstance(by, list) else []
        return tuple(dict.fromkeys(v for v in (own, *extra) if v))

    def upstream_of(self, service: str) -> str:
        """Where the proxy sends `service`'s requests of this tenant ("" when unknown)."""
        return self.upstream if service == PROVIDER else self.services[service].upstream

    def routes(self) -> list[tuple[str, dict[str, Any]]]:
        """(service, route) of every listener of this tenant: the provider's first."""
        return [(PROVIDER, self.route)] + [(s.name, s.route) for s in self.services.values() if s.route]


@dataclass
class Registry:
    """All tenants of one audit; the contract between harness, addon and reconciler."""

    tenants: dict[str, Tenant]
    #: Held while a canary is added or the file written: stubs mint derived canaries while the driver runs.
    lock: threading.RLock = field(default_factory=threading.RLock, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.validate()

    def __getstate__(self) -> dict[str, Any]:  # the addon's scan workers get a copy: without the lock
        return {"tenants": self.tenants}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.tenants, self.lock = state["tenants"], threading.RLock()

    def __iter__(self):
        return iter(self.tenants.values())

    def __getitem__(self, name: str) -> Tenant:
        return self.tenants[name]

    def names(self) -> list[str]:
        return list(self.tenants)

    def endpoint(self, *, listen_port: int | None = None, host: str | None = None) -> tuple[Tenant, str] | None:
        """(tenant, service) of a reverse listener's port or a forward request's host, if one tenant's (a host
        every tenant shares is no one's by itself: `sharing`)."""
        host = host.lower().rstrip(".") if host else None
        for t in self:
            for service, route in t.routes():
                if (listen_port is not None and route.get("listen") == listen_port) or (
                        host and "by" not in route and (route.get("host") or "").lower() == host):
                    return t, service
        return None

    def sharing(self, host: str) -> list[tuple[Tenant, str, tuple[str, ...]]]:
        """(tenant, service, the canary kinds that name the tenant there) of every route `{host: HOST, by: ...}`
        of `host`, in registry order: a host fixed in a platform's SDK, which every tenant of one service reaches,
        each request told apart by the credential it carries (docs/contracts.md)."""
        host = host.lower().rstrip(".")
        return [(t, service, self.claim_kinds(t, service, route)) for t in self for service, route in t.routes()
                if "by" in route and (route.get("host") or "").lower() == host]

    @staticmethod
    def claim_kinds(tenant: Tenant, service: str, route: dict[str, Any]) -> tuple[str, ...]:
        """The canary kinds a shared route's `by` names: `credential`, the service's credential kind (the
        provider's: `key`); else the list it gives."""
        by = route["by"]
        if by != "credential":
            return tuple(by)
        kind = "key" if service == PROVIDER else tenant.services[service].credential
        return (kind,) if kind else ()

    def by_listen_port(self, port: int) -> Tenant | None:
        found = self.endpoint(listen_port=port)
        return found[0] if found else None

    def by_host(self, host: str) -> Tenant | None:
        found = self.endpoint(host=host)
        return found[0] if found else None

    def listen_ports(self) -> list[int]:
        """Every reverse listener of every tenant and service."""
        return [r["listen"] for t in self for _, r in t.routes() if r.get("listen") is not None]

    def owner_of_key(self, key: str) -> Tenant | None:
        return next((t for t in self if key and key in t.secrets().values()), None)

    def free_kind(self, tenant: str, kind: str) -> str:
        """`kind`, or `kind_2`, `kind_3`... if the tenant has a canary of that kind already (a scenario that
        runs twice, as in `all`, mints its canaries twice: the first value must stay in the registry)."""
        taken = self.tenants[tenant].all_canaries()
        n = 1
        name = kind
        while name in taken:
            n += 1
            name = f"{kind}_{n}"
        return name

    def add_canary(self, tenant: str, kind: str, value: str) -> None:
        """Mint a canary mid-scenario (re-validates the whole registry); a kind the tenant has is an error
        (its first value would no longer be looked for)."""
        with self.lock:
            t = self.tenants[tenant]
            if kind in t.all_canaries():
                raise RegistryError(f"registry: tenant {tenant!r} already has a canary {kind!r}")
            before = t.canaries
            t.canaries = {**before, kind: value}  # a new mapping: whoever iterates the old one is not disturbed
            try:
                self.validate()
            except RegistryError:
                t.canaries = before
                raise

    def derive(self, owner: str, text: str, by: str) -> tuple[str, bool]:
        """The value of the canary for `text` that `by`'s model derived from `owner`'s data, minted on first use;
        and whether it was minted now (the file must then be saved for the addon)."""
        kind = derived_kind(text, owner, by)
        with self.lock:
            t = self.tenants[owner]
            if kind in t.canaries:
                return t.canaries[kind], False
            self.add_canary(owner, kind, new_tag())  # short: a title keeps 80 characters
            t.derived = {**t.derived, kind: Derived(text, by)}
            return t.canaries[kind], True

    def validate(self) -> None:
        owner: dict[str, tuple[str, str]] = {}
        for t in self:
            if not _NAME.match(t.name):
                raise RegistryError(f"registry: tenant name {t.name!r} is not a short lowercase identifier")
            for kind, value in t.all_canaries().items():
                where = f"registry: tenant {t.name!r}: canary {kind!r}"
                if not KIND.match(kind):
                    raise RegistryError(f"{where}: kind name is not a lowercase identifier")
                if not isinstance(value, str):
                    raise RegistryError(f"{where}: value must be a string")
                if len(value) < MIN_CANARY_LEN and not PLACEHOLDER.match(value):  # <t:k> is never a coincidence
                    raise RegistryError(f"{where}: shorter than {MIN_CANARY_LEN} characters")
                if len(value) > MAX_CANARY_LEN:
                    raise RegistryError(f"{where}: longer than {MAX_CANARY_LEN} characters")
                if value in owner and owner[value][0] != t.name:
                    other = owner[value]
                    raise RegistryError(f"{where}: same value as tenant {other[0]!r} canary {other[1]!r}")
                owner.setdefault(value, (t.name, kind))
        values = list(owner)
        automaton = ahocorasick_rs.AhoCorasick(values)
        for value in values:
            for idx, _, _ in automaton.find_matches_as_indexes(value, overlapping=True):
                inner = values[idx]
                # a directory of another tenant's path is allowed (the scanner reports the longer match)
                if inner != value and owner[inner][0] != owner[value][0] and not value.startswith(inner + "/"):
                    (name, kind), (oname, okind) = owner[value], owner[inner]
                    raise RegistryError(
                        f"registry: tenant {name!r}: canary {kind!r} contains tenant {oname!r} canary {okind!r}"
                    )
        for t in self:
            for kind, d in t.derived.items():
                if kind not in t.canaries or d.text not in DERIVED_TEXTS or d.by not in self.tenants:
                    raise RegistryError(f"registry: tenant {t.name!r}: derived canary {kind!r} is not a canary of its "
                                        f"own, of a known text kind, generated by a tenant of the registry")
            for svc in t.services.values():
                for kind in (svc.credential, *svc.identity):
                    if kind and kind not in t.canaries:
                        raise RegistryError(f"registry: tenant {t.name!r}: service {svc.name!r} names canary "
                                            f"{kind!r}, which the tenant does not have")
        ports = self.listen_ports()
        if len(ports) != len(set(ports)):
            raise RegistryError("registry: two tenants or services share a listen port")
        self._validate_hosts()

    def _validate_hosts(self) -> None:
        """A host is one route's, or shared (`by`) by the routes of one service (so one per tenant), each naming
        canaries its tenant has."""
        hosts: dict[str, list[tuple[Tenant, str, dict[str, Any]]]] = {}
        for t in self:
            for service, route in t.routes():
                if isinstance(route.get("host"), str):
                    hosts.setdefault(route["host"].lower().rstrip("."), []).append((t, service, route))
        for host, routes in hosts.items():
            shared = [r for r in routes if "by" in r[2]]
            if len(routes) > 1 and len(shared) != len(routes):
                raise RegistryError(f"registry: two tenants or services share the host {host!r} "
                                    "(a shared host needs `by` on every route)")
            if len({service for _, service, _ in shared}) > 1:
                raise RegistryError(f"registry: host {host!r} is shared by two services (a shared host is one's)")
            for t, service, route in shared:
                kinds = self.claim_kinds(t, service, route)
                missing = [k for k in kinds if k not in t.all_canaries()]
                if not kinds or missing:
                    raise RegistryError(f"registry: tenant {t.name!r}: service {service!r}: route by "
                                        f"{route['by']!r} names no canary the tenant has"
                                        + (f" ({missing[0]!r})" if missing else ""))

    def to_dict(self) -> dict[str, Any]:
        return {"version": VERSION, "tenants": {t.name: t.to_dict() for t in self}}

    def save(self, path: Path) -> None:
        """Write atomically, mode 0600 (the file holds every secret)."""
        with self.lock:
            write_private(Path(path), yaml.safe_dump(self.to_dict(), sort_keys=False).encode())


def new_tag() -> str:
    """`TAG_MARKER` and 48 random bits, in hex."""
    return TAG_MARKER + secrets.token_hex(TAG_BYTES)


def mint(names: list[str], workroot: Path, routes: dict[str, dict[str, Any]], *,
         upstreams: Mapping[str, str] | None = None, homes: Mapping[str, Path] | None = None) -> Registry:
    """Mint tenants with fresh random canaries of every kind; `workroot` holds their terminal cwds. `upstreams`
    and `homes` (by tenant) are each tenant's provider upstream and Hermes home; a home is a canary too (a path
    of it elsewhere is a finding)."""
    tenants = {}
    for name in names:
        tag = new_tag()
        home = str(homes[name]) if homes else None
        tenants[name] = Tenant(
            name=name,
            key=f"sk-tenancy-{name}-{tag}",
            model=f"model-{name}-{tag}",
            route=dict(routes[name]),
            upstream=upstreams[name] if upstreams else "",
            home=home,
            canaries={
                "api_server_key": f"apisrv-{name}-{tag}",
                "env_marker": f"envmark-{name}-{tag}",
                "memory": f"memory-canary-{name}-{tag}",
                "soul": f"soul-canary-{name}-{tag}",
                "workdir": str(Path(workroot) / f"work-{name}-{tag}"),
                "cron_prompt": f"cron-canary-{name}-{tag}",
                "shell_state": f"shellstate-{name}-{tag}",
                **({"home": home} if home else {}),
            },
        )
    return Registry(tenants)

"""The shape every service and messaging platform plug-in declares once (`ServiceSpec`), and what its parts are
given.

A module of `harness.drive.services` or `harness.drive.platforms` holds one `SERVICE`: its stub, its canary kinds,
what it adds to a profile (`configure`), the battery steps that drive it, how a release is asked whether it has it
(coverage: `n/a` with the reason when not), and its negative controls (`plants`). `harness.drive.services` finds
the modules and keeps the registry; no other module names a service.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.capture.proxy import FORWARD_DOMAIN
from harness.capture.stubs.base import Service
from harness.capture.stubs.provider import ToolStep
from harness.core.registry import Tenant


@dataclass(frozen=True)
class Setup:
    """What one service adds to a tenant's profile."""

    config: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)  # relative to the profile's home
    workdir_files: dict[str, bytes] = field(default_factory=dict)  # relative to the tenant's terminal cwd


#: What a tenant that leaves a setting unset need not show, because the setting was what made it happen: its bot's
#: sign-in, its own messages answered, its cron output in its home channel, a stranger refused (then another
#: tenant's user or channel admitted is a crossing only while a stranger is still refused).
RELAXES = frozenset({"sign-in", "answered", "home", "strangers"})


@dataclass(frozen=True)
class Unset:
    """A setting a profile may leave unset (a run's `--unset SERVICE.NAME`: the run's second tenant leaves it unset,
    the launch profile sets it): where it lives, `.env` variables, config keys (dotted paths) and files of the home,
    and what the tenant that leaves it unset need not show (`relaxes`, of `RELAXES`). Whatever that tenant then does
    with another tenant's value (the launch's, read from the process environment) carries that tenant's canaries:
    the audit's detectors report it as for any other crossing."""

    name: str
    env: tuple[str, ...] = ()
    config: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    relaxes: frozenset[str] = frozenset()

    def drop(self, setup: Setup) -> Setup:
        """`setup` without this setting."""
        config = json.loads(json.dumps(setup.config))
        for dotted in self.config:
            *parents, leaf = dotted.split(".")
            node = config
            for key in parents:
                node = node.get(key) if isinstance(node, dict) else None
            if isinstance(node, dict):
                node.pop(leaf, None)
        return Setup(config=config, env={k: v for k, v in setup.env.items() if k not in self.env},
                     files={k: v for k, v in setup.files.items() if k not in self.files},
                     workdir_files=dict(setup.workdir_files))


@dataclass(frozen=True)
class Where:
    """Where a tenant's service is reached: its URL through the proxy (none over stdio), and for stdio servers
    the registry and the folder they record into."""

    url: str = ""
    registry: Path | None = None
    record: Path | None = None
    #: The stub's own address for what a client must reach before the proxy can take it (`ChatStub.direct`: email's
    #: STARTTLS front, which relays what it decrypts through the proxy); "" for every other service.
    direct: str = ""


#: A word every tenant's transcript holds (the prompt): what the battery's searches ask for.
COMMON_WORD = "environment"


@dataclass(frozen=True)
class Turn:
    """What a service's battery steps are written from: the tenant whose turn it is, the scenario, and for a
    lookup the tenant whose identifiers it names (its ring neighbour)."""

    tenant: Tenant
    scenario: str
    other: str = ""


def _none(turn: Turn) -> list[ToolStep]:
    return []


@dataclass(frozen=True)
class Battery:
    """The battery group that drives a service: its tools (none: a group of Hermes' own tools, such as
    `delegate`, which then runs with or without the service), and the steps of a tenant's write turn (writes,
    then reads) and of its lookup turn. Steps run in the service registry's order, after the own tools'."""

    group: str
    tools: tuple[str, ...] = ()
    parallel_safe: frozenset[str] = frozenset()  # tools Hermes runs concurrently (`battery.PARALLEL_SAFE`)
    writes: Callable[[Turn], list[ToolStep]] = _none
    reads: Callable[[Turn], list[ToolStep]] = _none
    lookups: Callable[[Turn], list[ToolStep]] = _none
    titles: bool = False  # its stub answers every request without tools with the tenant's title canary


@dataclass(frozen=True)
class PlantContext:
    """What a plant is given: the donor's data goes into the target's home."""

    donor: Tenant
    target: Tenant
    target_home: Path
    donor_route: str  # the donor's base_url through the proxy
    target_stub: str  # the target's stub, bypassing the proxy
    during: list[threading.Thread] = field(default_factory=list)  # writers that act while Hermes runs (joined)


@dataclass(frozen=True)
class Plant:
    """A negative control: what it does, and the finding kinds the audit must then report. A service's plant
    must be caught through the service (a finding that names it) unless `through_service` is False: then its
    run only needs the service's battery group (the subagents' model runs on the tenant's own provider)."""

    action: Callable[[PlantContext], None]
    expects: frozenset[str]
    through_service: bool = True
    alone: bool = False  # needs an audit of its own: another plant of its service would take away what it needs


@dataclass(frozen=True)
class Coverage:
    """How a release is asked whether it has the service (`probe`: a Python expression in the feature probe's
    child, over its helpers `has(module)`, `imports(module)` (it imports) and `source_has(module, text)`), and why
    the service is `n/a` without it (`lacks`: for a messaging platform, name Hermes' extra that brings its SDK) or in
    the forward topology (`forward`; "" when it can be audited there)."""

    probe: str
    lacks: str
    forward: str = ""


@dataclass(frozen=True)
class Messaging:
    """What makes a service a messaging platform of the gateway (`harness.drive.platforms`): the canary kinds of the
    tenant's user there, its channel (its home channel too), what its user writes in that channel and what its agent
    attaches to a reply (a file in its home, `media_file`), and the `deliver:` value of a cron job that posts there.
    Its stub is a `platforms.base.ChatStub`: the `messaging` phase sends the bot messages through it and reads what
    the bot posted."""

    user: str
    channel: str
    post: str
    file: str
    media_file: str  # the file in every profile's home holding its `file` canary
    deliver: str  # Hermes' cron `deliver:` value for the platform's home channel
    #: How the platform takes a file a reply attaches: `upload` (its bytes in a request, which the flow scan
    #: reads), `path` (a local path the server reads itself, as signal-cli's daemon does: the stub reads the file,
    #: and the phase scans what it read), `none` (no attachments: Hermes posts a notice instead; no `media` step)
    attachments: str = "upload"
    #: Whether it has channels besides direct messages. Without (email: a chat is its sender), a message "in a
    #: channel" goes as a direct one in a conversation of its own, and none tests a channel allowlist.
    channels: bool = True


@dataclass(frozen=True)
class FixedHost:
    """The API host a platform's SDK fixes (no base-URL setting): every tenant reaches `host` through the proxy's
    regular listener, each request told apart by the canary of a kind of `by` it carries (its tokens; registry
    route `{host: HOST, by: [...]}`, docs/addon.md#shared-hosts). What carries none (a websocket or upload URL
    the stub hands out) goes to the tenant's own host (`issued_host`), the registry service `<name>_issued`. `also`:
    other hosts the SDK fixes, shared alike (Discord's gateway, whose first websocket it opens before any URL is
    issued: a connection whose upgrade carries no token is claimed by the first message that does), each the registry
    service `<name>_<its first label>`."""

    host: str
    by: tuple[str, ...]
    also: tuple[str, ...] = ()

    def entries(self, name: str) -> dict[str, str]:
        """The registry service of each host every tenant shares (`name`'s own first), by its name."""
        return {name: self.host, **{f"{name}_{h.split('.')[0]}": h for h in self.also}}


#: The suffix of the registry service of a platform's tenant's own host (`FixedHost`).
ISSUED = "_issued"


def issued_host(service: str, tenant: str) -> str:
    """The tenant's own host of a service with a `FixedHost`: where the URLs its stub issues point."""
    return f"{service}.{tenant}.{FORWARD_DOMAIN}"


@dataclass(frozen=True)
class ServiceSpec:
    """One service, described once (see the module docstring)."""

    name: str
    summary: str
    rank: int  # its place in every table and option list
    make: Callable[[Tenant, str], Service]  # (tenant, stub mode) -> a stub, not started
    credential: str  # the credential's canary kind
    credential_env: str  # the `.env` variable that holds the credential (the same name in every profile)
    coverage: Coverage
    battery: Battery
    plants: dict[str, Plant]
    identity: tuple[str, ...] = ()
    data: tuple[str, ...] = ()  # other canary kinds: what its answers hold, what the battery sends it
    proxied: bool = True  # behind the proxy on a listener of its own (else: over stdio)
    passive: bool = False  # every turn drives it, tools or not (a connection, a prefetch, a server's start)
    but_second: bool = False  # not configured for the second tenant (which then shows the service's absence)
    optional: bool = True  # chosen with `--services` (the LLM provider is not: every front door needs it)
    slot: str = ""  # the profile setting it takes that holds one service (`memory.provider`): one per run
    by_default: bool = True  # in the run's services when `--services` is not given (else only by name)
    packages: tuple[str, ...] = ()  # distributions of the Hermes venv only its SDK brings (normalized names)
    doors: tuple[str, ...] = ()  # the front doors that drive it (none: every one); elsewhere it is `n/a`
    words: frozenset[str] = frozenset()  # canary kinds the service rewrites to word characters: minted as such
    #: canary kinds of a shape of the service's own (a platform's numeric ids, its ids' prefixes, its token's format):
    #: kind -> the value made from the tenant's tag (`registry.new_tag`: its random bits are what make the value
    #: unique) and the value a canary of that kind has by default
    shapes: dict[str, Callable[[str, str], str]] = field(default_factory=dict)
    configure: Callable[[Tenant, Where], Setup] = lambda t, w: Setup()
    messaging: Messaging | None = None  # a messaging platform of the gateway (a module of `drive.platforms`)
    fixed: FixedHost | None = None  # the host its SDK fixes (no listener of its own in the reverse topology)
    unsettable: tuple[Unset, ...] = ()  # the settings a profile may leave unset (`--unset SERVICE.NAME`)
    #: Its protocol carries no credential (signal-cli's daemon has no authentication): the registry then names
    #: none, so a request without one is no `wrong_key`; `credential` is the identity every call names instead,
    #: which the stub records (a sign-in, a post) for the phase to judge
    keyless: bool = False

    def kinds(self) -> tuple[str, ...]:
        return (self.credential, *self.identity, *self.data)


def edit_config(home: Path, edit: Callable[[dict], None]) -> None:
    """Change a profile's config.yaml in place."""
    path = home / "config.yaml"
    cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    edit(cfg)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")


def edit_json(home: Path, rel: str, edit: Callable[[dict], None]) -> None:
    """Change a JSON file of a profile's home in place (`rel`: its path in the home)."""
    path = home / rel
    doc = json.loads(path.read_text(encoding="utf-8"))
    edit(doc)
    path.write_text(json.dumps(doc), encoding="utf-8")


def set_env(home: Path, name: str, value: str) -> None:
    """Set one variable of a profile's `.env` (the line replaced, or added)."""
    path = home / ".env"
    lines = [ln for ln in path.read_text().splitlines() if not ln.startswith(f"{name}=")]
    path.write_text("\n".join([*lines, f"{name}={value}"]) + "\n")


def credential_plant(credential: str, credential_env: str) -> Plant:
    """The donor's credential under the target's credential variable (its `.env`): a `wrong_key` at the
    service."""
    return Plant(lambda c: set_env(c.target_home, credential_env, c.donor.canaries[credential]),
                 frozenset({"wrong_key"}))


def merged(base: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """`base` with `more` merged in, mapping by mapping (neither is changed)."""
    out = json.loads(json.dumps(base))
    merge(out, json.loads(json.dumps(more)))
    return out


def merge(into: dict[str, Any], more: dict[str, Any]) -> None:
    """Merge `more` into `into`, mapping by mapping."""
    for key, value in more.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value

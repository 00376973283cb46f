"""The scorecard's registry and cases, all drawn from one seed: a positive is one tenant's canary in another
tenant's channel, a decoy a value of the same shape that must not be reported.

Decoys (`channels.DECOYS`): a canary without its last character (`prefix`) or its first (`suffix`), cut in its tag
(`truncated`), one character away (`flipped`), with another tag (`retagged`: a canary of no tenant of the run),
of a tenant not in the run (`stranger`), the tenant's own canary in its own channel (`own`), a hash of a canary
(`hash`), a random string of the canary's alphabet and length (`random`); in a log every tenant shares, a canary
that is no secret (`public`: only secrets count there). Each is encoded exactly as the positives are."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.registry import TAG_MARKER, Registry, Service, Tenant, is_secret_kind
from harness.proof.channels import Channel
from harness.proof.encodings import Encoding

TENANTS = ("alpha", "beta")
#: Every service of a scorecard tenant besides its provider: (credential kind, identity kinds).
SERVICES = {"mcp": ("mcp_key", ()), "memory": ("memory_key", ("memory_user", "memory_agent")),
            "web": ("web_key", ()), "aux": ("aux_key", ("aux_model",))}


def tag(rng: random.Random) -> str:
    """A minted canary's tag: the marker and 48 random bits."""
    return TAG_MARKER + f"{rng.getrandbits(48):012x}"


def mint(rng: random.Random, routes: dict[str, dict[str, Any]]) -> Registry:
    """Two tenants with every kind of canary the audit mints, their homes and workdirs (paths of a sandbox that is
    nowhere, so a seed gives the same values wherever the scorecard runs); `routes`: (tenant or `tenant.service`)
    -> its listener."""
    sandbox = Path("/sandbox") / f"scorecard-{tag(rng)}"
    root = sandbox / "home" / ".hermes" / "profiles"
    tenants = {}
    for name in TENANTS:
        t, s = tag(rng), tag(rng)
        canaries = {
            "api_server_key": f"apisrv-{name}-{t}", "env_marker": f"envmark-{name}-{t}",
            "memory": f"memory-canary-{name}-{t}", "soul": f"soul-canary-{name}-{t}",
            "workdir": str(sandbox / "work" / f"work-{name}-{t}"), "cron_prompt": f"cron-canary-{name}-{t}",
            "shell_state": f"shellstate-{name}-{t}", "home": str(root / name),
            "mcp_key": f"mcpkey-{name}-{s}", "memory_key": f"memorykey-{name}-{s}",
            "memory_user": f"memoryuser-{name}-{s}", "memory_agent": f"memoryagent-{name}-{s}",
            "web_key": f"tvly-{name}-{s}", "aux_key": f"auxkey-{name}-{s}", "aux_model": f"auxmodel-{name}-{s}",
        }
        services = {svc: Service(svc, routes.get(f"{name}.{svc}"), "", cred, ident)
                    for svc, (cred, ident) in SERVICES.items()}
        tenants[name] = Tenant(name, f"sk-tenancy-{name}-{t}", f"model-{name}-{t}", routes.get(name, {}), "",
                               str(root / name), canaries, services)
    return Registry(tenants)


KINDS = ("key", "model", "api_server_key", "env_marker", "memory", "soul", "workdir", "cron_prompt", "shell_state",
         "home", "mcp_key", "memory_key", "memory_user", "memory_agent", "web_key", "aux_key", "aux_model")
SECRET_KINDS = tuple(k for k in KINDS if is_secret_kind(k))


@dataclass(frozen=True)
class Case:
    """One seeded value in one channel: a positive (`decoy` None: `victim`'s canary of `kind`) or a decoy made from
    a canary of `kind`; `seen_in` is the tenant whose channel carries it, `payload` the encoded value."""

    id: str
    channel: str
    encoding: str
    seen_in: str
    kind: str
    victim: str | None
    decoy: str | None
    payload: bytes

    @property
    def positive(self) -> bool:
        return self.decoy is None

    def summary(self) -> dict[str, Any]:
        return {"case": self.id, "channel": self.channel, "encoding": self.encoding, "kind": self.kind,
                "seen_in": self.seen_in, "victim": self.victim, "decoy": self.decoy}


def other(name: str) -> str:
    return TENANTS[1 - TENANTS.index(name)]


def value_of(registry: Registry, tenant: str, kind: str) -> str:
    return registry[tenant].all_canaries()[kind]


def decoy_value(rng: random.Random, registry: Registry, decoy: str, seen_in: str, kind: str) -> str:
    """The decoy `decoy` made from the other tenant's canary of `kind` (or `seen_in`'s own)."""
    value = value_of(registry, other(seen_in), kind)
    tagged = value[value.index(TAG_MARKER):][:len(TAG_MARKER) + 12]
    if decoy == "prefix":
        return value[:-1]
    if decoy == "suffix":
        return value[1:]
    if decoy == "truncated":
        return value[:-6]
    if decoy == "flipped":
        at = value.index(TAG_MARKER) + len(TAG_MARKER) + rng.randrange(12)
        return value[:at] + rng.choice([c for c in "0123456789abcdef" if c != value[at]]) + value[at + 1:]
    if decoy == "retagged":
        return value.replace(tagged, tag(rng))
    if decoy == "stranger":
        return value.replace(tagged, tag(rng)).replace(other(seen_in), "gamma")
    if decoy == "own":
        return value_of(registry, seen_in, kind)
    if decoy == "public":  # a canary that is no secret, whole: `plan` draws its kind
        return value
    if decoy == "hash":
        return rng.choice([hashlib.sha256, hashlib.md5, hashlib.sha1])(value.encode()).hexdigest()
    if decoy == "random":
        alphabet = sorted(set(value))
        return "".join(rng.choice(alphabet) for _ in value)
    raise ValueError(f"unknown decoy {decoy!r}")


@dataclass(frozen=True)
class Sample:
    """How many cases per channel and encoding: positives (each of another kind) and decoys (each of another
    type)."""

    positives: int = 4
    decoys: int = 4


def plan(rng: random.Random, registry: Registry, channel: Channel, encodings: tuple[Encoding, ...], sample: Sample,
         first: int) -> Iterator[Case]:
    """The cases of one channel: for every encoding it carries, `sample.positives` kinds and
    `sample.decoys` decoy types, drawn in turn so every kind and type comes up; ids from `first`."""
    n = first
    kinds = list(SECRET_KINDS if channel.secrets_only else KINDS)
    decoys = list(channel.decoys)
    rng.shuffle(kinds)
    rng.shuffle(decoys)
    k = d = 0
    for enc in encodings:
        if not channel.carries(enc.name):
            continue
        drawn = []
        for _ in range(sample.positives):
            drawn.append((None, kinds[k % len(kinds)]))
            k += 1
        for _ in range(sample.decoys):
            decoy = decoys[d % len(decoys)]
            d += 1
            pool = [x for x in KINDS if not is_secret_kind(x)] if decoy == "public" else KINDS
            drawn.append((decoy, rng.choice(pool)))
        for decoy, kind in drawn:
            seen_in = rng.choice(TENANTS)
            if decoy is None:
                value = value_of(registry, other(seen_in), kind)
            else:
                value = decoy_value(rng, registry, decoy, seen_in, kind)
            payload = enc.apply(value.encode())
            if not channel.fits(payload):
                continue
            yield Case(f"case{n:05d}", channel.name, enc.name, seen_in, kind, other(seen_in) if decoy is None else None,
                       decoy, payload)
            n += 1

"""Every credentialed service a tenant's Hermes profile talks to besides its LLM provider, one entry each:
which stub stands in for it, the canaries it needs, and how a profile is configured to use it.

Each service has the same shape (`ServiceSpec`): a stub kind from `harness.capture.services` (one instance
per tenant, behind the proxy on a listener of its own unless it is reached over stdio), a credential canary
kind (the same variable NAME in every profile's `.env`, a different VALUE: the shape that exposed F1), the
identity kinds the tenant has at that service, the data kinds its answers or the battery's calls carry, and
`configure`, which returns what goes into the profile: config.yaml keys, `.env` lines, other files.

- `mcp`: an MCP server over streamable HTTP (`mcp_servers.tenancy.url`, bearer `TENANCY_MCP_KEY`), tools
  `mcp__tenancy__*`;
- `mcp_stdio`: an MCP server over stdio (`mcp_servers.tenancy_stdio.command`, `TENANCY_MCP_STDIO_KEY` in its
  env), tools `mcp__tenancy_stdio__*`;
- `memory`: the mem0 memory provider, self-hosted (`memory.provider: mem0`, host and user/agent ids in
  `mem0.json`, `MEM0_API_KEY`), tools `mem0_*` and every turn's prefetch and sync;
- `web`: the Tavily web backend (`TAVILY_BASE_URL`, `TAVILY_API_KEY`), tools `web_search`, `web_extract`;
- `aux`: the auxiliary models for titles and vision (`auxiliary.*` with `key_env: TENANCY_AUX_KEY` and a model
  of the tenant's own), the `vision_analyze` tool and every session's title;
- `delegation`: the subagents' model (a `delegation:` block with its own `base_url`, `model` and
  `api_key: ${TENANCY_DELEGATION_KEY}`), as a user who gives subagents a cheaper model configures it; every
  tenant but the second has one (the second's subagents use its own provider, so both shapes are driven).
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.capture.services.base import Service
from harness.capture.services.mcp_http import PATH as MCP_PATH
from harness.capture.services.mcp_http import McpHttpStub
from harness.capture.services.mcp_stdio import SERVER_NAME as STDIO_SERVER
from harness.capture.services.mcp_stdio import TOKEN_ENV as STDIO_TOKEN_ENV
from harness.capture.services.mcp_tools import SERVER_NAME as HTTP_SERVER
from harness.capture.services.mem0 import Mem0Stub
from harness.capture.services.provider import StubProvider
from harness.capture.services.tavily import TavilyStub
from harness.core.places import SOURCE
from harness.core.registry import Registry, Tenant, new_tag
from harness.core.registry import Service as RegistryService

#: A 1x1 PNG: the picture the battery asks `vision_analyze` about (the auxiliary vision model is a stub).
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5E"
                       "rkJggg==")


@dataclass(frozen=True)
class Setup:
    """What one service adds to a tenant's profile."""

    config: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)  # relative to the profile's home
    workdir_files: dict[str, bytes] = field(default_factory=dict)  # relative to the tenant's terminal cwd


@dataclass(frozen=True)
class Where:
    """Where a tenant's service is reached: its URL through the proxy (none over stdio), and for stdio servers
    the registry and the folder they record into."""

    url: str = ""
    registry: Path | None = None
    record: Path | None = None


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    summary: str
    make: Callable[[Tenant, str], Service]  # (tenant, stub mode) -> a stub, not started
    credential: str
    credential_env: str  # the `.env` variable that holds the credential (the same name in every profile)
    identity: tuple[str, ...] = ()
    data: tuple[str, ...] = ()  # other canary kinds: what its answers hold, what the battery sends it
    proxied: bool = True  # behind the proxy on a listener of its own (else: over stdio)
    feature: str = ""  # the `drive.features.Features` field a release needs for it
    group: str = ""  # the battery group whose tools drive it
    passive: bool = False  # every turn drives it, tools or not (a connection, a prefetch, a server's start)
    forward: str = ""  # why it cannot be audited in the forward topology ("" when it can)
    but_second: bool = False  # not configured for the second tenant (which then shows the service's absence)
    configure: Callable[[Tenant, Where], Setup] = lambda t, w: Setup()

    def kinds(self) -> tuple[str, ...]:
        return (self.credential, *self.identity, *self.data)


def _mcp(t: Tenant, where: Where) -> Setup:
    return Setup(config={"mcp_servers": {HTTP_SERVER: {
        "url": where.url + MCP_PATH, "headers": {"Authorization": "Bearer ${TENANCY_MCP_KEY}"},
        "timeout": 30, "connect_timeout": 15, "skip_preflight": True, "supports_parallel_tool_calls": True,
        "tools": {"resources": False, "prompts": False},
    }}}, env={"TENANCY_MCP_KEY": t.canaries["mcp_key"]})


def _mcp_stdio(t: Tenant, where: Where) -> Setup:
    args = ["-m", "harness.capture.services.mcp_stdio", "--registry", str(where.registry), "--tenant", t.name,
            "--log", str(where.record)]
    # Hermes gives the server a filtered env: PYTHONPATH names this very harness (a checkout, a worktree, a wheel)
    env = {STDIO_TOKEN_ENV: "${" + STDIO_TOKEN_ENV + "}", "PYTHONPATH": str(SOURCE)}
    return Setup(config={"mcp_servers": {STDIO_SERVER: {
        "command": sys.executable, "args": args, "env": env,
        "timeout": 30, "connect_timeout": 30, "supports_parallel_tool_calls": True,
        "tools": {"resources": False, "prompts": False},
    }}}, env={STDIO_TOKEN_ENV: t.canaries["mcp_stdio_key"]})


def _memory(t: Tenant, where: Where) -> Setup:
    mem0 = {"host": where.url, "user_id": t.canaries["memory_user"], "agent_id": t.canaries["memory_agent"],
            "rerank": False}
    return Setup(config={"memory": {"provider": "mem0"}, "security": {"allow_lazy_installs": False}},
                 env={"MEM0_API_KEY": t.canaries["memory_key"]},
                 files={"mem0.json": json.dumps(mem0, indent=2).encode()})


def _web(t: Tenant, where: Where) -> Setup:
    return Setup(config={"web": {"backend": "tavily"},
                         "security": {"allow_private_urls": True, "allow_lazy_installs": False}},
                 env={"TAVILY_API_KEY": t.canaries["web_key"], "TAVILY_BASE_URL": where.url})


def _delegation(t: Tenant, where: Where) -> Setup:
    return Setup(config={"delegation": {"base_url": f"{where.url}/v1", "model": t.canaries["delegation_model"],
                                        "api_key": "${TENANCY_DELEGATION_KEY}"}},
                 env={"TENANCY_DELEGATION_KEY": t.canaries["delegation_key"]})


def image_name(tenant: str) -> str:
    return f"tenancy-{tenant}.png"


def _aux(t: Tenant, where: Where) -> Setup:
    task = {"provider": "custom", "base_url": f"{where.url}/v1", "model": t.canaries["aux_model"],
            "key_env": "TENANCY_AUX_KEY"}
    return Setup(config={"auxiliary": {"title_generation": dict(task), "vision": dict(task)}},
                 env={"TENANCY_AUX_KEY": t.canaries["aux_key"]}, workdir_files={image_name(t.name): PNG})


SERVICES: dict[str, ServiceSpec] = {s.name: s for s in (
    ServiceSpec("mcp", "an MCP server over streamable HTTP", lambda t, m: McpHttpStub(t, m), "mcp_key",
                "TENANCY_MCP_KEY", data=("mcp_record", "mcp_note"), feature="mcp", group="mcp", passive=True,
                configure=_mcp),
    ServiceSpec("mcp_stdio", "an MCP server over stdio", lambda t, m: _NoStub(t), "mcp_stdio_key",
                STDIO_TOKEN_ENV, data=("mcp_stdio_record", "mcp_note"), proxied=False, feature="mcp", group="mcp",
                passive=True, configure=_mcp_stdio),
    ServiceSpec("memory", "the mem0 memory provider (self-hosted)", lambda t, m: Mem0Stub(t, m), "memory_key",
                "MEM0_API_KEY", identity=("memory_user", "memory_agent"), data=("memory_record", "memory_note"),
                feature="mem0", group="mem0", passive=True, configure=_memory,
                forward="Hermes' mem0 client gives httpx a transport of its own, which ignores HTTPS_PROXY"),
    ServiceSpec("web", "the Tavily web search API", lambda t, m: TavilyStub(t, m), "web_key", "TAVILY_API_KEY",
                data=("web_record", "web_query"), feature="tavily", group="web", configure=_web),
    ServiceSpec("aux", "the auxiliary models (titles, vision)",
                lambda t, m: StubProvider(t, m, service="aux"), "aux_key", "TENANCY_AUX_KEY", identity=("aux_model",),
                feature="aux", group="vision", configure=_aux),
    ServiceSpec("delegation", "the subagents' model (a delegation block)",
                lambda t, m: StubProvider(t, m, service="delegation"), "delegation_key", "TENANCY_DELEGATION_KEY",
                identity=("delegation_model",), feature="delegation", group="delegate", but_second=True,
                configure=_delegation),
)}


@dataclass
class _NoStub:
    """A service without a stub in this process (a stdio server runs as Hermes' child)."""

    tenant: Tenant
    service: str = "mcp_stdio"

    def start(self) -> _NoStub:
        return self

    @property
    def url(self) -> str:
        return ""

    def snapshot(self) -> list:
        return []

    def stop(self) -> None:
        return None


def check(names: list[str]) -> list[str]:
    """Unknown service names (for the option check)."""
    return [n for n in names if n not in SERVICES]


def mint(registry: Registry, names: list[str]) -> None:
    """Mint the canaries of the services `names` for every tenant (one tag per tenant and call)."""
    for t in registry:
        tag = new_tag()
        for name in names:
            for kind in SERVICES[name].kinds():
                if kind not in t.canaries:
                    registry.add_canary(t.name, kind, f"{kind.replace('_', '')}-{t.name}-{tag}")


def attach(registry: Registry, name: str, tenant: str, route: dict[str, Any] | None, upstream: str) -> None:
    """Record a tenant's service in the registry: its listener (None over stdio), upstream and canary kinds."""
    spec = SERVICES[name]
    registry[tenant].services[name] = RegistryService(name, route, upstream, spec.credential, spec.identity)
    registry.validate()


def setup(tenant: Tenant, names: list[str], where: dict[str, Where], *, second: bool = False) -> Setup:
    """Everything the services `names` add to one profile, merged (`second`: the run's second tenant)."""
    merged = Setup()
    for name in names:
        if second and SERVICES[name].but_second:
            continue
        part = SERVICES[name].configure(tenant, where[name])
        _merge(merged.config, part.config)
        merged.env.update(part.env)
        merged.files.update(part.files)
        merged.workdir_files.update(part.workdir_files)
    return merged


def merged(base: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """`base` with `more` merged in, mapping by mapping (neither is changed)."""
    out = json.loads(json.dumps(base))
    _merge(out, json.loads(json.dumps(more)))
    return out


def _merge(into: dict[str, Any], more: dict[str, Any]) -> None:
    for key, value in more.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value

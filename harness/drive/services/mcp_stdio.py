"""An MCP server over stdio (the same tools as `mcp`; the program `python -m harness.capture.stubs.mcp_stdio`,
which records what it receives): the profile's `mcp_servers.tenancy_stdio`, its credential
`TENANCY_MCP_STDIO_KEY` passed in the server's env; tools `mcp__tenancy_stdio__remember`/`recall`. Its start
(env, argv, cwd) is checked on every turn."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from harness.capture.stubs.mcp_stdio import SERVER_NAME, TOKEN_ENV
from harness.capture.stubs.provider import ToolStep
from harness.core.places import SOURCE
from harness.core.registry import Tenant
from harness.drive.services.mcp import DISCOVERY_WAIT, LACKS, PROBE
from harness.drive.surface import Battery, Coverage, ServiceSpec, Setup, Turn, Where, credential_plant

REMEMBER, RECALL = f"mcp__{SERVER_NAME}__remember", f"mcp__{SERVER_NAME}__recall"


def configure(t: Tenant, where: Where) -> Setup:
    args = ["-m", "harness.capture.stubs.mcp_stdio", "--registry", str(where.registry), "--tenant", t.name,
            "--log", str(where.record)]
    # Hermes gives the server a filtered env: PYTHONPATH names this very harness (a checkout, a worktree, a wheel)
    env = {TOKEN_ENV: "${" + TOKEN_ENV + "}", "PYTHONPATH": str(SOURCE)}
    return Setup(config={**DISCOVERY_WAIT, "mcp_servers": {SERVER_NAME: {
        "command": sys.executable, "args": args, "env": env,
        "timeout": 30, "connect_timeout": 30, "supports_parallel_tool_calls": True,
        "tools": {"resources": False, "prompts": False},
    }}}, env={TOKEN_ENV: t.canaries["mcp_stdio_key"]})


@dataclass
class NoStub:
    """No stub in this process: the server runs as Hermes' child and records itself."""

    tenant: Tenant
    service: str = "mcp_stdio"

    def start(self) -> NoStub:
        return self

    @property
    def url(self) -> str:
        return ""

    def snapshot(self) -> list:
        return []

    def stop(self) -> None:
        return None


def _writes(u: Turn) -> list[ToolStep]:
    return [ToolStep(REMEMBER, {"note": f"{u.tenant.canaries['mcp_note']} ({u.scenario})"})]


SERVICE = ServiceSpec(
    "mcp_stdio", "an MCP server over stdio", rank=20, make=lambda t, m: NoStub(t), credential="mcp_stdio_key",
    credential_env=TOKEN_ENV, data=("mcp_stdio_record", "mcp_note"), proxied=False, passive=True,
    configure=configure, coverage=Coverage(PROBE, LACKS),
    battery=Battery("mcp", tools=(REMEMBER, RECALL), parallel_safe=frozenset({REMEMBER, RECALL}), writes=_writes,
                    reads=lambda u: [ToolStep(RECALL, {})], lookups=lambda u: [ToolStep(RECALL, {})]),
    plants={"mcp-stdio-key": credential_plant("mcp_stdio_key", TOKEN_ENV)},
)

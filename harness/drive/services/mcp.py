"""An MCP server over streamable HTTP (the official `mcp` SDK's server, stateless, JSON answers): the profile's
`mcp_servers.tenancy` with a bearer key from `TENANCY_MCP_KEY`; tools `mcp__tenancy__remember`/`recall`. The
client's `initialize` and `tools/list` reach it on every start, tools or not."""

from __future__ import annotations

from harness.capture.stubs.mcp_http import PATH, McpHttpStub
from harness.capture.stubs.mcp_tools import SERVER_NAME
from harness.capture.stubs.provider import ToolStep
from harness.core.registry import Tenant
from harness.drive.surface import Battery, Coverage, ServiceSpec, Setup, Where, credential_plant

REMEMBER, RECALL = f"mcp__{SERVER_NAME}__remember", f"mcp__{SERVER_NAME}__recall"
#: The features probe's test for an MCP client (shared with `mcp_stdio`).
PROBE = 'has("tools.mcp_tool") and has("mcp")'
LACKS = "no MCP client (tools/mcp_tool.py) or no `mcp` SDK in the Hermes venv"
#: How long Hermes' backends wait for their MCP servers before they first list their tools to the model (its
#: `mcp_discovery_timeout`, 1.5 s by default; the wait ends as soon as discovery does). A server found later is
#: offered from a later turn on only, and on a loaded machine discovery can take longer than the default. (The
#: one-shot CLI does not wait at all: see `capture.stubs.mcp_stdio`.)
DISCOVERY_WAIT = {"mcp_discovery_timeout": 10}


def configure(t: Tenant, where: Where) -> Setup:
    return Setup(config={**DISCOVERY_WAIT, "mcp_servers": {SERVER_NAME: {
        "url": where.url + PATH, "headers": {"Authorization": "Bearer ${TENANCY_MCP_KEY}"},
        "timeout": 30, "connect_timeout": 15, "skip_preflight": True, "supports_parallel_tool_calls": True,
        "tools": {"resources": False, "prompts": False},
    }}}, env={"TENANCY_MCP_KEY": t.canaries["mcp_key"]})


SERVICE = ServiceSpec(
    "mcp", "an MCP server over streamable HTTP", rank=10, make=lambda t, m: McpHttpStub(t, m),
    credential="mcp_key", credential_env="TENANCY_MCP_KEY", data=("mcp_record", "mcp_note"), passive=True,
    configure=configure, coverage=Coverage(PROBE, LACKS),
    battery=Battery("mcp", tools=(REMEMBER, RECALL), parallel_safe=frozenset({REMEMBER, RECALL}),
                    writes=lambda u: [ToolStep(REMEMBER, {"note": f"{u.tenant.canaries['mcp_note']} ({u.scenario})"})],
                    reads=lambda u: [ToolStep(RECALL, {})], lookups=lambda u: [ToolStep(RECALL, {})]),
    plants={"mcp-key": credential_plant("mcp_key", "TENANCY_MCP_KEY")},
)

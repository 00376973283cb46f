"""The tools of a tenant's MCP server (the same over streamable HTTP and stdio): over HTTP on the official `mcp`
SDK (`server`), over stdio answered by `mcp_stdio` with the SDK's answers (`TOOL_LIST`; a test holds the two equal).

- `remember(note)`: the server keeps the note (the battery writes a canary of the calling tenant);
- `recall()`: the server's record of its tenant (its record canary) and every note it keeps.

A server belongs to one tenant. A note of another tenant reaching it, or its record reaching another
tenant's provider, is what the audit looks for (a client shared across profiles shows both ways).
"""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcp.server.fastmcp import FastMCP

#: The MCP server's name in every profile's config.yaml (the same name everywhere: the collision shape).
SERVER_NAME = "tenancy"
DESCRIPTIONS = {"remember": "Keep a note on this tenant's server.",
                "recall": "Read this tenant's record and every note kept on its server."}
TOOLS = tuple(DESCRIPTIONS)


def _schema(title: str, fields: tuple[str, ...]) -> dict[str, Any]:
    """An object of string fields, as the SDK derives it from a tool's signature (pydantic's titles)."""
    schema: dict[str, Any] = {"properties": {name: {"title": name.title(), "type": "string"} for name in fields}}
    if fields:
        schema["required"] = list(fields)
    return {**schema, "title": title, "type": "object"}


#: `tools/list`'s tools as the SDK's server lists them (input from the signature, output: the returned string).
TOOL_LIST = [{"name": name, "description": DESCRIPTIONS[name],
              "inputSchema": _schema(f"{name}Arguments", ("note",) if name == "remember" else ()),
              "outputSchema": _schema(f"{name}Output", ("result",))} for name in TOOLS]


@dataclass
class Notes:
    """What one server keeps: its tenant's record and the notes it was given."""

    tenant: str
    record: str
    notes: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def remember(self, note: str) -> str:
        with self.lock:
            self.notes.append(note)
            n = len(self.notes)
        return json.dumps({"stored": n, "server": self.tenant})

    def recall(self) -> str:
        with self.lock:
            notes = list(self.notes)
        return json.dumps({"record": f"mcp record of {self.tenant}: {self.record}", "notes": notes})


def server(notes: Notes, on_call: Callable[[str, dict[str, Any], str], None] | None = None) -> FastMCP:
    """A FastMCP server with the two tools over `notes`; `on_call(tool, arguments, result)` after each call.
    Stateless with JSON responses: no session id, so Hermes opens no event stream and every call is one
    request and one response through the proxy."""
    from mcp.server.fastmcp import FastMCP  # the SDK loads only where a server over HTTP is made
    from mcp.server.transport_security import TransportSecuritySettings

    with warnings.catch_warnings():  # pydantic-settings warns about the SDK's own settings model (not ours to fix)
        warnings.filterwarnings("ignore", message="Field 'lifespan' has an incomplete definition")
        mcp = FastMCP(SERVER_NAME, stateless_http=True, json_response=True, log_level="ERROR",
                      transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))

    def done(tool: str, arguments: dict[str, Any], result: str) -> str:
        if on_call is not None:
            on_call(tool, arguments, result)
        return result

    @mcp.tool(description=DESCRIPTIONS["remember"])
    def remember(note: str) -> str:
        return done("remember", {"note": note}, notes.remember(note))

    @mcp.tool(description=DESCRIPTIONS["recall"])
    def recall() -> str:
        return done("recall", {}, notes.recall())

    return mcp

"""A tenant's MCP server over stdio: the program Hermes starts from a profile's `mcp_servers` entry
(`command` + `args` + `env`), and the harness's reading of what it recorded.

    python -m harness.capture.stubs.mcp_stdio --registry REGISTRY --tenant NAME --log FOLDER

It serves the tools of `mcp_tools` (the HTTP server's, answered as the SDK answers them) over stdio: one
JSON-RPC message a line. It is not behind the proxy: a pipe has no flows. It records itself instead,
one JSON line each, to `FOLDER/mcp_stdio-NAME-PID.jsonl` (0600): first how it was started (its argv, its
whole environment, its cwd, and whether `TENANCY_MCP_STDIO_KEY` held its tenant's credential), then every
tool call with its arguments and result. The reconciler checks that record like a tool subprocess's env
snapshot and like a service's requests and responses (`detect.services`).

Not on the SDK: Hermes' one-shot CLI lists its tools to the model once, when its turn starts, without waiting
for its MCP servers; the SDK's import (0.7 s of CPU) made this server miss that moment on a loaded machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from harness.capture.stubs import mcp_tools

#: The server's name in the profiles' config.yaml, and the variable its credential reaches it in.
SERVER_NAME = "tenancy_stdio"
SERVICE = "mcp_stdio"
TOKEN_ENV = "TENANCY_MCP_STDIO_KEY"
RECORD_KIND = "mcp_stdio_record"
#: Where the server records a tool call.
Record = Callable[[dict[str, Any]], None]
#: The protocol versions the SDK's server (mcp 1.26) accepts; a client asking for another gets the newest.
VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
#: The SDK's server's `initialize` answer but for the protocol version.
SERVER = {"capabilities": {"experimental": {}, "prompts": {"listChanged": False},
                           "resources": {"subscribe": False, "listChanged": False}, "tools": {"listChanged": False}},
          "serverInfo": {"name": mcp_tools.SERVER_NAME, "version": "1.26.0"}}
#: What the SDK's server answers to the listings of what this server does not offer.
EMPTY = {"resources/list": {"resources": []}, "resources/templates/list": {"resourceTemplates": []},
         "prompts/list": {"prompts": []}, "ping": {}, "logging/setLevel": {}}


def log_name(tenant: str, pid: int) -> str:
    return f"{SERVICE}-{tenant}-{pid}.jsonl"


def _writer(path: Path) -> Any:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    out = os.fdopen(fd, "a", encoding="utf-8")

    def write(entry: dict[str, Any]) -> None:
        out.write(json.dumps({"time": time.time(), **entry}) + "\n")
        out.flush()

    return write


def _call(notes: mcp_tools.Notes, params: dict[str, Any], record: Record) -> dict[str, Any]:
    name, arguments = params.get("name"), params.get("arguments") or {}
    if name not in mcp_tools.TOOLS:
        return {"content": [{"type": "text", "text": f"Unknown tool: {name}"}], "isError": True}
    result = notes.remember(str(arguments.get("note", ""))) if name == "remember" else notes.recall()
    record({"event": "call", "tool": name, "arguments": arguments, "result": result})
    return {"content": [{"type": "text", "text": result}], "structuredContent": {"result": result}, "isError": False}


def answer(message: dict[str, Any], notes: mcp_tools.Notes, record: Record) -> dict[str, Any] | None:
    """The reply to one JSON-RPC message (None for a notification)."""
    method, params = message.get("method"), message.get("params") or {}
    if "id" not in message:
        return None
    reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
    if method == "initialize":
        asked = params.get("protocolVersion")
        reply["result"] = {"protocolVersion": asked if asked in VERSIONS else VERSIONS[-1], **SERVER}
    elif method == "tools/list":
        reply["result"] = {"tools": mcp_tools.TOOL_LIST}
    elif method == "tools/call":
        reply["result"] = _call(notes, params, record)
    elif method in EMPTY:
        reply["result"] = EMPTY[method]
    else:  # as the SDK answers a request it does not know
        reply["error"] = {"code": -32602, "message": "Invalid request parameters", "data": ""}
    return reply


def serve(notes: mcp_tools.Notes, record: Record, stdin: TextIO, stdout: TextIO) -> None:
    """Answer every message on `stdin` until it closes."""
    for line in stdin:
        try:
            message = json.loads(line)
        except ValueError:
            reply: dict[str, Any] | None = {"jsonrpc": "2.0", "id": None,
                                            "error": {"code": -32700, "message": "Parse error"}}
        else:
            reply = answer(message, notes, record) if isinstance(message, dict) else None
        if reply is not None:
            stdout.write(json.dumps(reply, separators=(",", ":")) + "\n")
            stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mcp_stdio", description=__doc__.splitlines()[0])
    parser.add_argument("--registry", required=True)
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--log", required=True, help="the folder of the server's record")
    args = parser.parse_args(argv)
    from harness.core.registry_file import load

    tenant = load(args.registry)[args.tenant]
    write = _writer(Path(args.log) / log_name(tenant.name, os.getpid()))
    token = os.environ.get(TOKEN_ENV)
    expected = tenant.credential(SERVICE)
    write({"event": "start", "tenant": tenant.name, "argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd(),
           "pid": os.getpid(), "wrong_key": token != expected, "key_present": token is not None})
    serve(mcp_tools.Notes(tenant.name, tenant.canaries.get(RECORD_KIND, "")), write, sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

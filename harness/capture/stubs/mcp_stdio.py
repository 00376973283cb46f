"""A tenant's MCP server over stdio: the program Hermes starts from a profile's `mcp_servers` entry
(`command` + `args` + `env`), and the harness's reading of what it recorded.

    python -m harness.capture.stubs.mcp_stdio --registry REGISTRY --tenant NAME --log FOLDER

The server (`mcp_tools.server`) is not behind the proxy: a pipe has no flows. It records itself instead,
one JSON line each, to `FOLDER/mcp_stdio-NAME-PID.jsonl` (0600): first how it was started (its argv, its
whole environment, its cwd, and whether `TENANCY_MCP_STDIO_KEY` held its tenant's credential), then every
tool call with its arguments and result. The reconciler checks that record like a tool subprocess's env
snapshot and like a service's requests and responses (`detect.services`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

#: The server's name in the profiles' config.yaml, and the variable its credential reaches it in.
SERVER_NAME = "tenancy_stdio"
SERVICE = "mcp_stdio"
TOKEN_ENV = "TENANCY_MCP_STDIO_KEY"
RECORD_KIND = "mcp_stdio_record"


def log_name(tenant: str, pid: int) -> str:
    return f"{SERVICE}-{tenant}-{pid}.jsonl"


def _writer(path: Path) -> Any:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    out = os.fdopen(fd, "a", encoding="utf-8")

    def write(entry: dict[str, Any]) -> None:
        out.write(json.dumps({"time": time.time(), **entry}) + "\n")
        out.flush()

    return write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mcp_stdio", description=__doc__.splitlines()[0])
    parser.add_argument("--registry", required=True)
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--log", required=True, help="the folder of the server's record")
    args = parser.parse_args(argv)
    from harness.capture.stubs import mcp_tools  # the SDK loads after the arguments are known good
    from harness.core.registry_file import load

    tenant = load(args.registry)[args.tenant]
    write = _writer(Path(args.log) / log_name(tenant.name, os.getpid()))
    token = os.environ.get(TOKEN_ENV)
    expected = tenant.credential(SERVICE)
    write({"event": "start", "tenant": tenant.name, "argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd(),
           "pid": os.getpid(), "wrong_key": token != expected, "key_present": token is not None})
    notes = mcp_tools.Notes(tenant.name, tenant.canaries.get(RECORD_KIND, ""))
    server = mcp_tools.server(notes, lambda tool, arguments, result: write(
        {"event": "call", "tool": tool, "arguments": arguments, "result": result}))
    server.run("stdio")
    return 0


if __name__ == "__main__":
    sys.exit(main())

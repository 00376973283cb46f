"""mitmdump as the harness runs it: `python -P -m harness.capture.mitmdump_main [mitmdump options]` (see `proxy.Proxy`).

It is mitmdump with three differences, each for the audit:
- **Listeners handed over.** The harness binds every listener itself and passes the sockets down
  (`TENANCY_LISTEN_FDS="port=fd,..."`). mitmproxy's servers are started on those sockets instead of binding
  anew, so a connection made while mitmdump still starts waits in the kernel's backlog (never refused),
  and no port can be taken between choosing it and listening on it. Once every handed socket is served,
  one byte on `TENANCY_READY_FD` says so; the pipe closing without it says mitmdump exited first.
- **The addon** (`TENANCY_ADDON`) is added where mitmproxy puts an `-s` script (right after its script
  loader, so before `save` writes a flow) and configured while the options are parsed, so before any
  server exists; an error in it ends mitmdump before it serves. (mitmproxy loads an `-s` script from a
  task of its own; that this task runs before the first flow's hooks is event-loop ordering, not a
  guarantee.)
- **Exit.** Once mitmproxy returns, every addon's `done` has run (flows.mitm and the ledger are closed);
  the atexit handlers run and the buffers are flushed, and only the interpreter's teardown, 0.2-0.3 s of
  freeing objects, is skipped. An error exit (SystemExit) still exits the ordinary way.

The process is named `mitmdump` (argv[0]; on Linux also the name ps and psutil show).
"""

from __future__ import annotations

import asyncio
import atexit
import importlib.util
import os
import socket
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


def _name_process() -> None:
    sys.argv[0] = "mitmdump"
    try:
        with open("/proc/self/comm", "w") as comm:
            comm.write("mitmdump")
    except OSError:
        pass


def _serve_on_handed_sockets(handed: dict[int, int], ready: int) -> None:
    """Make `asyncio.start_server(handler, host, port)` serve on the socket handed for `port`."""
    expected, serving = len(handed), set()
    start_server = asyncio.start_server

    async def serve_handed(handler: Callable[..., Any], host: Any = None, port: Any = None,
                           **kwargs: Any) -> asyncio.Server:
        fd = handed.pop(port, None)
        if fd is None:
            return await start_server(handler, host, port, **kwargs)
        server = await start_server(handler, sock=socket.socket(fileno=fd), **kwargs)
        serving.add(port)  # the servers start concurrently: ready when the last of them serves
        if len(serving) == expected:
            os.write(ready, b"1")
            os.close(ready)
        return server

    asyncio.start_server = serve_handed  # type: ignore[assignment]


def _load_addon(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("tenancy_addon", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"mitmdump: cannot load the addon {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    _name_process()
    handed = {int(port): int(fd) for port, fd in
              (item.split("=") for item in os.environ.pop("TENANCY_LISTEN_FDS").split(","))}
    _serve_on_handed_sockets(handed, int(os.environ.pop("TENANCY_READY_FD")))
    addon = _load_addon(os.environ.pop("TENANCY_ADDON"))

    from mitmproxy.tools import cmdline, dump
    from mitmproxy.tools import main as tools

    class Master(dump.DumpMaster):
        def __init__(self, options: Any, **kwargs: Any) -> None:
            super().__init__(options, **kwargs)
            at = self.addons.chain.index(self.addons.get("scriptloader")) + 1
            self.addons.chain[at:at] = [self.addons.register(a) for a in addon.addons]

    tools.run(Master, cmdline.mitmdump, None)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

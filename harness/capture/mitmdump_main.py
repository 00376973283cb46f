"""mitmdump as the harness runs it: `python -P -m harness.capture.mitmdump_main [mitmdump options]` (see `proxy.Proxy`).

It is mitmdump (mitmproxy's own `tools.main.run` with a `DumpMaster`) with four differences, each for the audit:
- **Listeners handed over.** The harness binds every listener and passes the sockets down
  (`TENANCY_LISTEN_FDS="port=fd,..."`); mitmproxy's servers serve them instead of binding anew. A connection
  made while mitmdump still starts waits in the kernel's backlog, so the audit's turns need not wait for
  mitmdump's start (about 1 s), and no port can be taken between choosing it and serving it.
- **Ready.** One byte on `TENANCY_READY_FD` once mitmproxy runs (its `running` event: every server is up, and
  every handed socket must be among them); the pipe closing without it says mitmdump exited first.
- **The addon** (`harness.capture.addon.Tenancy`) is where mitmproxy puts an `-s` script (right after its
  script loader, so it marks a flow before `save` writes it) from the start: it is configured while the
  options are parsed, and an error in it ends mitmdump before it serves. (`-s` loads a script from a task
  of its own, which may run after the first connection is served.)
- **Exit.** Once mitmproxy returns, every addon's `done` has run (flows.mitm and the ledger are closed); the
  atexit handlers run, the buffers are flushed, and only the interpreter's teardown (0.3-0.5 s of freeing
  objects, on the audit's path) is skipped. An error exit (SystemExit) still exits the ordinary way.

Three of these need what mitmproxy or CPython do not publish; each is one function below
(`serve_handed_sockets`, `add_after_scriptloader`, `exit_skipping_teardown`), and tests/test_mitmdump_main.py
checks what it relies on, so that an upgrade fails there, naming the function, rather than in an audit.

The process is named `mitmdump` (argv[0]; on Linux also the name ps and psutil show).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mitmproxy.options import Options
    from mitmproxy.tools.dump import DumpMaster


def serve_handed_sockets(handed: dict[int, int]) -> None:
    """Make `asyncio.start_server(handler, host, port)` serve the socket handed for `port` (and take it out of
    `handed`); other ports bind as usual.

    Private hook: mitmproxy has no way to serve a socket it is given; its TCP servers
    (`mitmproxy.proxy.mode_servers.AsyncioServerInstance.listen`) call `asyncio.start_server` this way."""
    start_server = asyncio.start_server

    async def serve_handed(handler: Callable[..., Any], host: Any = None, port: Any = None,
                           **kwargs: Any) -> asyncio.Server:
        fd = handed.pop(port, None)
        if fd is None:
            return await start_server(handler, host, port, **kwargs)
        return await start_server(handler, sock=socket.socket(fileno=fd), **kwargs)

    asyncio.start_server = serve_handed  # type: ignore[assignment]


def add_after_scriptloader(master: DumpMaster, addon: Any) -> None:
    """Put `addon` in the master's chain where an `-s` script goes: right after the script loader, so its hooks
    run before those of the addons after it (`save` writes a flow in its own `response` hook).

    Private hook: `AddonManager.add` only appends (after `save`); `register` loads an addon without chaining it,
    and `AddonManager.chain` is the list every event runs through, in order."""
    chain = master.addons.chain
    chain.insert(chain.index(master.addons.get("scriptloader")) + 1, master.addons.register(addon))


def exit_skipping_teardown() -> None:
    """Run the atexit handlers, flush stdout and stderr, and exit 0 without the interpreter's teardown.

    Private hook: `atexit._run_exitfuncs` (CPython) is what the interpreter runs at exit."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class Ready:
    """Writes the ready byte on mitmproxy's `running` event (public: after every server is up; added last, so
    after every other addon's `running`), unless a handed listener is not served by any `--mode`."""

    def __init__(self, handed: dict[int, int], fd: int) -> None:
        self.handed, self.fd = handed, fd

    def running(self) -> None:
        if self.handed:
            raise SystemExit(f"mitmdump: no --mode serves the listener handed for port(s) "
                             f"{', '.join(map(str, sorted(self.handed)))}")
        os.write(self.fd, b"1")
        os.close(self.fd)


def handed_listeners(spec: str) -> dict[int, int]:
    """`"port=fd,port=fd"` -> {port: fd}."""
    return {int(port): int(fd) for port, fd in (item.split("=") for item in spec.split(","))}


def _name_process() -> None:
    sys.argv[0] = "mitmdump"
    try:
        with open("/proc/self/comm", "w") as comm:
            comm.write("mitmdump")
    except OSError:
        pass


def main() -> None:
    _name_process()  # before importing mitmproxy (0.5 s)
    from mitmproxy.tools import cmdline
    from mitmproxy.tools import main as tools
    from mitmproxy.tools.dump import DumpMaster

    from harness.capture.addon import Tenancy

    handed = handed_listeners(os.environ.pop("TENANCY_LISTEN_FDS"))
    ready = Ready(handed, int(os.environ.pop("TENANCY_READY_FD")))
    serve_handed_sockets(handed)

    def master(options: Options) -> DumpMaster:
        m = DumpMaster(options)
        add_after_scriptloader(m, Tenancy())
        m.addons.add(ready)
        return m

    tools.run(master, cmdline.mitmdump, None)  # type: ignore[arg-type]  # it only calls master_cls(options)
    exit_skipping_teardown()


if __name__ == "__main__":
    main()

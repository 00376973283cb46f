"""What `harness.capture.mitmdump_main` relies on beyond mitmproxy's and Python's public API, one test per hook:
after an upgrade, a failure here names the hook to redo, instead of an audit failing somewhere downstream."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mitmproxy import eventsequence, http, io
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.options import Options
from mitmproxy.test import taddons, tflow
from mitmproxy.tools.dump import DumpMaster

from harness.capture.mitmdump_main import (
    Ready,
    add_after_scriptloader,
    handed_listeners,
    serve_handed_sockets,
)
from harness.capture.proxy import bind_listener, port_of


def test_mitmproxy_serves_the_socket_handed_for_its_port(monkeypatch):
    """`serve_handed_sockets`: a reverse server, started by mitmproxy's own proxyserver addon, serves the
    listening socket the harness bound (were it to bind anew, the port is taken: EADDRINUSE)."""
    monkeypatch.setattr(asyncio, "start_server", asyncio.start_server)  # undone after the test
    sock = bind_listener()
    port = port_of(sock)
    handed = {port: sock.detach()}
    serve_handed_sockets(handed)

    async def start() -> list[Any]:
        ps = Proxyserver()
        with taddons.context(ps) as tctx:
            tctx.configure(ps, mode=[f"reverse:http://127.0.0.1:9@127.0.0.1:{port}"])
            ok = await ps.setup_servers()
            addrs = ps.listen_addrs()
            await ps.servers.update([])  # stop
        return [ok, addrs]

    try:
        ok, addrs = asyncio.run(start())
    finally:
        for fd in handed.values():  # not served: still ours
            os.close(fd)
    assert ok and handed == {} and addrs == [("127.0.0.1", port)], (
        "mitmproxy no longer starts a TCP mode's server with asyncio.start_server(handler, host, port): "
        f"mitmdump_main.serve_handed_sockets needs another hook (started: {ok}, unserved: {handed}, "
        f"listening: {addrs})")


class Probe:
    """Leaves a mark in every flow's `response` hook."""

    def __init__(self, name: str) -> None:
        self.name = name

    def response(self, flow: http.HTTPFlow) -> None:
        flow.metadata["probe"] = self.name
        flow.comment = self.name


def saved_after(tmp_path: Path, place: str) -> dict[str, Any]:
    """The metadata of one flow run through a real DumpMaster (to its `save`) with the probe placed by `place`."""
    path = tmp_path / f"{place}.mitm"

    async def run() -> None:
        master = DumpMaster(Options(), with_termlog=False, with_dumper=False)
        probe = Probe(place)
        if place == "after_scriptloader":
            add_after_scriptloader(master, probe)
        else:
            master.addons.add(probe)
        master.options.update(save_stream_file=str(path))
        flow = tflow.tflow(resp=True)
        for event in eventsequence.iterate(flow):
            await master.addons.handle_lifecycle(event)
        await master.done()

    asyncio.run(run())
    with path.open("rb") as f:
        (flow,) = list(io.FlowReader(f).stream())
    return {"metadata": flow.metadata.get("probe"), "comment": flow.comment}


def test_an_addon_after_the_scriptloader_marks_a_flow_before_save_writes_it(tmp_path):
    """`add_after_scriptloader`: what the addon's `response` hook sets is in flows.mitm."""
    saved = saved_after(tmp_path, "after_scriptloader")
    assert saved == {"metadata": "after_scriptloader", "comment": "after_scriptloader"}, (
        "an addon spliced after mitmproxy's scriptloader no longer runs before `save` writes the flow: "
        f"mitmdump_main.add_after_scriptloader needs another hook (saved: {saved})")


def test_an_addon_added_the_public_way_marks_a_flow_too_late(tmp_path):
    """Why `add_after_scriptloader` exists: `addons.add` puts the addon after `save`, which has written the
    flow by then. If this fails, mitmproxy changed: the public `addons.add` may be enough now."""
    saved = saved_after(tmp_path, "appended")
    assert saved == {"metadata": None, "comment": ""}, (
        f"`addons.add` now runs an addon before `save` writes the flow (saved: {saved}): "
        "mitmdump_main.add_after_scriptloader may be replaced with it")


def test_exit_skipping_teardown_runs_the_atexit_handlers_and_flushes(tmp_path):
    """`exit_skipping_teardown`: atexit handlers (logging's among them) run, buffered output is written, 0."""
    code = ("import atexit, sys\n"
            "from harness.capture.mitmdump_main import exit_skipping_teardown\n"
            "atexit.register(lambda: sys.stderr.write('atexit ran'))\n"
            "sys.stdout.write('buffered')\n"
            "exit_skipping_teardown()\n"
            "sys.stdout.write(' and after')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "buffered", "atexit ran"), (
        f"mitmdump_main.exit_skipping_teardown no longer exits like the interpreter (atexit._run_exitfuncs "
        f"is CPython's own): {done}")


def test_ready_writes_one_byte_once_every_handed_listener_is_served():
    read_end, write_end = os.pipe()
    try:
        Ready({}, write_end).running()
        assert os.read(read_end, 2) == b"1" and os.read(read_end, 1) == b""  # and closed its end
    finally:
        os.close(read_end)


def test_ready_refuses_a_handed_listener_no_mode_serves():
    read_end, write_end = os.pipe()
    try:
        with pytest.raises(SystemExit, match=r"^mitmdump: no --mode serves the listener handed for port\(s\) 8001$"):
            Ready({8001: 99}, write_end).running()
    finally:
        os.close(read_end)
        os.close(write_end)


def test_handed_listeners_are_parsed_from_the_environment_spec():
    assert handed_listeners("8001=5,8002=7") == {8001: 5, 8002: 7}

"""The client of the serve door: `hermes serve` (the desktop backend), JSON-RPC 2.0 over its `/api/ws?token=...`
websocket (`hermes.rpc.RpcBackend`)."""

from __future__ import annotations

import contextlib
import re
import secrets
import subprocess
import threading

from harness.core.procs import Stdio, stop_tree
from harness.drive.hermes.rpc import BackendError, RpcBackend, announced_port


class ServeBackend(RpcBackend):
    """`hermes serve --host 127.0.0.1 --port 0` (HERMES_DESKTOP=1: also runs the cron ticker in-process)."""

    READY = re.compile(r"HERMES_BACKEND_READY port=(\d+)")

    def start(self, timeout: float = 90.0) -> ServeBackend:
        from websockets.sync.client import connect

        self.token = secrets.token_urlsafe(24)
        env = self.hermes.env({"HERMES_DESKTOP": "1", "HERMES_DASHBOARD_SESSION_TOKEN": self.token})
        self._out = self.log_path.open("a", encoding="utf-8", errors="replace")
        self.proc = self.hermes.procs.spawn(
            [str(self.hermes.python), "-m", "hermes_cli.main", "serve", "--host", "127.0.0.1", "--port", "0"],
            env=env, cwd=self.hermes.sandbox.home,
            stdio=Stdio(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
        )
        self.port = announced_port(self.proc, self._out, self.READY, "hermes serve", timeout)
        try:
            self.ws = connect(f"ws://127.0.0.1:{self.port}/api/ws?token={self.token}", open_timeout=60, max_size=None)
        except Exception as exc:
            raise BackendError(f"cannot open the websocket of hermes serve: {type(exc).__name__}: {exc}") from None
        threading.Thread(target=self._pump_ws, daemon=True, name="tenancy-serve-ws").start()
        return self

    def _pump_ws(self) -> None:
        while True:
            try:
                raw = self.ws.recv()
            except Exception:
                self._deliver(None)
                return
            self._received(raw if isinstance(raw, str) else raw.decode("utf-8", "replace"))

    def _send_raw(self, text: str) -> None:
        try:
            self.ws.send(text)
        except Exception as exc:
            raise BackendError(f"websocket closed: {type(exc).__name__}") from None

    def close(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(Exception):
            self.ws.close()
        stop_tree(self.proc)
        self._out.close()

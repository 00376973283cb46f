"""The client of the tui door: `python -m tui_gateway.entry`, Hermes' terminal UI backend, newline-delimited
JSON-RPC 2.0 over its stdio (`hermes.rpc.RpcBackend`)."""

from __future__ import annotations

import subprocess
import threading
from typing import IO

from harness.core.procs import Stdio
from harness.drive.hermes.rpc import BackendError, RpcBackend, end_by_stdin


class TuiBackend(RpcBackend):
    """`python -m tui_gateway.entry` over stdio."""

    def start(self, timeout: float = 60.0) -> TuiBackend:
        self._stderr: IO[bytes] = self.log_path.open("ab")
        self.proc = self.hermes.procs.spawn(
            [str(self.hermes.python), "-m", "tui_gateway.entry"], env=self.hermes.env(), cwd=self.hermes.sandbox.home,
            stdio=Stdio(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True),
        )
        threading.Thread(target=self._pump, daemon=True, name="tenancy-tui-reader").start()
        self.wait(lambda f: (f.get("params") or {}).get("type") == "gateway.ready", timeout, "gateway.ready")
        return self

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip():
                self._received(line)
        self._deliver(None)

    def _send_raw(self, text: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(text + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError) as exc:
            raise BackendError(f"backend stdin closed: {exc}") from None

    def close(self) -> None:
        if self.proc is None:
            return
        end_by_stdin(self.proc, 20)  # its slash workers leave with it once stdin closes
        self._stderr.close()

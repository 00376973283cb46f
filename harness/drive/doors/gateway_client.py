"""The client for `hermes gateway run` with multiplexed profiles and the OpenAI-compatible API server (one
process serves every profile; its requests and replies go to the same RPC log as the other backends' frames).
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from harness.core.procs import Stdio, stop_tree
from harness.drive.hermes.agent import Hermes
from harness.drive.hermes.rpc import BackendError, RpcLog


class GatewayBackend:
    """`hermes gateway run` with `gateway.multiplex_profiles` and the API server on 127.0.0.1."""

    def __init__(self, hermes: Hermes, port: int, rpc_log: RpcLog, log_path: Path) -> None:
        self.hermes, self.port, self.rpc_log, self.log_path = hermes, port, rpc_log, log_path
        self.proc: subprocess.Popen[Any] | None = None

    def start(self, timeout: float = 90.0) -> GatewayBackend:
        self._out = self.log_path.open("ab")
        self.proc = self.hermes.procs.spawn(
            [str(self.hermes.python), "-m", "hermes_cli.main", "gateway", "run"], env=self.hermes.env(),
            cwd=self.hermes.sandbox.home, stdio=Stdio(stdout=self._out, stderr=self._out),
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BackendError(f"hermes gateway exited rc={self.proc.returncode} before /health answered")
            status, _ = self._send("GET", "/health", None, None, 120.0, {})
            if status == 200:
                return self
            time.sleep(0.2)
        raise BackendError(f"hermes gateway /health did not answer within {timeout:.0f}s")

    @staticmethod
    def route(tenant: str, launch: str, path: str) -> str:
        return path if tenant == launch else f"/p/{tenant}{path}"

    def request(self, method: str, path: str, key: str | None, body: dict[str, Any] | None, *, tenant: str | None,
                timeout: float = 120.0, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any] | str]:
        """(status, parsed JSON or text); 0 when the connection failed. Both directions go to the RPC log."""
        self.rpc_log.write("out", tenant, {"method": method, "path": path, "body": body,
                                           **({"headers": headers} if headers else {})})
        status, payload = self._send(method, path, key, body, timeout, headers or {})
        if status:
            self.rpc_log.write("in", tenant, {"status": status, "path": path, "body": payload})
        return status, payload

    def _send(self, method: str, path: str, key: str | None, body: dict[str, Any] | None, timeout: float,
              headers: dict[str, str]) -> tuple[int, dict[str, Any] | str]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method)
        req.add_header("content-type", "application/json")
        for name, value in headers.items():
            req.add_header(name, value)
        if key:
            req.add_header("authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        except OSError:
            return 0, ""
        try:
            payload: dict[str, Any] | str = json.loads(raw)
        except ValueError:
            payload = raw.decode("utf-8", "replace")
        return status, payload

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def close(self) -> None:
        if self.proc is None:
            return
        stop_tree(self.proc)
        self._out.close()

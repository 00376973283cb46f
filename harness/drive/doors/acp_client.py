"""A client of Hermes' ACP adapter (`hermes [-p NAME] acp`): the Agent Client Protocol an editor speaks,
newline-delimited JSON-RPC 2.0 over the process' stdio (methods `initialize`, `session/new`, `session/prompt`,
`session/load`, `session/resume`, `session/fork`, `session/list`; notifications `session/update`).

One process serves one profile (the adapter has no notion of a profile), so every frame of a client belongs to
its tenant: each goes to the RPC log under that tenant, where the reconciler looks for other tenants' canaries.
The adapter's own requests to the client (`session/request_permission`, before an edit) are answered `allow_once`
by the reader as they arrive; the client advertises no file system or terminal of its own, so Hermes' tools do
the work themselves.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any

from harness.core.procs import Stdio
from harness.drive.hermes.agent import Hermes
from harness.drive.hermes.rpc import BackendError, RpcLog, end_by_stdin

#: The ACP protocol version the client asks for (agent-client-protocol 0.9.0 speaks 1).
PROTOCOL_VERSION = 1


class AcpClient:
    """One `hermes [-p NAME] acp` process of `tenant`, and the replies to the requests sent to it."""

    def __init__(self, hermes: Hermes, tenant: str, rpc_log: RpcLog, log_path: Path) -> None:
        self.hermes, self.tenant, self.rpc_log, self.log_path = hermes, tenant, rpc_log, log_path
        self.proc: subprocess.Popen[str] | None = None
        self._stderr: IO[bytes] | None = None
        self._cond = threading.Condition()
        self._replies: dict[int, dict[str, Any]] = {}
        self._closed = False
        self._rid = 0
        self._send_lock = threading.Lock()
        self.updated: set[str] = set()  # every session id a `session/update` named

    def start(self, timeout: float = 90.0) -> AcpClient:
        """Start the process and `initialize` it."""
        self._stderr = self.log_path.open("ab")
        argv = [str(self.hermes.python), "-m", "hermes_cli.main", *self.hermes.sandbox.profile_args(self.tenant),
                "acp"]
        self.proc = self.hermes.procs.spawn(
            argv, env=self.hermes.env(), cwd=self.hermes.sandbox.home,
            stdio=Stdio(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True))
        threading.Thread(target=self._pump, daemon=True, name=f"tenancy-acp-{self.tenant}").start()
        self.result("initialize", {"protocolVersion": PROTOCOL_VERSION, "clientCapabilities": {
            "fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False}}, timeout)
        return self

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                frame = json.loads(line)
                if isinstance(frame, dict):
                    self._received(frame)
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _received(self, frame: dict[str, Any]) -> None:
        self.rpc_log.write("in", self.tenant, frame)
        if frame.get("method") == "session/update":
            self.updated.add(str((frame.get("params") or {}).get("sessionId")))
        if frame.get("method") == "session/request_permission" and "id" in frame:
            with contextlib.suppress(BackendError):
                self._write({"jsonrpc": "2.0", "id": frame["id"],
                             "result": {"outcome": {"outcome": "selected", "optionId": "allow_once"}}})
        elif "method" not in frame and isinstance(frame.get("id"), int):
            with self._cond:
                self._replies[frame["id"]] = frame
                self._cond.notify_all()

    def _write(self, frame: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        with self._send_lock:
            self.rpc_log.write("out", self.tenant, frame)
            try:
                self.proc.stdin.write(json.dumps(frame) + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError) as exc:
                raise BackendError(f"the ACP adapter's stdin closed: {exc}") from None

    def call(self, method: str, params: dict[str, Any], timeout: float = 90.0) -> dict[str, Any]:
        """Send a request; its reply frame (with `result` or `error`)."""
        with self._cond:
            self._rid += 1
            rid = self._rid
        self._write({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        deadline = time.monotonic() + timeout
        with self._cond:
            while rid not in self._replies:
                if self._closed:
                    raise BackendError(f"the ACP adapter of {self.tenant} closed its stdout before {method} replied")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BackendError(f"timed out after {timeout:.0f}s waiting for the reply to {method}")
                self._cond.wait(min(0.25, left))
            return self._replies.pop(rid)

    def result(self, method: str, params: dict[str, Any], timeout: float = 90.0) -> dict[str, Any]:
        """A request's result; BackendError with the adapter's error otherwise."""
        reply = self.call(method, params, timeout)
        if "result" not in reply:
            raise BackendError(f"{method} for {self.tenant} failed: {json.dumps(reply.get('error'))[:200]}")
        return reply["result"] or {}

    def new_session(self, cwd: str) -> str:
        """`session/new` with `cwd` and no MCP server of the client's; the session id."""
        return str(self.result("session/new", {"cwd": cwd, "mcpServers": []})["sessionId"])

    def prompt(self, session_id: str, text: str, timeout: float) -> tuple[bool, str]:
        """One turn: (ended normally, detail)."""
        try:
            reply = self.call("session/prompt", {"sessionId": session_id,
                                                 "prompt": [{"type": "text", "text": text}]}, timeout)
        except BackendError as exc:
            return False, str(exc)
        stop = (reply.get("result") or {}).get("stopReason")
        return stop == "end_turn", "" if stop == "end_turn" else json.dumps(reply.get("error") or reply)[:200]

    def close(self) -> None:
        """Close its stdin (the adapter leaves), then stop what is left of its process tree."""
        if self.proc is not None:
            end_by_stdin(self.proc, 15)
        if self._stderr is not None:
            self._stderr.close()

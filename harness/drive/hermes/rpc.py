"""The JSON-RPC 2.0 Hermes' one-process backends speak (`RpcBackend`: the tui backend over stdio, `hermes serve`
over a websocket; their transports are beside their doors, `doors.tui_client` and `doors.serve_client`), the RPC
log every client writes, and what the backends' clients share (`BackendError`, `end_by_stdin`, `announced_port`).

Every frame is appended to an RPC log (JSONL: direction, owning tenant, frame) so the reconciler can scan
each tenant's frames for other tenants' canaries; the backend's own output goes to a log scanned for
every tenant's secrets.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from harness.core.procs import descendants, stop_tree
from harness.drive.hermes.agent import Hermes


class BackendError(RuntimeError):
    """The backend did not start, died, or did not answer in time."""


class RpcLog:
    """Thread-safe JSONL record of every frame, with the tenant that owns it (None: nobody in particular)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, direction: str, tenant: str | None, frame: Any) -> None:
        with self._lock:
            self._fh.write(json.dumps({"t": time.time(), "dir": direction, "tenant": tenant, "frame": frame}) + "\n")
            self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def _event_of(frame: dict[str, Any], session_id: str, kind: str) -> bool:
    p = frame.get("params") or {}
    return frame.get("method") == "event" and p.get("session_id") == session_id and p.get("type") == kind


class RpcBackend:
    """JSON-RPC 2.0 client: `call` a method, `wait` for a frame; every frame goes to the RpcLog.

    One reader thread per transport hands each incoming frame to `_received`, and `_deliver(None)` when the
    stream ends. Frames nobody has claimed yet stay in `_frames` (oldest first, at most BACKLOG); every waiter
    sleeps on `_cond` and takes the first of them its predicate accepts, so a frame one waiter does not want
    stays visible to the others. The reader answers each `approval.request` itself, as it arrives, and drops
    the reply, so there is never a second consumer of the stream.
    """

    BACKLOG = 500

    def __init__(self, hermes: Hermes, rpc_log: RpcLog, log_path: Path) -> None:
        self.hermes = hermes
        self.rpc_log = rpc_log
        self.log_path = log_path
        self.proc: subprocess.Popen[Any] | None = None
        self._cond = threading.Condition()  # guards everything below up to `sessions`
        self._frames: list[dict[str, Any]] = []  # received, not yet claimed by a waiter
        self._closed = False  # the stream ended
        self._rid = 0
        self._reply_owner: dict[Any, str | None] = {}
        self._unwanted: set[int] = set()  # ids of our approval.respond requests: their replies are dropped
        self._send_lock = threading.Lock()  # one frame on the wire (and in the log) at a time
        self.sessions: dict[str, str] = {}  # session_id -> tenant
        self.choices: dict[str, str] = {}  # tenant -> how its approval requests are answered ("once" unless set)
        self.asked: Counter[str] = Counter()  # tenant -> approval requests received for its sessions

    # transport -------------------------------------------------------------------------------------------
    def _send_raw(self, text: str) -> None:
        raise NotImplementedError

    def _received(self, raw: str) -> None:
        """Called by the reader thread for each frame received."""
        try:
            frame = json.loads(raw)
        except ValueError:
            return
        if not isinstance(frame, dict):
            return
        sid = (frame.get("params") or {}).get("session_id") if frame.get("method") else None
        self.rpc_log.write("in", self.sessions.get(sid) if sid else self._owner_of_reply(frame), frame)
        self._deliver(frame)
        params = frame.get("params") or {}
        if frame.get("method") == "event" and params.get("type") == "approval.request":
            self.asked[self.sessions.get(params.get("session_id"), "")] += 1
            self._approve(params.get("session_id"))

    def _deliver(self, frame: dict[str, Any] | None) -> None:
        """Make a frame available to the waiters; None: the stream closed."""
        with self._cond:
            if frame is None:
                self._closed = True
            elif "method" not in frame and frame.get("id") in self._unwanted:
                self._unwanted.discard(frame["id"])
            else:
                self._frames.append(frame)
                del self._frames[:-self.BACKLOG]
            self._cond.notify_all()

    def _owner_of_reply(self, frame: dict[str, Any]) -> str | None:
        return self._reply_owner.get(frame.get("id")) if "id" in frame else None

    # protocol --------------------------------------------------------------------------------------------
    def _send(self, method: str, params: dict[str, Any], *, tenant: str | None, want_reply: bool = True) -> int:
        """Send a request; its id."""
        with self._cond:
            self._rid += 1
            rid = self._rid
            self._reply_owner[rid] = tenant
            if not want_reply:
                self._unwanted.add(rid)
        frame = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        with self._send_lock:
            self.rpc_log.write("out", tenant, frame)
            self._send_raw(json.dumps(frame))
        return rid

    def call(self, method: str, params: dict[str, Any], *, tenant: str | None, timeout: float = 90.0) -> dict[str, Any]:
        """Send a request and return its reply frame (with `result` or `error`)."""
        rid = self._send(method, params, tenant=tenant)
        return self.wait(lambda f: f.get("id") == rid and "method" not in f, timeout, f"reply to {method}")

    def wait(self, pred: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict[str, Any]:
        """Take the first unclaimed frame `pred` accepts, waiting up to `timeout` seconds for it to arrive."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for i, frame in enumerate(self._frames):
                    if pred(frame):
                        return self._frames.pop(i)
                if self._closed:
                    raise BackendError(f"backend stream closed while waiting for {what}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BackendError(f"timed out after {timeout:.0f}s waiting for {what}")
                # nothing arrived for a while: is the backend still there?
                if not self._cond.wait(min(0.25, left)) and self.proc is not None and self.proc.poll() is not None:
                    raise BackendError(f"backend exited (rc={self.proc.returncode}) while waiting for {what}")

    def _take_all(self, pred: Callable[[dict[str, Any]], bool]) -> int:
        """Claim every unclaimed frame `pred` accepts (none waited for); how many there were."""
        with self._cond:
            kept = [f for f in self._frames if not pred(f)]
            taken, self._frames[:] = len(self._frames) - len(kept), kept
            return taken

    def _approve(self, session_id: Any) -> None:
        """Answer an `approval.request` without waiting (the reader thread must keep reading), with the choice
        set for the session's tenant."""
        tenant = self.sessions.get(session_id)
        with contextlib.suppress(BackendError):  # the stream is gone: the waiters learn it from the reader
            self._send("approval.respond", {"session_id": session_id, "choice": self.choices.get(tenant, "once")},
                       tenant=tenant, want_reply=False)

    def create_session(self, tenant: str, launch: str) -> dict[str, Any]:
        params: dict[str, Any] = {"cols": 100}
        if tenant != launch:
            params["profile"] = tenant
        reply = self.call("session.create", params, tenant=tenant)
        if "result" not in reply:
            raise BackendError(f"session.create for {tenant} failed: {reply.get('error')}")
        self._bind(reply["result"]["session_id"], tenant)
        self._built(reply["result"]["session_id"], tenant)
        return reply["result"]

    def _built(self, session_id: str, tenant: str, timeout: float = 30.0) -> None:
        """Wait for the session's agent (its `session.info` event): Hermes builds agents in the background, and
        builds racing each other make which profile's process-wide state a turn sees vary from run to run
        (F2: the cwd); one at a time, the audit is repeatable. A Hermes that never says so only costs the wait."""
        def info(f: dict[str, Any]) -> bool:
            p = f.get("params") or {}
            return f.get("method") == "event" and p.get("type") == "session.info" and p.get("session_id") == session_id

        with contextlib.suppress(BackendError):
            self.wait(info, timeout, f"the agent of {tenant}'s session")

    def resume_session(self, tenant: str, launch: str, stored_id: str) -> dict[str, Any]:
        params: dict[str, Any] = {"cols": 100, "session_id": stored_id}
        if tenant != launch:
            params["profile"] = tenant
        reply = self.call("session.resume", params, tenant=tenant)
        if "result" not in reply:
            raise BackendError(f"session.resume of {stored_id} for {tenant} failed: {reply.get('error')}")
        sid = reply["result"].get("session_id")
        if sid:
            self._bind(sid, tenant)
        return reply["result"]

    def _bind(self, session_id: str, tenant: str) -> None:
        """Record which tenant owns a session, so frames seen before the reply are attributed too."""
        self.sessions[session_id] = tenant
        self.rpc_log.write("bind", tenant, {"session_id": session_id})

    def turn(self, session_id: str, text: str, timeout: float = 120.0) -> tuple[bool, str]:
        """Submit one prompt; (completed?, detail) from that session's `message.complete`."""
        tenant = self.sessions.get(session_id)
        reply = self.call("prompt.submit", {"session_id": session_id, "text": text}, tenant=tenant)
        if "result" not in reply:
            return False, f"prompt.submit failed: {reply.get('error')}"

        def done(f: dict[str, Any]) -> bool:
            p = f.get("params") or {}
            return f.get("method") == "event" and p.get("session_id") == session_id and p.get("type") in {
                "message.complete", "error"}

        event = self.wait(done, timeout, f"message.complete of {tenant}")
        payload = event["params"].get("payload") or {}
        ok = event["params"]["type"] == "message.complete" and payload.get("status") == "complete"
        if ok and self._take_all(lambda f: _event_of(f, session_id, "subagent.start")):
            # a delegation runs in the background; its result re-enters the session as a turn of its own: the
            # session is the tenant's again once that turn is complete too
            self.wait(done, timeout, f"the turn {tenant}'s subagent result started")
            self._take_all(lambda f: _event_of(f, session_id, "subagent.complete"))
        return ok, "" if ok else str(payload.get("text") or payload)[:200]

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def close(self) -> None:
        raise NotImplementedError


def end_by_stdin(proc: subprocess.Popen[Any], wait: float) -> None:
    """End a stdio backend as its client would: close its stdin, give it `wait` seconds to leave, then stop what is
    left of its process tree (the children it had before, too)."""
    family = descendants(proc.pid)
    try:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(timeout=wait)
    except (subprocess.TimeoutExpired, OSError, ValueError):
        pass
    stop_tree(proc, grace=10, family=family)


def announced_port(proc: subprocess.Popen[Any], out: TextIO, ready: re.Pattern[str], what: str,
                   timeout: float) -> int:
    """The port a Hermes server prints when it is ready (`ready`, its group 1), its output copied to `out` as it
    comes (a thread for the process's life)."""
    port: list[int] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            out.flush()
            m = ready.search(line)
            if m and not port:
                port.append(int(m.group(1)))

    threading.Thread(target=pump, daemon=True, name=f"tenancy-{what.split()[-1]}-out").start()
    deadline = time.monotonic() + timeout
    while not port:
        if proc.poll() is not None:
            raise BackendError(f"{what} exited rc={proc.returncode} before it was ready")
        if time.monotonic() > deadline:
            raise BackendError(f"{what} did not print {ready.pattern.split()[0]} within {timeout:.0f}s")
        time.sleep(0.05)
    return port[0]

"""RpcBackend under concurrency, against a fake peer (no Hermes needed).

The peer answers each `prompt.submit`, then sends an `approval.request` and the session's `message.complete`
either back to back or right after it has answered `approval.respond`. Every turn must see its
`message.complete` at once, every approval must be answered exactly once, and no request id may repeat.
(Before the fix a second thread answering the approval read the same stream and could swallow the
`message.complete`: the turn then timed out.)
"""

from __future__ import annotations

import json
import queue
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from harness.drive.hermes.rpc import BackendError, RpcBackend, RpcLog

TURN_TIMEOUT = 2.0  # a turn takes milliseconds; a missed frame fails fast


class FakeBackend(RpcBackend):
    """An RpcBackend whose peer is a thread playing the backend side of the protocol."""

    def __init__(self, tmp_path: Path, seed: int) -> None:
        super().__init__(None, RpcLog(tmp_path / "rpc.jsonl"), tmp_path / "backend.log")  # type: ignore[arg-type]
        self.inbox: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.request_ids: list[int] = []
        self.approvals: Counter[str] = Counter()  # session_id -> approval.respond received
        self.requested: Counter[str] = Counter()  # session_id -> approval.request sent
        self._rng = random.Random(seed)
        self._after_approval: set[str] = set()  # sessions whose message.complete follows the approval
        self._peer = threading.Thread(target=self._serve, daemon=True)
        self._peer.start()

    def call(self, method: str, params: dict[str, Any], *, tenant: str | None, timeout: float = 90.0) -> dict[str, Any]:
        # a swallowed reply must fail fast too (`turn` gives `prompt.submit` the default 90 s)
        return super().call(method, params, tenant=tenant, timeout=min(timeout, TURN_TIMEOUT))

    def _send_raw(self, text: str) -> None:
        self.inbox.put(json.loads(text))

    def _emit(self, frame: dict[str, Any]) -> None:
        self._received(json.dumps({"jsonrpc": "2.0", **frame}))

    def _event(self, sid: str, kind: str, payload: dict[str, Any]) -> None:
        self._emit({"method": "event", "params": {"type": kind, "session_id": sid, "payload": payload}})

    def _serve(self) -> None:
        while (frame := self.inbox.get()) is not None:
            self.request_ids.append(frame["id"])
            sid = frame["params"]["session_id"]
            self._emit({"id": frame["id"], "result": {}})
            if frame["method"] == "prompt.submit":
                self._event(sid, "message.delta", {"text": "thinking"})
                self.requested[sid] += 1
                if self._rng.random() < 0.5:
                    self._event(sid, "approval.request", {"command": "ls"})
                    self._event(sid, "message.complete", {"status": "complete", "text": "done"})
                else:
                    self._after_approval.add(sid)
                    self._event(sid, "approval.request", {"command": "ls"})
            elif frame["method"] == "approval.respond":
                self.approvals[sid] += 1
                if sid in self._after_approval:
                    self._after_approval.discard(sid)
                    self._event(sid, "message.complete", {"status": "complete", "text": "done"})

    def close(self) -> None:
        self.inbox.put(None)
        self._peer.join(5)
        self.rpc_log.close()

    def settle(self, timeout: float = 5.0) -> None:
        """Wait until every approval.request has been answered (some answers trail their turn)."""
        deadline = time.monotonic() + timeout
        while self.approvals.total() < self.requested.total() and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.05)  # a duplicate answer would arrive now


def _turns(backend: FakeBackend, sessions: list[str], rounds: int) -> None:
    for n in range(rounds):
        for sid in sessions:
            started = time.monotonic()
            try:
                ok, detail = backend.turn(sid, f"turn {n}", timeout=TURN_TIMEOUT)
            except BackendError as exc:
                pytest.fail(f"turn {n} of {sid} failed: {exc}")
            assert ok, detail
            assert time.monotonic() - started < TURN_TIMEOUT


def _check_answers(backend: FakeBackend, turns: int) -> None:
    backend.settle()
    assert backend.requested.total() == turns
    assert backend.approvals == backend.requested, "every approval.request is answered exactly once"
    assert len(backend.request_ids) == len(set(backend.request_ids)), "request ids repeat"


def test_turns_see_their_completion_while_approvals_are_answered(tmp_path):
    backend = FakeBackend(tmp_path, seed=1)
    try:
        sessions = [f"s{i}" for i in range(3)]
        for sid in sessions:
            backend.sessions[sid] = f"tenant-{sid}"
        _turns(backend, sessions, rounds=150)
        _check_answers(backend, turns=450)
    finally:
        backend.close()


def test_concurrent_turns_on_one_backend(tmp_path):
    """Several threads drive their own session each: each waiter gets exactly its own frames."""
    backend = FakeBackend(tmp_path, seed=2)
    sessions = [f"c{i}" for i in range(4)]
    for sid in sessions:
        backend.sessions[sid] = f"tenant-{sid}"
    errors: list[BaseException] = []

    def drive(sid: str) -> None:
        try:
            _turns(backend, [sid], rounds=60)
        except BaseException as exc:  # pytest.fail raises an exception derived from BaseException
            errors.append(exc)

    try:
        threads = [threading.Thread(target=drive, args=(sid,)) for sid in sessions]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors[0]
        _check_answers(backend, turns=240)
    finally:
        backend.close()


def test_stream_closed_and_timeout(tmp_path):
    backend = FakeBackend(tmp_path, seed=3)
    try:
        with pytest.raises(BackendError, match=r"timed out after 0s waiting for nothing"):
            backend.wait(lambda f: False, 0.1, "nothing")
        backend._emit({"method": "event", "params": {"type": "early", "session_id": "x"}})
        backend._deliver(None)
        early = backend.wait(lambda f: f["params"]["type"] == "early", 1, "early")  # delivered before the close
        assert early["params"]["session_id"] == "x"
        started = time.monotonic()
        with pytest.raises(BackendError, match=r"backend stream closed while waiting for late"):
            backend.wait(lambda f: False, 5, "late")
        assert time.monotonic() - started < 1
    finally:
        backend.close()

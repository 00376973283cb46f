"""A worker process of the tenancy addon's scan pool (`harness.capture.pool`): it runs the scan of one request
or response at a time, beside mitmproxy's event loop, with the detection core the addon runs inline.

    python -m harness.capture.worker FD

FD is its end of a socket pair with the addon. Every message either way is one frame: an 8-byte big-endian
length, then a pickle. The worker says `("ready", pid)` once; then it takes `("registry", Registry)` (it builds
that registry's matcher and keeps it until the next) and `("job", RequestScan | ResponseScan)`, each answered
by `("ok", report)` or `("error", traceback)`. It exits when the addon closes its end (or dies).
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import sys
import traceback
from typing import Any

from harness.detect.engine.matcher import matcher_for

HEADER = 8


def frame(message: Any) -> bytes:
    """`message` as one frame."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return len(body).to_bytes(HEADER, "big") + body


def _read(sock: socket.socket, size: int) -> bytearray | None:
    """Exactly `size` bytes, or None at the end of the stream."""
    buf = bytearray(size)
    view, got = memoryview(buf), 0
    while got < size:
        n = sock.recv_into(view[got:])
        if not n:
            return None
        got += n
    return buf


def serve(sock: socket.socket) -> None:
    """Answer the addon's jobs until it closes the socket."""
    registry = matcher = None
    while (head := _read(sock, HEADER)) is not None:
        body = _read(sock, int.from_bytes(head, "big"))
        if body is None:
            return
        tag, payload = pickle.loads(body)
        if tag == "registry":
            registry, matcher = payload, matcher_for(payload)
            continue
        try:
            answer = ("ok", payload.run(registry, matcher))
        except Exception:  # the addon logs it and runs the job inline (where it fails the same way)
            answer = ("error", traceback.format_exc())
        sock.sendall(frame(answer))


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C reaches the whole group; the addon stops the pool
    sock = socket.socket(fileno=int(sys.argv[1]))
    sock.sendall(frame(("ready", os.getpid())))
    try:
        serve(sock)
    except (ConnectionError, BrokenPipeError):
        pass
    finally:
        sock.close()


if __name__ == "__main__":
    main()

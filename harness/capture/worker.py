"""A worker process of the tenancy addon's scan pool (`harness.capture.pool`): it runs the scan of one request
or response at a time, beside mitmproxy's event loop, with the detection core the addon runs inline.

    python -m harness.capture.worker SOCKET_FD MEMORY_FD

SOCKET_FD is its end of a socket pair with the addon. Every message either way is one frame: an 8-byte
big-endian length, then a pickle. The worker says `("ready", pid)` once; then it takes `("registry", Registry)`
(it builds that registry's matcher and keeps it until the next) and `("job", RequestScan | ResponseScan, SIZE)`,
each answered by `("ok", report)` or `("error", traceback)`. A job comes without its body: the body is the
first SIZE bytes of MEMORY_FD, a memfd the addon shares with it (a copy there costs the addon's event loop a
tenth of a send through the socket). The worker exits when the addon closes its end of the socket (or dies).
"""

from __future__ import annotations

import mmap
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


class Shared:
    """The memory the addon writes each job's body into (a memfd, grown by the addon as bodies need)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.map = mmap.mmap(fd, os.fstat(fd).st_size)

    def read(self, size: int) -> bytes | None:
        """The body the addon wrote (`size` bytes; -1: none)."""
        if size < 0:
            return None
        if size > len(self.map):
            self.map.close()
            self.map = mmap.mmap(self.fd, os.fstat(self.fd).st_size)
        return self.map[:size]


def serve(sock: socket.socket, shared: Shared) -> None:
    """Answer the addon's jobs until it closes the socket."""
    registry = matcher = None
    while (head := _read(sock, HEADER)) is not None:
        body = _read(sock, int.from_bytes(head, "big"))
        if body is None:
            return
        message = pickle.loads(body)
        if message[0] == "registry":
            registry, matcher = message[1], matcher_for(message[1])
            continue
        _, job, size = message
        try:
            answer = ("ok", job.with_body(shared.read(size)).run(registry, matcher))
        except Exception:  # the addon logs it and runs the job inline (where it fails the same way)
            answer = ("error", traceback.format_exc())
        sock.sendall(frame(answer))


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C reaches the whole group; the addon stops the pool
    sock = socket.socket(fileno=int(sys.argv[1]))
    shared = Shared(int(sys.argv[2]))
    sock.sendall(frame(("ready", os.getpid())))
    try:
        serve(sock, shared)
    except ConnectionError:  # the addon is gone
        pass
    finally:
        sock.close()


if __name__ == "__main__":
    main()

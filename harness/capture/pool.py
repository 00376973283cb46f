"""The tenancy addon's scan pool: worker processes (`harness.capture.worker`) that scan request and response
bodies for canaries beside mitmproxy's event loop, so the loop goes on with other flows meanwhile.

Each worker holds one job at a time. A hook whose flow finds every worker busy waits for one in its turn
(first come, first served): its flow stands still and mitmproxy reads no more from that connection, while
every other flow goes on (back-pressure; the jobs waiting are bounded by the flows in flight). The workers are
started by the first job that wants one, which runs inline meanwhile, as every job does while none is up.
A worker that dies is dropped, and its job runs inline: the result is the same (one detection core).

Workers are children in mitmproxy's process group; each exits when its socket closes, so also when mitmproxy
dies. `close` proves that none survived.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Protocol

import psutil

import harness
from harness.capture.worker import HEADER, frame
from harness.core.registry import Registry
from harness.detect.engine.matcher import Matcher

log = logging.getLogger("tenancy")
#: Seconds a worker gets to say it is ready, and to exit once its socket is closed.
START_TIMEOUT = 60.0
STOP_TIMEOUT = 5.0


class Job(Protocol):
    """A scan as plain data (`flows.RequestScan`, `flows.ResponseScan`)."""

    @property
    def body(self) -> bytes | None: ...

    def with_body(self, body: bytes | None) -> Job: ...

    def run(self, registry: Registry, matcher: Matcher) -> Any: ...


#: The shared memory a worker starts with; a longer body grows it.
SHARED_BYTES = 1 << 20


class _Worker:
    """One worker process, the addon's end of its socket and the memory they share."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket, memfd: int) -> None:
        self.proc, self.sock, self.memfd = proc, sock, memfd
        self.map = mmap.mmap(memfd, os.fstat(memfd).st_size)
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.matcher: Matcher | None = None  # whose registry it was sent last

    async def receive(self) -> Any:
        assert self.streams is not None
        reader = self.streams[0]
        head = await reader.readexactly(HEADER)
        return pickle.loads(await reader.readexactly(int.from_bytes(head, "big")))

    def _share(self, body: bytes | None) -> int:
        """Put `body` in the shared memory (grown if it is too small); its size, -1 for none."""
        if body is None:
            return -1
        if len(body) > len(self.map):
            self.map.close()
            os.ftruncate(self.memfd, max(len(body), 2 * os.fstat(self.memfd).st_size))
            self.map = mmap.mmap(self.memfd, os.fstat(self.memfd).st_size)
        self.map[: len(body)] = body
        return len(body)

    async def run(self, registry: Registry, matcher: Matcher, job: Job) -> Any:
        assert self.streams is not None
        writer = self.streams[1]
        if self.matcher is not matcher:
            writer.write(frame(("registry", registry)))
            self.matcher = matcher
        writer.write(frame(("job", job.with_body(None), self._share(job.body))))
        tag, result = await self.receive()
        if tag != "ok":
            raise RuntimeError(f"tenancy: a scan worker failed:\n{result}")
        return result

    def close(self) -> None:
        self.map.close()
        os.close(self.memfd)


class Pool:
    """`size` worker processes, started on demand; `run` gives a job to one, `close` stops them all."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._starting: asyncio.Task[None] | None = None
        self._spawned: list[_Worker] = []
        self._idle: asyncio.Queue[_Worker | None] | None = None  # None: every worker is lost
        self.live = 0  # workers up and not lost

    def ready(self) -> bool:
        """Whether a worker is up to take a job (it may be busy: `run` then waits for one). The first call starts
        the workers, in the background, and says False."""
        if self._starting is None and self.size:
            self._idle = asyncio.Queue()
            self._starting = asyncio.get_running_loop().create_task(self._start())
        return self.live > 0

    async def _start(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(Path(harness.__file__).resolve().parent.parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
        for _ in range(self.size):
            mine, theirs = socket.socketpair()
            memfd = os.memfd_create("tenancy-scan")
            os.ftruncate(memfd, SHARED_BYTES)
            fds = (theirs.fileno(), memfd)
            try:
                proc = subprocess.Popen([sys.executable, "-m", "harness.capture.worker", *map(str, fds)],
                                        pass_fds=fds, stdin=subprocess.DEVNULL, env=env)
            except OSError as exc:
                log.error(f"tenancy: cannot start a scan worker ({exc}); scanning inline")
                mine.close()
                os.close(memfd)
                break
            finally:
                theirs.close()
            self._spawned.append(_Worker(proc, mine, memfd))
        for worker in self._spawned:
            try:
                worker.streams = await asyncio.open_connection(sock=worker.sock)
                await asyncio.wait_for(worker.receive(), START_TIMEOUT)  # ("ready", pid)
            except (OSError, EOFError, asyncio.IncompleteReadError, TimeoutError) as exc:
                log.error(f"tenancy: scan worker {worker.proc.pid} did not start ({exc!r}); scanning inline")
                continue
            assert self._idle is not None
            self._idle.put_nowait(worker)
            self.live += 1

    async def run(self, registry: Registry, matcher: Matcher, job: Job) -> Any:
        """`job.run(registry, matcher)` in a worker (waiting for one to be free), or inline if they are lost."""
        idle = self._idle  # this pool's, even if `close` drops it meanwhile
        assert idle is not None
        worker = await idle.get()
        if worker is None:  # every worker is lost: the mark stays for the next job that waits
            idle.put_nowait(None)
            return job.run(registry, matcher)
        try:
            result = await worker.run(registry, matcher, job)
        except RuntimeError as exc:  # the job failed in the worker: inline, it fails (or not) as it would have
            idle.put_nowait(worker)
            log.error(str(exc))
            return job.run(registry, matcher)
        except (OSError, EOFError, asyncio.IncompleteReadError) as exc:
            self._lose(worker, repr(exc))
            return job.run(registry, matcher)
        except asyncio.CancelledError:  # its answer would come to the next job: the worker is retired
            self._lose(worker, "its job was cancelled")
            raise
        idle.put_nowait(worker)
        return result

    def _lose(self, worker: _Worker, why: str) -> None:
        self.live -= 1
        log.error(f"tenancy: scan worker {worker.proc.pid} lost ({why}); {self.live} left, scanning inline")
        if not self.live and self._idle is not None:
            self._idle.put_nowait(None)  # wakes the jobs waiting for a worker

    def close(self) -> list[psutil.Process]:
        """Stop every worker: close its socket (it exits at once, or after the job it holds), SIGKILL what is
        still there after STOP_TIMEOUT. Returns the survivors: [] (none is a zombie; each is reaped)."""
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
        for worker in self._spawned:
            with contextlib.suppress(OSError):
                worker.sock.shutdown(socket.SHUT_RDWR)  # the worker reads the end of its stream
            if worker.streams is None:
                worker.sock.close()
            else:
                worker.streams[1].transport.abort()  # closes the socket in the event loop's next turn
        for worker in self._spawned:
            try:
                worker.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                log.error(f"tenancy: scan worker {worker.proc.pid} did not stop; killing it")
                worker.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    worker.proc.wait(STOP_TIMEOUT)
        for worker in self._spawned:
            worker.close()
        survivors = [p for p in map(_process, self._spawned) if p is not None]
        self._spawned, self._starting, self._idle, self.live = [], None, None, 0
        return survivors


def _process(worker: _Worker) -> psutil.Process | None:
    """The worker's process if it still runs (not a zombie)."""
    try:
        proc = psutil.Process(worker.proc.pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc
    except psutil.NoSuchProcess:
        return None


#: Workers share memory through a memfd: Linux only. Elsewhere every scan runs inline.
SUPPORTED = hasattr(os, "memfd_create")


def default_workers() -> int:
    """One worker per CPU this process may run on beyond two (one for mitmproxy's event loop, one for the agent
    and the upstream beside it); at most 4. With two CPUs or fewer, none: a worker there only takes CPU time
    from the rest and adds its hand-over to each scan (docs/performance.md)."""
    return max(0, min(4, len(os.sched_getaffinity(0)) - 2)) if SUPPORTED else 0

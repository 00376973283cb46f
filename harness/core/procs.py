"""Child processes: own process group, a timeout, a run marker, and teardown that proves nobody survived.

Every child gets `TENANCY_RUN=<run id>` in its environment and is recorded in a pid file under
`runs_dir()`; `reap_stale()` (called by `tenancy-audit run` and `cleanup`) kills every process of a run
whose harness is gone, found by its process group or by the marker in its environment, so even a
SIGKILLed harness leaves nothing behind once the next run or `cleanup` starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psutil

RUN_MARKER = "TENANCY_RUN"


def runs_dir() -> Path:
    path = Path(tempfile.gettempdir()) / f"tenancy-audit-{os.getuid()}" / "runs"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


@dataclass(frozen=True)
class Stdio:
    """A child's standard streams, as `subprocess.Popen` takes them (`text`: str pipes, not bytes)."""

    stdin: int | IO[Any] | None = subprocess.DEVNULL
    stdout: int | IO[Any] | None = None
    stderr: int | IO[Any] | None = None
    text: bool = False


#: No input; the outputs are the harness's own.
INHERITED = Stdio()
#: Both outputs read through pipes, as text (what `ProcessSet.run` collects).
PIPED = Stdio(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class ProcessSet:
    """Everything one harness run started; `close()` kills it all and proves no survivor."""

    def __init__(self, run_id: str | None = None) -> None:
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.pidfile = runs_dir() / f"{self.run_id}.json"
        self.procs: list[subprocess.Popen[Any]] = []
        self._lock = threading.Lock()  # drivers spawn from several threads at once
        self._write()

    def _write(self) -> None:
        data = {
            "harness": os.getpid(),
            "harness_started": psutil.Process().create_time(),
            "groups": [p.pid for p in self.procs],
        }
        tmp = self.pidfile.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.pidfile)

    def spawn(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str],
        cwd: Path | str | None = None,
        stdio: Stdio = INHERITED,
        pass_fds: Sequence[int] = (),
    ) -> subprocess.Popen[Any]:
        """Start a child in its own session (= process group) carrying the run marker; it inherits only
        `pass_fds` beyond stdio."""
        proc = subprocess.Popen(
            list(argv),
            env={**env, RUN_MARKER: self.run_id},
            cwd=cwd,
            stdin=stdio.stdin,
            stdout=stdio.stdout,
            stderr=stdio.stderr,
            text=stdio.text,
            start_new_session=True,
            pass_fds=pass_fds,
        )
        with self._lock:
            self.procs.append(proc)
            self._write()
        return proc

    def run(
        self, argv: Sequence[str], *, env: dict[str, str], cwd: Path | str | None, timeout: float
    ) -> tuple[int | None, str, str]:
        """Run to completion; on timeout kill the group. Returns (returncode or None if killed, out, err)."""
        proc = self.spawn(argv, env=env, cwd=cwd, stdio=PIPED)
        try:
            out, err = proc.communicate(timeout=timeout)
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            out, err = proc.communicate()
            code = None
        kill_group(proc.pid)  # tool subprocesses left in the group
        return code, out, err

    def terminate(self) -> None:
        """SIGTERM every live group now (an interrupted run's turns end at once; mitmdump flushes its file)."""
        for proc in self.procs:
            if proc.poll() is None:
                kill_group(proc.pid, signal.SIGTERM)

    def quiesce(self) -> list[str]:
        """`close()` before the homes are scanned, so nothing can still write to them (a detached slash
        worker closing its SQLite database removes its -wal and -shm files); the inconclusive reason if not."""
        stray = self.close()
        if not stray:
            return []
        return [f"{len(stray)} child process(es) survived teardown; the homes were scanned while they ran"]

    def survivors(self) -> list[psutil.Process]:
        return find_run_processes(self.run_id, [p.pid for p in self.procs])

    def close(self, grace: float = 5.0) -> list[psutil.Process]:
        """Terminate every group, then SIGKILL what is left; return survivors (should be [])."""
        for proc in self.procs:
            if proc.poll() is None:
                kill_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for victim in self.survivors():
            _kill(victim)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace)
        left = _settle(self.survivors())
        if not left:
            self.pidfile.unlink(missing_ok=True)
        return left


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


#: Seconds the descendants of a stopped child that left its group get to exit on their own (`stop_tree`).
LEAVE = 3.0


def descendants(pid: int) -> list[psutil.Process]:
    """Every live descendant of `pid`, also those it started in a session of their own."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def stop_tree(
    proc: subprocess.Popen[Any], grace: float = 30.0, family: Sequence[psutil.Process] = ()
) -> list[psutil.Process]:
    """Stop a child, its process group and every descendant, also one that left the group (Hermes starts
    its slash workers, terminal commands and MCP servers with `start_new_session`): SIGTERM to the group, up to
    `grace` seconds to exit; the descendants outside it get `LEAVE` seconds to follow their parent on their
    own (Hermes' stdio MCP watchdog does, within 2 s; a SIGTERM while it waits for its server would hold it
    for 6 s), then SIGTERM, then SIGKILL at the end of `grace`. `family`: descendants seen before the child was
    asked to stop (an orphan is no longer found under it). Returns the survivors (should be [])."""
    tree = {p.pid: p for p in [*family, *descendants(proc.pid)]}
    kill_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    _, lingering = psutil.wait_procs(list(tree.values()), timeout=max(0.0, min(LEAVE, deadline - time.monotonic())))
    for member in lingering:
        with contextlib.suppress(psutil.Error):
            member.terminate()
    _, lingering = psutil.wait_procs(lingering, timeout=max(0.0, deadline - time.monotonic()))
    kill_group(proc.pid)
    for member in lingering:
        _kill(member)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    return _settle(lingering)


def _kill(proc: psutil.Process) -> None:
    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
        proc.kill()


def _settle(procs: list[psutil.Process], timeout: float = 3.0) -> list[psutil.Process]:
    """Wait for killed processes to go; zombies do not count as survivors."""
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return [p for p in alive if _alive(p)]


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def find_run_processes(run_id: str, groups: Sequence[int] = ()) -> list[psutil.Process]:
    """Processes of a run: in one of its process groups, or carrying its marker in their environment."""
    me = os.getpid()
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            ours = (groups and os.getpgid(proc.pid) in groups) or proc.environ().get(RUN_MARKER) == run_id
            if ours and _alive(proc):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ProcessLookupError, OSError):
            continue
    return found


def run_of(harness_pid: int) -> tuple[str, list[int]] | None:
    """The run id and process groups the harness `harness_pid` recorded in its pid file, if any."""
    for path in runs_dir().glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("harness") == harness_pid:
            return path.stem, data.get("groups", [])
    return None


def reap_stale() -> int:
    """Kill what runs whose harness died (e.g. SIGKILL) left behind; returns how many were killed."""
    killed = 0
    for pidfile in runs_dir().glob("*.json"):
        try:
            data = json.loads(pidfile.read_text())
        except (OSError, ValueError):
            pidfile.unlink(missing_ok=True)
            continue
        if _harness_alive(data.get("harness", 0), data.get("harness_started", 0.0)):
            continue
        victims = find_run_processes(pidfile.stem, data.get("groups", []))
        for victim in victims:
            _kill(victim)
        killed += len(victims)
        if not _settle(victims):
            pidfile.unlink(missing_ok=True)
    return killed


def _harness_alive(pid: int, started: float) -> bool:
    try:
        return abs(psutil.Process(pid).create_time() - started) < 1.0
    except (psutil.NoSuchProcess, ValueError):
        return False

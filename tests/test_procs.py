"""Teardown of children that leave their process group (no Hermes): Hermes starts its slash workers and
terminal commands with `start_new_session`, so killing a backend's group alone lets them live on and keep
writing to a tenant home (a SQLite database closing removes its -wal and -shm files mid-scan)."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness.core.procs import ProcessSet, Stdio, kill_group, stop_tree

# A leader that starts a grandchild in a session of its own, prints the grandchild's pid, then waits for
# stdin to close (like a backend whose slash worker outlives it); the grandchild appends to a file.
LEADER = """
import subprocess, sys
writer = "import sys, time\\nwhile True:\\n    open(sys.argv[1], 'a').write('x')\\n    time.sleep(0.01)\\n"
child = subprocess.Popen([sys.executable, "-c", writer, sys.argv[1]], start_new_session=True)
print(child.pid, flush=True)
sys.stdin.read()
"""


def start_leader(procs: ProcessSet, target: Path) -> tuple[subprocess.Popen[str], psutil.Process]:
    leader = procs.spawn([sys.executable, "-c", LEADER, str(target)], env={"PATH": "/usr/bin:/bin"},
                         stdio=Stdio(stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    assert leader.stdout is not None
    grandchild = psutil.Process(int(leader.stdout.readline()))
    assert grandchild.pid != leader.pid
    deadline = time.monotonic() + 10
    while not target.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return leader, grandchild


def alive(proc: psutil.Process) -> bool:
    """Running, and not a zombie its new parent has yet to reap."""
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def still_growing(path: Path) -> bool:
    before = path.stat().st_size
    time.sleep(0.2)
    return path.stat().st_size != before


@pytest.fixture
def procs() -> ProcessSet:
    procs = ProcessSet()
    yield procs
    assert procs.close() == []


def test_killing_the_group_alone_leaves_a_detached_grandchild_writing(procs, tmp_path):
    """The negative control: the escape the tests below rely on is real."""
    leader, grandchild = start_leader(procs, tmp_path / "home.log")
    kill_group(leader.pid)
    leader.wait(timeout=10)
    assert alive(grandchild) and still_growing(tmp_path / "home.log")


def test_stop_tree_stops_a_detached_grandchild(procs, tmp_path):
    leader, grandchild = start_leader(procs, tmp_path / "home.log")
    assert stop_tree(leader, grace=5) == []
    assert leader.returncode is not None and not alive(grandchild)
    assert not still_growing(tmp_path / "home.log")


def test_stop_tree_stops_an_orphan_seen_before_its_leader_left(procs, tmp_path):
    leader, grandchild = start_leader(procs, tmp_path / "home.log")
    family = [psutil.Process(leader.pid).children()[0]]
    assert leader.stdin is not None
    leader.stdin.close()  # the leader exits on its own; its grandchild is no longer found under it
    leader.wait(timeout=10)
    assert alive(grandchild)
    assert stop_tree(leader, grace=5, family=family) == []
    assert not alive(grandchild)


@pytest.mark.tenancy(tenants=2)
def test_check_scans_the_homes_only_once_every_child_is_gone(tenancy_proxy, tenant_homes, tenancy_procs):
    writer = tenant_homes["alpha"] / "state.log"
    leader, grandchild = start_leader(tenancy_procs, writer)
    for t in tenancy_proxy.registry:
        conn = http.client.HTTPConnection("127.0.0.1", t.listen, timeout=30)
        conn.request("POST", "/v1/chat/completions", json.dumps({"model": t.model, "messages": []}),
                     {"content-type": "application/json", "authorization": f"Bearer {t.key}"})
        assert conn.getresponse().status == 200
        conn.close()
    result = tenancy_proxy.check()
    assert not alive(grandchild) and leader.returncode is not None
    assert not still_growing(writer)
    assert result.reasons == [] and result.findings == []
    assert result.flows_per_tenant == {"default": 1, "alpha": 1}


def test_quiesce_names_the_survivors_as_a_reason(procs, monkeypatch):
    monkeypatch.setattr(ProcessSet, "close", lambda self, grace=5.0: [object(), object()])
    assert procs.quiesce() == ["2 child process(es) survived teardown; the homes were scanned while they ran"]
    monkeypatch.undo()

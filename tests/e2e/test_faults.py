"""Faults against real Hermes: the harness or mitmdump killed mid-run, stub faults, Hermes timeouts, ports taken.

Each run is bounded (short --timeout); every test first proves the thing it kills or breaks was really
there, so it can fail. The 20-kill soak is bench/soak_kill.py (figures in docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness import cli
from harness.core.procs import RUN_MARKER, run_of, runs_dir
from harness.detect.reconcile import read_flows

pytestmark = pytest.mark.e2e

CLI = [sys.executable, "-m", "harness.cli"]


def start_run(out: Path, hermes_python: Path, *args: str) -> subprocess.Popen[str]:
    """A run in the background, with the env probe only (these tests are about the harness, not the tools)."""
    argv = [*CLI, "run", "--out", str(out), "--hermes-python", str(hermes_python), "--quiet", "--tools", "none",
            *args]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := cond():
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}", pytrace=False)


def ledger_lines(out: Path) -> int:
    try:
        return len((out / "ledger.jsonl").read_bytes().splitlines())
    except OSError:
        return 0


def run_processes(run_id: str, groups: list[int]) -> list[psutil.Process]:
    """An independent sweep: every live process carrying the run's marker or sitting in one of its groups."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(proc.pid) in groups or proc.environ().get(RUN_MARKER) == run_id:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def mid_run(out: Path, proc: subprocess.Popen[str]) -> tuple[str, list[int]]:
    """Wait until the run has traffic in its ledger and Hermes turns in flight; return (run id, groups)."""
    wait_for(lambda: ledger_lines(out) >= 3 or proc.poll() is not None, 60, "ledger lines")
    assert proc.poll() is None, f"the run ended before it could be killed: {proc.communicate()}"
    run_id, groups = wait_for(lambda: run_of(proc.pid), 10, "the run's pid file")
    return run_id, groups


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_harness_killed_mid_run_leaves_no_process(tmp_path, hermes_python, sig):
    out = tmp_path / "ev"
    proc = start_run(out, hermes_python)
    try:
        run_id, groups = mid_run(out, proc)
        before = run_processes(run_id, groups)
        names = " ".join(" ".join(p.cmdline()) for p in before)
        assert "mitmdump" in names and "hermes_cli.main" in names, names  # there was something to reap
        os.kill(proc.pid, sig)
        code = proc.wait(timeout=60)
        _, err = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
        done = subprocess.run([*CLI, "cleanup"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout.startswith("reaped "), done
    else:
        assert code == 3, err
        assert "Traceback" not in err and f"interrupted ({sig.name})" in err, err
        doc = json.loads((out / "findings.json").read_text())  # the reports are written before exit 3
        assert (doc["verdict"], doc["exit_code"]) == ("inconclusive", 3), doc
        assert doc["reasons"][0].startswith(f"interrupted ({sig.name})"), doc["reasons"]
        for name in ("report.html", "report.md", "junit.xml", "findings.sarif"):
            assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name
        again = subprocess.run([*CLI, "reconcile", str(out)], capture_output=True, text=True, timeout=300)
        assert again.returncode in (1, 3) and "interrupted" in again.stdout, again  # the record was written too
    survivors = [(p.pid, p.cmdline()) for p in run_processes(run_id, groups)]
    assert survivors == [], survivors
    assert not (runs_dir() / f"{run_id}.json").exists()


def test_mitmdump_killed_mid_run_is_inconclusive_and_its_flows_read_back(tmp_path, hermes_python):
    out = tmp_path / "ev"
    proc = start_run(out, hermes_python, "--timeout", "60")
    try:
        run_id, groups = mid_run(out, proc)
        dumps = [p for p in run_processes(run_id, groups) if p.name() == "mitmdump"]
        assert len(dumps) == 1, dumps
        dumps[0].kill()
        code = proc.wait(timeout=120)
        stdout, err = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 3 and "Traceback" not in err, err
    doc = json.loads((out / "findings.json").read_text())
    assert doc["verdict"] == "inconclusive"
    assert any("mitmdump died during the run" in r for r in doc["reasons"]), doc["reasons"]
    assert "inconclusive: mitmdump died during the run" in stdout
    flows, _ = read_flows(out / "flows.mitm")
    assert flows and len(flows) >= ledger_lines(out) - 1  # every flow up to the kill was saved
    rec = subprocess.run([*CLI, "reconcile", "--registry", str(out / "registry.yaml"), "--flows",
                          str(out / "flows.mitm"), "--no-homes"], capture_output=True, text=True, timeout=120)
    assert rec.returncode in (0, 3) and "Traceback" not in rec.stderr, rec
    assert f"{len(flows)} flows)" in rec.stdout


@pytest.mark.parametrize(("options", "cause"), [
    ({"stub_fault": "500"}, "HTTP 500"),
    ({"stub_fault": "hang", "timeout": 6}, "killed after 6s timeout"),
    ({"stub_fault": "drop", "timeout": 30}, "incomplete chunked read"),
    ({"timeout": 1}, "killed after 1s timeout"),
], ids=["stub-500", "stub-hang", "sse-dropped", "hermes-timeout"])
def test_driver_failure_is_inconclusive_never_clean(tenancy_audit, options, cause):
    audit = tenancy_audit(tools=[], services=[], **options)  # the env probe only: every turn fails anyway
    assert audit.code == 3 and audit.verdict == "inconclusive"
    shortfalls = [f for f in audit.findings if f.kind == "shortfall"]
    assert {f.victim for f in shortfalls} == {"default", "alpha"}, audit.doc["findings"]
    assert all(cause in (f.detail or "") for f in shortfalls), [f.detail for f in shortfalls]


def _listening() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_listeners_are_bound_before_the_registry_is_written(tmp_path, hermes_python, monkeypatch, capsys):
    """Every port `free_port` could guess is taken by someone else, yet the run is clean: its listeners are
    bound (port 0, the kernel's pick) before the registry names them, so no port can be taken in between."""
    import harness.capture.proxy
    import harness.run

    squatters: list[socket.socket] = []

    def taken() -> int:
        squatters.append(_listening())
        return squatters[-1].getsockname()[1]

    monkeypatch.setattr(harness.run, "free_port", taken)
    monkeypatch.setattr(harness.capture.proxy, "free_port", taken)
    try:
        code = cli.main(["run", "--out", str(tmp_path / "ev"), "--hermes-python", str(hermes_python), "--quiet",
                         "--tools", "none"])  # the env probe only: the one-shot CLI is clean without the battery
        held = {s.getsockname()[1] for s in squatters}
    finally:
        for s in squatters:
            s.close()
    doc = json.loads((tmp_path / "ev" / "findings.json").read_text())
    assert code == 0 and doc["verdict"] == "clean", doc
    from harness.core.registry_file import load

    listen = [t.listen for t in load(tmp_path / "ev" / "registry.yaml")]
    assert all(listen) and not held & set(listen)
    flows, _ = read_flows(tmp_path / "ev" / "flows.mitm")
    assert {f.metadata["tenancy"]["tenant"] for f in flows} == {"default", "alpha"}


def test_mitmdump_that_never_comes_up_ends_the_run_inconclusive_in_one_line(tmp_path, hermes_python, monkeypatch,
                                                                            capsys):
    """The turns start while mitmdump starts; if it exits instead (here: its addon cannot open its ledger), the
    waiting connections are reset, the turns fail at once and the run says why, with no verdict."""
    from harness.capture.proxy import Proxy

    planted = tmp_path / "planted-ledger-is-a-directory"
    planted.mkdir()
    argv = Proxy.argv
    monkeypatch.setattr(Proxy, "argv", lambda self: [f"tenancy_ledger={planted}" if a.startswith("tenancy_ledger=")
                                                     else a for a in argv(self)])
    started = time.monotonic()
    code = cli.main(["run", "--out", str(tmp_path / "ev"), "--hermes-python", str(hermes_python), "--quiet",
                     "--timeout", "60", "--tools", "none"])
    seconds = time.monotonic() - started
    err = capsys.readouterr().err
    assert code == 3, err
    assert err.startswith("tenancy-audit: inconclusive: mitmdump did not come up (it exited; ")
    assert f"tenancy_ledger: cannot open {planted}" in err and err.count("\n") == 1  # one line, no harness traceback
    assert not (tmp_path / "ev" / "findings.json").exists()
    assert seconds < 55, seconds  # the turns were not left waiting until their timeout

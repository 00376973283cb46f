"""Security of one real 8-tenant audit (`tenancy-audit run --tenants 8 --redact` as a subprocess).

The real HOME holds a sentinel (bytes, mtime and atime must not change: the mount is relatime and its
atime is set before its mtime, so a read would move it), the parent environment holds fake credentials
that must reach no child, every listener of the run must be bound to 127.0.0.1, evidence and the CA
0600, the redacted copy free of secrets; and with 8 tenants no flow is lost or misattributed.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from harness.capture.proxy import CERTS
from harness.core.registry import Registry
from harness.core.registry_file import load
from harness.detect import scan
from harness.detect.flows import refused, route_of
from harness.detect.reconcile import read_flows, reconcile
from harness.drive.hermes.agent import real_home

pytestmark = pytest.mark.e2e

TAG = secrets.token_hex(6)
PLANTED = {"OPENAI_API_KEY": f"sk-fake-openai-{TAG}", "ANTHROPIC_API_KEY": f"sk-ant-fake-{TAG}",
           "AWS_SECRET_ACCESS_KEY": f"fake-aws-secret-{TAG}", "HERMES_FOO": f"hermes-foo-{TAG}"}


def _home_state(path: Path) -> dict[str, tuple[int, int]]:
    if not path.exists():
        return {}
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in [path, *path.rglob("*")]}


def _listeners(pid: int, seen: set[tuple[str, int]], stop: threading.Event) -> None:
    """Sample the listening sockets of the harness and every descendant until `stop`."""
    while not stop.wait(0.1):
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in procs:
            try:
                seen.update((c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="inet")
                            if c.status == psutil.CONN_LISTEN)
            except psutil.Error:
                continue


@pytest.fixture(scope="module")
def audit(tmp_path_factory, hermes_python):
    out = tmp_path_factory.mktemp("security") / "ev"
    sentinel = real_home() / f".tenancy-sentinel-{TAG}"
    sentinel.write_bytes(b"do not touch " + TAG.encode())
    st = sentinel.stat()
    os.utime(sentinel, ns=(st.st_mtime_ns - 10**10, st.st_mtime_ns))  # atime < mtime: a read would update it
    before = sentinel.stat()
    hermes_home = _home_state(real_home() / ".hermes")
    seen: set[tuple[str, int]] = set()
    stop = threading.Event()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", "--tenants", "8", "--redact", "--quiet",
                                 "--tools", "none",
                                 "--hermes-python", str(hermes_python), "--out", str(out)],
                                env={**os.environ, **PLANTED}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        watcher = threading.Thread(target=_listeners, args=(proc.pid, seen, stop), daemon=True)
        watcher.start()
        stdout, stderr = proc.communicate(timeout=600)
        stop.set()
        watcher.join()
        after = sentinel.stat()
        data = sentinel.read_bytes()
    finally:
        sentinel.unlink(missing_ok=True)
    yield {"code": proc.returncode, "out": out, "stdout": stdout, "stderr": stderr, "listeners": seen,
           "sentinel": (before, after, data), "hermes_home": (hermes_home, _home_state(real_home() / ".hermes"))}


@pytest.fixture(scope="module")
def registry(audit) -> Registry:
    return load(audit["out"] / "registry.yaml")


def test_eight_tenant_audit_is_clean_with_no_flow_lost_or_misattributed(audit, registry):
    assert audit["code"] == 0, audit["stdout"] + audit["stderr"]
    flows, truncated = read_flows(audit["out"] / "flows.mitm")
    stub_flows = [json.loads(x)["flow"] for x in (audit["out"] / "stubs.jsonl").read_text().splitlines()]
    misattributed = [f.id for f in flows
                     if f.metadata["tenancy"]["tenant"] != registry.by_listen_port(route_of(f).listen_port).name]
    per_tenant = {t: sum(f.metadata["tenancy"]["tenant"] == t for f in flows) for t in registry.names()}
    print(f"\n8-tenant Hermes audit: {len(flows)} proxy flows, {len(stub_flows)} stub requests, "
          f"misattributed {len(misattributed)}, per tenant {per_tenant}")
    assert truncated is None and misattributed == [] and all(per_tenant.values())
    # 0 lost: every request a stub got is a flow; none bypassed: every flow answered but by the proxy's refusal (a
    # host no tenant routes) was answered by a stub. A flow its client gave up on before an answer (Hermes' local
    # provider probes have short timeouts) may or may not have reached one.
    answered = {f.id for f in flows if f.response is not None and not refused(f)}
    unanswered = [f for f in flows if f.response is None]
    assert all(f.error and "Client disconnected" in f.error.msg for f in unanswered), [f.error for f in unanswered]
    assert len(set(stub_flows)) == len(stub_flows) and answered <= set(stub_flows) <= {f.id for f in flows}


def test_real_home_is_never_read_or_written(audit, registry):
    before, after, data = audit["sentinel"]
    assert data == b"do not touch " + TAG.encode()
    assert (after.st_mtime_ns, after.st_atime_ns, after.st_size) == (before.st_mtime_ns, before.st_atime_ns,
                                                                    before.st_size)
    assert audit["hermes_home"][0] == audit["hermes_home"][1]
    rec = reconcile(registry, audit["out"] / "flows.mitm")
    snaps = [s for v in rec.snapshots.values() for s in v]
    assert len(snaps) >= 8
    sandbox = str(Path(registry["default"].home).resolve().parent)  # HOME holds the launch profile's .hermes
    assert Path(sandbox).parent == (audit["out"] / "sandbox").resolve()
    for snap in snaps:
        env = dict(line.split("=", 1) for line in snap.decoded.decode().splitlines() if "=" in line)
        assert env["HOME"] == sandbox, (snap.tenant, env["HOME"])
        assert str(real_home()) not in {env.get("HERMES_HOME"), env.get("PWD"), snap.cwd}


def test_no_credential_of_the_caller_reaches_any_child(audit, registry):
    rec = reconcile(registry, audit["out"] / "flows.mitm")
    snaps = [s for v in rec.snapshots.values() for s in v]
    assert len(snaps) >= 8
    for snap in snaps:
        env = dict(line.split("=", 1) for line in snap.decoded.decode().splitlines() if "=" in line)
        assert not set(PLANTED) & set(env), (snap.tenant, sorted(set(PLANTED) & set(env)))
        assert not [v for v in PLANTED.values() if v.encode() in snap.decoded or v in snap.plain]
    for path in audit["out"].rglob("*"):  # nor any file of the evidence, flows and logs included
        if path.is_file() and not path.is_symlink():
            blob = path.read_bytes()
            assert not [k for k, v in PLANTED.items() if v.encode() in blob], path


def test_every_listener_binds_loopback_only(audit, registry):
    seen = audit["listeners"]
    ports = {p for _, p in seen}
    stub_ports = {int(t.upstream.rsplit(":", 1)[1]) for t in registry}
    proxy_ports = {t.listen for t in registry}
    assert proxy_ports | stub_ports <= ports, (sorted(proxy_ports | stub_ports), sorted(ports))  # sampled them all
    assert {ip for ip, _ in seen} == {"127.0.0.1"}, sorted(seen)


def test_evidence_and_ca_are_private(audit):
    out = audit["out"]
    for path in [out, *out.rglob("*")]:
        if path.is_symlink():
            continue
        assert stat.S_IMODE(path.stat().st_mode) == (0o700 if path.is_dir() else 0o600), path
    keys = [p for p in CERTS.iterdir() if p.is_file() and p.name != "README.md"]
    assert any(p.name == "mitmproxy-ca.pem" for p in keys)
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in keys), [(p.name, oct(p.stat().st_mode)) for p in keys]


def test_redacted_copy_holds_no_secret_and_reconciles(audit, registry):
    red = audit["out"] / "redacted"
    wanted = {"flows.mitm", "ledger.jsonl", "report.md", "findings.json", "registry.yaml"}
    assert wanted <= {p.name for p in red.iterdir()}
    assert scan.scan_paths([audit["out"] / "flows.mitm"], registry, None).findings  # the original holds secrets
    assert scan.scan_paths([red], registry, None).findings == []
    done = subprocess.run([sys.executable, "-m", "harness.cli", "scan", "--registry",
                           str(audit["out"] / "registry.yaml"), str(red)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done
    flows, _ = read_flows(audit["out"] / "flows.mitm")
    done = subprocess.run([sys.executable, "-m", "harness.cli", "reconcile", "--registry", str(red / "registry.yaml"),
                           "--flows", str(red / "flows.mitm"), "--stubs", str(red / "stubs.jsonl"), "--no-homes"],
                          capture_output=True, text=True, timeout=300)
    verdict = f"verdict: clean (0 new incident(s); 0 new in 0 class(es), 0 known, {len(flows)} flows)"
    assert done.returncode == 0 and verdict in done.stdout, done

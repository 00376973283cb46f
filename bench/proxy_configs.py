"""bench/proxy.py's configurations, started: the stub, and each mitmdump (plain, streaming SSE, with the addon,
with the addon of `--ref`) in reverse and forward mode, in the bench's ProcessSet, with the Target the load client
sends each configuration's requests to."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import proxy_stub
from ab import REPO
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from mitmproxy import certs
from payloads import make_registry
from proxy_client import Target

from harness.capture.proxy import free_port, mitmdump_binary
from harness.core.procs import ProcessSet, Stdio
from harness.core.registry import Registry

STREAM_ADDON = Path(__file__).resolve().parent / "stream_sse.py"
#: The configurations, in the order every measurement runs and prints them (those started).
ORDER = ("direct", "plain-rev", "stream-rev", "addon-rev", "old-rev", "plain-fwd", "stream-fwd", "addon-fwd",
         "old-fwd")


@dataclass
class Started:
    """Every configuration, up and accepting: where to send its requests, the pids of the `addon-*` mitmdumps, the
    forward registry (its tenants and canaries) and the confdir whose CA the forward proxies sign with."""

    targets: dict[str, Target]
    addons: list[int]
    fwd: Registry
    confdir: Path


@dataclass(frozen=True)
class Setup:
    """What to start: `ref`'s addon too (`old-*`), the addon's `tenancy_workers`, the proxies' CPUs."""

    ref: str | None
    workers: int | None
    cpus: set[int] | None


def start(procs: ProcessSet, root: Path, setup: Setup) -> Started:
    """Start the stub and every mitmdump in `procs` (their files under `root`) and wait until all accept."""
    confdir = root / "confdir"
    confdir.mkdir()
    cert, key = stub_cert(confdir)
    http_port, tls_port = distinct_port(), distinct_port()
    starting = [spawn(procs, [sys.executable, proxy_stub.__file__, str(http_port), str(tls_port), str(cert),
                              str(key)], [http_port, tls_port], root / "stub.log")]
    upstream = f"reverse:http://127.0.0.1:{http_port}"
    lazy = ["--set", "connection_strategy=lazy", "--set", "ssl_insecure=true"]
    trees = {"addon": REPO} | ({"old": old_tree(setup.ref, root / "old")} if setup.ref else {})
    fwd = make_registry(root / "fwd", upstream=f"https://127.0.0.1:{tls_port}")
    for t in fwd:
        t.route = {"host": f"{t.name}.llm.test"}
    fwd.validate()
    fwd.save(root / "registry-fwd.yaml")
    targets: dict[str, Target] = {}
    addons: list[int] = []  # the pids of the addon-* mitmdumps
    for name in ("direct", "plain", "stream", *trees):
        # one registry per reverse configuration: the addon attributes a flow by its listener's port
        rev = make_registry(root / f"rev-{name}", upstream=f"http://127.0.0.1:{http_port}")
        for t in rev:
            t.route = {"listen": distinct_port()}
        rev.validate()
        rev.save(root / f"registry-{name}-rev.yaml")
        if name == "direct":
            targets["direct"] = Target("direct", rev, [http_port])
            continue
        ports = [t.listen for t in rev if t.listen is not None]
        fwd_port = distinct_port()
        tree = trees.get(name)
        env = {**os.environ, "PYTHONPATH": str(tree or REPO)}
        fwd.save(root / f"registry-{name}-fwd.yaml")
        for topo, modes, extra, reg, listen in (
            ("rev", [f"{upstream}@127.0.0.1:{p}" for p in ports], [], rev, ports),
            ("fwd", [f"regular@127.0.0.1:{fwd_port}"], lazy, fwd, [fwd_port]),
        ):
            if tree is not None:
                extra = [*extra, "-s", str(tree / "addons" / "tenancy.py"),
                         "--set", f"tenancy_registry={root / f'registry-{name}-{topo}.yaml'}",
                         "--set", f"tenancy_ledger={root / f'ledger-{name}-{topo}.jsonl'}"]
                if name == "addon" and setup.workers is not None:
                    extra += ["--set", f"tenancy_workers={setup.workers}"]
            elif name == "stream":
                extra = [*extra, "-s", str(STREAM_ADDON)]
            starting.append(spawn(procs, mitmdump_argv(confdir, modes, extra), listen,
                                  root / f"mitmdump-{name}-{topo}.log", env, setup.cpus))
            if name == "addon":
                addons.append(starting[-1].proc.pid)
            connect = None
            if topo == "fwd":
                connect = (lambda i: f"{fwd.names()[i % 8]}.llm.test:443") if tree else (
                    lambda i: f"127.0.0.1:{tls_port}")
            targets[f"{name}-{topo}"] = Target(f"{name}-{topo}", reg, listen, connect)
    ready(starting)
    return Started({name: targets[name] for name in ORDER if name in targets}, addons, fwd, confdir)


def accepts(port: int) -> bool:
    """Something listens on 127.0.0.1:`port`."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@dataclass
class Child:
    """A child starting up: it is ready when it accepts on every port."""

    proc: subprocess.Popen[bytes]
    ports: list[int]
    log: Path


def spawn(procs: ProcessSet, argv: list[str], ports: list[int], log: Path, env: dict[str, str] | None = None,
          cpus: set[int] | None = None) -> Child:
    """Start a child in `procs` (on `cpus` only, when given); `ready` waits for it."""
    mine = os.sched_getaffinity(0)
    with log.open("wb") as fh:
        try:
            if cpus:
                os.sched_setaffinity(0, cpus)  # the child inherits it
            proc = procs.spawn(argv, env=env or dict(os.environ), stdio=Stdio(stdout=fh, stderr=fh))
        finally:
            os.sched_setaffinity(0, mine)
    return Child(proc, ports, log)


def ready(starting: list[Child], timeout: float = 60) -> None:
    """Wait until every child accepts on every port (they start side by side)."""
    deadline = time.monotonic() + timeout
    for child in starting:
        while not all(map(accepts, child.ports)):
            if child.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{child.proc.args[0]} did not come up: {child.log.read_text()[-400:]}")
            time.sleep(0.05)


def mitmdump_argv(confdir: Path, modes: list[str], extra: list[str]) -> list[str]:
    argv = [str(mitmdump_binary()), "-q", "--set", f"confdir={confdir}", "--set", "listen_host=127.0.0.1",
            "--set", "termlog_verbosity=warn"]
    for mode in modes:
        argv += ["--mode", mode]
    return argv + extra


def stub_cert(confdir: Path) -> tuple[Path, Path]:
    """Create the confdir's CA (mitmdump uses it too) and a throw-away certificate for the stub."""
    store = certs.CertStore.from_store(confdir, "mitmproxy", 2048)
    entry = store.get_cert("127.0.0.1", [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    cert, key = confdir / "stub-cert.pem", confdir / "stub-key.pem"
    cert.write_bytes(entry.cert.to_pem())
    key.write_bytes(entry.privatekey.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert, key


def old_tree(ref: str, root: Path) -> Path:
    """`addons/` and `harness/` of git `ref`, extracted under `root` (the working tree is not touched)."""
    root.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "addons", "harness"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    return root


_TAKEN: set[int] = set()


def distinct_port() -> int:
    """A free port not handed out before in this run (the kernel may offer a just-closed port again)."""
    port = free_port()
    while port in _TAKEN:
        port = free_port()
    _TAKEN.add(port)
    return port

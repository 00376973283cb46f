"""Start and stop mitmdump with the tenancy addon in front of the tenants' stubs.

The harness binds the listeners and starts `harness.capture.mitmdump_main` on them (the same addon and options as
`mitmdump -s addons/tenancy.py`); `spawn` returns at once, `wait_ready` waits until every listener is served.

Reverse topology: one `reverse:<stub>@127.0.0.1:<port>` listener per tenant and service (the listener names
the tenant and the service; a stub of a protocol that is not HTTP has a `tcp://` upstream, `RAW_SCHEMES`), and one
regular listener every other request of a child goes to (`child_env`: its proxy variables, loopback excepted),
where a host the registry routes (a platform's fixed host, shared by credential) reaches its stub and any other is
refused and recorded. Forward topology: that regular listener
alone; children reach `https://<tenant>.llm.test` (a service: `https://<service>.<tenant>.llm.test`) through
`HTTPS_PROXY`. TLS is terminated with the CA in `certs/` (installed: in the user's data folder, see
`core.places`), and the addon routes each host to its stub. Nothing is dialled outside loopback
(`tenancy_egress=block`, `connection_strategy=lazy`).
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from harness.core.files import FLOWS, write_private
from harness.core.places import SOURCE, certs_dir
from harness.core.procs import ProcessSet, Stdio, kill_group
from harness.core.registry import PROVIDER, Registry

CERTS = certs_dir()
FORWARD_DOMAIN = "llm.test"
#: Upstreams a reverse listener relays as raw TCP (mitmproxy's `reverse:tcp://` and `reverse:tls://` modes): a
#: stub of a protocol that is not HTTP; each connection is a TCP flow, its messages inspected as a websocket's.
RAW_SCHEMES = ("tcp://", "tls://")
#: What a child reaches without the proxy in the reverse topology (`NO_PROXY`): loopback, the reverse listeners.
LOOPBACK = "127.0.0.1,localhost,::1"


class ProxyError(RuntimeError):
    """mitmdump could not be started or did not come up."""


def free_port() -> int:
    """A port that was free a moment ago (for a listener someone else binds, such as Hermes' gateway)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bind_listener(port: int = 0) -> socket.socket:
    """A listening socket on 127.0.0.1; port 0 lets the kernel pick one, which no one else can then take."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def port_of(sock: socket.socket) -> int:
    return sock.getsockname()[1]


def mitmdump_binary() -> Path:
    path = Path(sys.executable).parent / "mitmdump"
    if not path.exists():
        raise ProxyError(f"mitmdump not found next to {sys.executable}: mitmproxy is not installed there (in a "
                         "checkout, run ./tenancy once to bootstrap)")
    return path


def ensure_ca(confdir: Path = CERTS) -> None:
    """Create mitmproxy's CA in `confdir` unless it is there, as mitmdump itself would on its start: the
    children are handed its certificate before mitmdump is up. Under a lock, so that audits starting at once
    (the test workers of a new checkout) make one CA, not a key of one and a certificate of another."""
    confdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    with (confdir / ".ca.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (confdir / "mitmproxy-ca.pem").exists():
            from mitmproxy.certs import CertStore

            CertStore.create_store(confdir, "mitmproxy", 2048)


def protect_certs(confdir: Path = CERTS) -> None:
    """Every file mitmproxy keeps in its confdir (the CA key among them) is 0600; a new confdir is 0700."""
    confdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    for path in confdir.iterdir():
        if path.is_file() and path.name != "README.md":
            path.chmod(0o600)


@dataclass
class Proxy:
    """A running mitmdump with the tenancy addon; `stop()` shuts it down so flows.mitm is complete."""

    registry: Registry
    registry_path: Path
    out: Path
    procs: ProcessSet
    topology: str = "reverse"
    egress: str = "block"
    confdir: Path = CERTS
    #: The regular (forward) listener's port: the forward topology's only one, the reverse topology's for every
    #: request to a host that is not a reverse listener (0: bound by `spawn`, or none when the caller hands
    #: `listeners` without one).
    forward_port: int = 0
    #: Listening sockets bound by the caller, one per port of `ports()` (else `spawn` binds them); mitmdump
    #: gets them and the proxy keeps no copy.
    listeners: list[socket.socket] = field(default_factory=list)
    #: Where the harness names the current scenario/phase for the addon (`tenancy_phase_file`), if anywhere.
    phase_file: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path = field(init=False)
    _ready_fd: int | None = field(default=None, init=False, repr=False)  # taken by whoever waits (or stops) first
    _ready_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _settled: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _failure: str = field(default="", init=False, repr=False)

    def __post_init__(self) -> None:
        self.log_path = self.out / "mitmdump.log"
        if self.listeners and not self.forward_port:  # the one the registry does not name, if any
            extra = [port_of(s) for s in self.listeners if port_of(s) not in self.registry.listen_ports()]
            self.forward_port = extra[0] if self.topology == "forward" or len(extra) == 1 else 0

    @property
    def flows_path(self) -> Path:
        return self.out / FLOWS

    @property
    def ledger_path(self) -> Path:
        return self.out / "ledger.jsonl"

    def argv(self) -> list[str]:
        argv = [
            sys.executable, "-P", "-m", "harness.capture.mitmdump_main", "-q",  # -P: not the cwd on sys.path
            "--set", f"confdir={self.confdir}",
            "--set", f"tenancy_registry={self.registry_path}",
            "--set", f"tenancy_ledger={self.ledger_path}",
            "--set", f"tenancy_egress={self.egress}",
            "--set", f"save_stream_file={self.flows_path}",
            "--set", "listen_host=127.0.0.1",
            "--set", "termlog_verbosity=warn",
        ]
        if self.phase_file is not None:
            argv += ["--set", f"tenancy_phase_file={self.phase_file}"]
        if self.topology == "reverse":
            for t in self.registry:
                for service, route in t.routes():
                    if route.get("listen") is not None:
                        argv += ["--mode", f"reverse:{t.upstream_of(service)}@127.0.0.1:{route['listen']}"]
        if self.forward_port:  # lazy: nothing is dialled before a request is routed (or refused)
            argv += ["--mode", f"regular@127.0.0.1:{self.forward_port}", "--set", "connection_strategy=lazy"]
        return argv

    def ports(self) -> list[int]:
        """The ports mitmdump serves: every reverse listener of the registry (reverse topology) and the regular one."""
        reverse = self.registry.listen_ports() if self.topology == "reverse" else []
        return reverse + ([self.forward_port] if self.forward_port or not self.listeners else [])

    def start(self, timeout: float = 30.0) -> Proxy:
        """Start mitmdump and wait until it serves every listener."""
        self.spawn()
        self.wait_ready(timeout)
        return self

    def spawn(self) -> Proxy:
        """Start mitmdump on the listeners (bound here from the registry's ports unless the caller bound
        them); returns at once. A connection made from now on waits until mitmdump serves it (`wait_ready`)."""
        mitmdump_binary()  # mitmproxy is installed next to this python (else: how to bootstrap it)
        ensure_ca(self.confdir)
        protect_certs(self.confdir)
        socks, self.listeners = self.listeners or self._bind_all(), []
        read_end, write_end = os.pipe()
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        env["PYTHONPATH"] = str(SOURCE)  # this very harness (a checkout, a worktree, an install)
        env["TENANCY_LISTEN_FDS"] = ",".join(f"{port_of(s)}={s.fileno()}" for s in socks)
        env["TENANCY_READY_FD"] = str(write_end)
        try:
            with self.log_path.open("ab") as log:
                self.proc = self.procs.spawn(self.argv(), env=env, cwd=self.out, stdio=Stdio(stdout=log, stderr=log),
                                             pass_fds=[write_end, *(s.fileno() for s in socks)])
        except BaseException:
            os.close(read_end)
            raise
        finally:  # mitmdump holds the only copies now: if it dies, its listeners go with it
            os.close(write_end)
            for sock in socks:
                sock.close()
        self._failure = ""
        self._settled.clear()
        self._ready_fd = read_end
        return self

    def _bind_all(self) -> list[socket.socket]:
        """A listener on every port of `ports()`; a port that is taken is a ProxyError (the registry names
        it, and only its owner may change it)."""
        socks: list[socket.socket] = []
        try:
            for port in self.ports():
                socks.append(bind_listener(port))
        except OSError as exc:
            for sock in socks:
                sock.close()
            raise ProxyError(f"mitmdump cannot listen on 127.0.0.1 port {port} ({exc.strerror})") from None
        if not self.forward_port:  # the regular listener, on the port the kernel picked
            self.forward_port = port_of(socks[-1])
        return socks

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until mitmdump serves every listener. ProxyError, naming the tail of its log, if it exits
        first or takes longer than `timeout` (it is then killed: whoever waits in its backlog is reset)."""
        fd = self._take_ready_fd()
        if fd is None:  # someone else waits (or waited, or stopped it): their outcome is ours
            if not self._settled.wait(timeout):
                raise ProxyError(f"mitmdump did not come up (not serving after {timeout:g} s)")
            if self._failure:
                raise ProxyError(self._failure)
            return
        try:
            readable, _, _ = select.select([fd], [], [], timeout)
            got = os.read(fd, 1) if readable else None
        finally:
            os.close(fd)
        if got == b"1":
            self._settled.set()
            return
        if got is None and self.proc is not None:
            kill_group(self.proc.pid)
            self.proc.wait(timeout=5)
        tail = self.log_path.read_text(errors="replace")[-600:] if self.log_path.exists() else ""
        tail = " ".join(tail.split())[-300:]  # one line
        why = f"not serving after {timeout:g} s" if got is None else "it exited"
        self._failure = f"mitmdump did not come up ({why}; listen ports {', '.join(map(str, self.ports()))}): " \
                        f"{tail or 'no output'}"
        self._settled.set()
        raise ProxyError(self._failure)

    def _take_ready_fd(self) -> int | None:
        with self._ready_lock:
            fd, self._ready_fd = self._ready_fd, None
            return fd

    def label(self, scenario: str | None, phase: str | None) -> None:
        """Name the phase the flows from now on belong to (the addon labels their findings with it)."""
        if self.phase_file is not None:
            write_private(self.phase_file, json.dumps({"scenario": scenario, "phase": phase}).encode())

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def base_url(self, tenant: str) -> str:
        """Where a tenant's Hermes sends its provider calls: its route through the proxy."""
        return self.service_url(tenant, PROVIDER) + "/v1"

    def service_url(self, tenant: str, service: str) -> str:
        """A tenant's service through the proxy (its provider: `base_url` without the `/v1`): its reverse listener,
        else its host (through the regular listener). A service whose stub speaks raw TCP (its upstream `tcp://` or
        `tls://`: a line protocol such as IMAP or IRC) is `tcp://127.0.0.1:PORT`: the client may speak TLS to the
        listener, which mitmproxy terminates with the project's CA (its reverse mode sees a TLS ClientHello)."""
        t = self.registry[tenant]
        route = t.route if service == PROVIDER else t.services[service].route or {}
        if route.get("listen") is not None:
            raw = t.upstream_of(service).startswith(RAW_SCHEMES)
            return f"{'tcp' if raw else 'http'}://127.0.0.1:{route['listen']}"
        return f"https://{route['host']}"

    def child_env(self) -> dict[str, str]:
        """Extra environment for every Hermes child. It trusts this project's CA and no other (in both
        topologies): every connection a child may make is to a stub through this proxy, on loopback, so no
        public root has anything to verify. (certifi's roots would also cost Hermes some 20 ms of CPU for each
        HTTP client it builds, dozens a turn.) Its proxy variables name the regular listener: in the forward
        topology for every connection, in the reverse one for all but loopback (the reverse listeners), so a
        request to any other host reaches the proxy, which routes it to a stub or refuses and records it."""
        bundle = self.out / "ca-bundle.pem"
        if not bundle.exists():
            write_private(bundle, (self.confdir / "mitmproxy-ca-cert.pem").read_bytes())
        trust = {"SSL_CERT_FILE": str(bundle), "REQUESTS_CA_BUNDLE": str(bundle)}
        if not self.forward_port:
            return trust
        url = f"http://127.0.0.1:{self.forward_port}"
        direct = "" if self.topology == "forward" else LOOPBACK
        return {"HTTPS_PROXY": url, "HTTP_PROXY": url, "https_proxy": url, "http_proxy": url,
                "NO_PROXY": direct, "no_proxy": direct, **trust}

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGINT (mitmdump flushes and closes the flow file), then SIGKILL if it hangs."""
        fd = self._take_ready_fd()
        if fd is not None:  # stopped before anyone waited for it to come up
            os.close(fd)
            self._failure = "mitmdump was stopped before it came up"
            self._settled.set()
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(2)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill_group(self.proc.pid)
                self.proc.wait(timeout=5)
        return self.proc.returncode

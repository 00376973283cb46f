"""Start and stop `mitmdump -s addons/tenancy.py` in front of the tenants' stubs.

Reverse topology: one `reverse:<stub>@127.0.0.1:<port>` listener per tenant (the listener names the
tenant). Forward topology: one regular listener; children reach `https://<tenant>.llm.test` through
`HTTPS_PROXY`, TLS is terminated with the CA in `certs/`, and the addon routes each host to its stub.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.procs import ProcessSet, kill_group
from harness.registry import Registry

REPO = Path(__file__).resolve().parents[1]
ADDON = REPO / "addons" / "tenancy.py"
CERTS = REPO / "certs"
FORWARD_DOMAIN = "llm.test"
READY_POLL = 0.01  # s between readiness probes: mitmdump takes 0.6-1 s to listen; a probe costs 0.1 ms


class ProxyError(RuntimeError):
    """mitmdump could not be started or did not come up."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# mitmdump's own entry point, run by the venv's python and named `mitmdump` (argv[0]; on Linux also the
# process name ps and psutil show). Once it returns, every addon's `done` has run (flows.mitm and the ledger
# are closed); the atexit handlers run and the buffers are flushed, and only the interpreter's teardown,
# 0.2-0.3 s of freeing objects, is skipped. An error exit (SystemExit) still exits the ordinary way.
MITMDUMP_MAIN = """\
import atexit, os, sys
sys.argv[0] = "mitmdump"
try:
    with open("/proc/self/comm", "w") as comm:
        comm.write("mitmdump")
except OSError:
    pass
from mitmproxy.tools.main import mitmdump
mitmdump()
atexit._run_exitfuncs()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
"""


def mitmdump_binary() -> Path:
    path = Path(sys.executable).parent / "mitmdump"
    if not path.exists():
        raise ProxyError(f"mitmdump not found next to {sys.executable}; run ./tenancy once to bootstrap")
    return path


def accepts(port: int, timeout: float = 0.5) -> bool:
    """Something listens on 127.0.0.1:`port`."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def protect_certs(confdir: Path = CERTS) -> None:
    """Every file mitmproxy keeps in its confdir (the CA key among them) is 0600."""
    confdir.mkdir(exist_ok=True)
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
    egress: str = "flag"
    confdir: Path = CERTS
    forward_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.out / "mitmdump.log"

    @property
    def flows_path(self) -> Path:
        return self.out / "flows.mitm"

    @property
    def ledger_path(self) -> Path:
        return self.out / "ledger.jsonl"

    def argv(self) -> list[str]:
        argv = [
            sys.executable, "-c", MITMDUMP_MAIN, "-q",
            "-s", str(ADDON),
            "--set", f"confdir={self.confdir}",
            "--set", f"tenancy_registry={self.registry_path}",
            "--set", f"tenancy_ledger={self.ledger_path}",
            "--set", f"tenancy_egress={self.egress}",
            "--set", f"save_stream_file={self.flows_path}",
            "--set", "listen_host=127.0.0.1",
            "--set", "termlog_verbosity=warn",
        ]
        if self.topology == "reverse":
            for t in self.registry:
                argv += ["--mode", f"reverse:{t.upstream}@127.0.0.1:{t.listen}"]
        else:
            argv += ["--mode", f"regular@127.0.0.1:{self.forward_port}", "--set", "connection_strategy=lazy"]
        return argv

    def ports(self) -> list[int]:
        if self.topology == "reverse":
            return [t.listen for t in self.registry if t.listen is not None]
        return [self.forward_port]

    def start(self, timeout: float = 30.0, attempts: int = 3) -> Proxy:
        """Start mitmdump and wait until every listener accepts; re-pick ports that are taken."""
        mitmdump_binary()  # mitmproxy is installed next to this python (else: how to bootstrap it)
        protect_certs(self.confdir)
        for attempt in range(attempts):
            taken = [p for p in self.ports() if accepts(p)]
            if not taken and self._launch(timeout):
                return self
            self._repick_ports()
            if attempt == attempts - 1:
                break
        tail = self.log_path.read_text(errors="replace")[-600:] if self.log_path.exists() else ""
        tail = " ".join(tail.split())[-300:]  # one line
        raise ProxyError(f"mitmdump did not come up after {attempts} attempts (listen ports "
                         f"{', '.join(map(str, self.ports()))}): {tail or 'no output'}")

    def _launch(self, timeout: float) -> bool:
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        env["PYTHONPATH"] = str(REPO)
        with self.log_path.open("ab") as log:
            self.proc = self.procs.spawn(self.argv(), env=env, cwd=self.out, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if all(accepts(p) for p in self.ports()):
                return True
            time.sleep(READY_POLL)
        kill_group(self.proc.pid)
        return False

    def _repick_ports(self) -> None:
        if self.topology == "reverse":
            for t in self.registry:
                t.route = {"listen": free_port()}
            self.registry.validate()
            self.registry.save(self.registry_path)
        else:
            self.forward_port = free_port()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def base_url(self, tenant: str) -> str:
        """Where a tenant's Hermes sends its provider calls: its route through the proxy."""
        t = self.registry[tenant]
        if self.topology == "reverse":
            return f"http://127.0.0.1:{t.listen}/v1"
        return f"https://{t.host}/v1"

    def child_env(self) -> dict[str, str]:
        """Extra environment for every Hermes child: in the forward topology, every connection goes through
        the proxy and trusts certifi's roots plus this project's CA (none of this in reverse)."""
        if self.topology == "reverse":
            return {}
        bundle = self.out / "ca-bundle.pem"
        if not bundle.exists():
            import certifi

            ca = (self.confdir / "mitmproxy-ca-cert.pem").read_bytes()
            bundle.write_bytes(Path(certifi.where()).read_bytes() + b"\n" + ca)
            bundle.chmod(0o600)
        url = f"http://127.0.0.1:{self.forward_port}"
        return {"HTTPS_PROXY": url, "HTTP_PROXY": url, "https_proxy": url, "http_proxy": url,
                "NO_PROXY": "", "no_proxy": "", "SSL_CERT_FILE": str(bundle), "REQUESTS_CA_BUNDLE": str(bundle)}

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGINT (mitmdump flushes and closes the flow file), then SIGKILL if it hangs."""
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

"""An audit's resources, owned by one `contextlib.ExitStack`: the children (`ProcessSet`), the signal handlers,
the listeners, the registry, the provider and service stubs and mitmdump.

`run.run_audit`, the pytest plugin and the benches set an audit up through `AuditSession` alike: bind every
listener (mitmdump's and each provider stub's) -> `mint` with those routes, upstreams and homes -> start the
stubs -> save the registry -> start mitmdump. Leaving the `with` block stops mitmdump, the stubs and every
child, whatever happened, and restores the signal handlers.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Self

from harness.capture.proxy import FORWARD_DOMAIN, Proxy, bind_listener, port_of
from harness.capture.stubs.base import Service, stop_all
from harness.capture.stubs.derived import Deriver
from harness.capture.stubs.provider import StubProvider
from harness.core.evidence import EvidenceFolder
from harness.core.files import SERVICE_RECORDS, write_private
from harness.core.procs import ProcessSet, reap_stale
from harness.core.registry import PROVIDER, Registry, mint
from harness.drive import services
from harness.drive.hermes.agent import Sandbox
from harness.drive.services import PROVIDER_SERVICE, SERVICES


class Interrupted(BaseException):
    """SIGTERM/SIGINT: unwind through every exit callback so children are reaped."""


def tenant_names(n: int) -> list[str]:
    greek = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda"]
    rest = greek + [f"tenant{i}" for i in range(len(greek), n)]
    return ["default", *rest[: n - 1]]


def _silent(_: str) -> None:
    pass


@dataclass(frozen=True)
class Setup:
    """What a session sets up: the `topology`, the services besides the provider (`service_names`), how the stubs
    answer (`stub_mode`, `stub_fault`) and the `scenario` the addon labels findings with, with the phase the run
    names (`Proxy.label`; None: no labels)."""

    topology: str = "reverse"
    service_names: Sequence[str] = ()
    stub_mode: str = "observe"
    stub_fault: str = ""
    scenario: str | None = None


@dataclass(frozen=True)
class Guard:
    """How a session guards a run: with `signals`, SIGTERM/SIGINT stop every child and raise `Interrupted`, and
    `on_interrupt` runs once every child is gone; with `reap`, it first reaps what an earlier killed run left;
    `say` reports progress."""

    signals: bool = False
    reap: bool = False
    on_interrupt: Callable[[Interrupted], None] | None = None
    say: Callable[[str], None] = _silent


class AuditSession:
    """One audit's set-up and tear-down. Enter it, then `mint`, `start_stubs` and `start_proxy` (or `open`, all
    three); every resource is released on exit, in reverse order.

    `setup`: what it sets up (`Setup`); `guard`: signals, reaping, progress (`Guard`). `procs`: the caller's
    `ProcessSet` (kept open on exit), else one of the session's own (closed on exit, its survivors in
    `survivors`).
    """

    def __init__(self, out: Path, names: Sequence[str] = (), *, setup: Setup | None = None, guard: Guard | None = None,
                 sandbox: Sandbox | None = None, registry_path: Path | None = None,
                 procs: ProcessSet | None = None) -> None:
        setup, guard = setup or Setup(), guard or Guard()
        self.out, self.folder = out, EvidenceFolder(out)
        self.names = list(names)
        self.sandbox = sandbox or Sandbox(out / "sandbox")
        self.registry_path = registry_path or self.folder.registry
        self.topology = setup.topology
        self.service_names = list(setup.service_names)
        self.stub_mode, self.stub_fault = setup.stub_mode, setup.stub_fault
        self.scenario = setup.scenario
        self.phase_file = self.folder.phase_file if setup.scenario else None
        self._own_procs = procs is None
        self._procs = procs
        self._guard = guard
        self.stack = contextlib.ExitStack()
        self.registry: Registry | None = None
        self.listeners: list[socket.socket] = []
        self._routes: dict[tuple[str, str], dict[str, Any]] = {}
        self._stub_socks: dict[str, socket.socket] = {}
        self.stubs: dict[str, StubProvider] = {}
        self.service_stubs: dict[tuple[str, str], Service] = {}
        self.proxy: Proxy | None = None
        self.survivors = 0

    @property
    def procs(self) -> ProcessSet:
        assert self._procs is not None, "the session is not entered"
        return self._procs

    def __enter__(self) -> Self:
        with self.stack as stack:
            if self._guard.reap and (reaped := reap_stale()):
                self._guard.say(f"reaped {reaped} process(es) left by an earlier run")
            if self._own_procs:
                self._procs = ProcessSet()
            if self._guard.signals:
                handler = _interrupter(self.procs)
                for signum in (signal.SIGTERM, signal.SIGINT):
                    stack.callback(signal.signal, signum, signal.signal(signum, handler))
            if self._guard.on_interrupt is not None:  # after every child is gone; a second signal is still ignored
                stack.push(self._interrupted)
            if self._own_procs:
                stack.callback(self._close_procs)
            self.stack = stack.pop_all()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        return self.stack.__exit__(kind, exc, tb)

    def _interrupted(self, _kind: type[BaseException] | None, exc: BaseException | None, _tb: Any) -> None:
        if isinstance(exc, Interrupted) and self._guard.on_interrupt is not None:
            self._guard.on_interrupt(exc)

    def _close_procs(self) -> None:
        self.survivors = len(self.procs.close())
        if self.survivors:
            print(f"tenancy-audit: {self.survivors} child process(es) survived teardown", file=sys.stderr)

    def open(self, *, wait: bool = True) -> Proxy:
        """`mint`, `start_stubs` and `start_proxy`: the whole set-up."""
        self.mint()
        self.start_stubs()
        return self.start_proxy(wait=wait)

    def mint(self, names: Sequence[str] | None = None) -> Registry:
        """Bind the listeners (one per tenant and proxied service in the reverse topology, and the regular one) and
        a socket per provider stub, then mint the tenants with those routes, upstreams and homes and every service's
        canaries, and save the registry. Everything is bound first, so the registry names ports nobody else can
        take before mitmdump and the stubs serve them. `names`: other tenants than the session's (a fresh
        registry; the listeners bound before stay held until the session ends)."""
        if names is not None:
            self.names = list(names)
        proxied = [s for s in self.service_names if services.listens(s)]
        ends = [(n, s) for n in self.names for s in (PROVIDER, *proxied)] if self.topology == "reverse" else []
        listeners = {end: self._bind() for end in ends}
        # the regular listener: the forward topology's, and in the reverse one where every other request goes
        self.listeners = [*listeners.values(), self._bind()]  # those of an earlier mint stay closed by the stack
        self._routes = {end: {"listen": port_of(sock)} for end, sock in listeners.items()}
        self._stub_socks = {n: self._bind() for n in self.names}
        registry = mint(self.names, self.sandbox.root / "work", {n: self.route(n, PROVIDER) for n in self.names},
                        upstreams={n: f"http://127.0.0.1:{port_of(s)}" for n, s in self._stub_socks.items()},
                        homes={n: self.sandbox.home_of(n) for n in self.names})
        services.mint(registry, self.service_names)
        registry.save(self.registry_path)
        self.registry = registry
        return registry

    def _bind(self) -> socket.socket:
        sock = bind_listener()
        self.stack.callback(sock.close)  # a no-op once mitmdump or a stub owns it
        return sock

    def route(self, tenant: str, service: str) -> dict[str, Any]:
        """Where mitmdump takes a tenant's calls to `service`: its own listener, or a host of the forward proxy."""
        if self.topology == "reverse":
            return self._routes[(tenant, service)]
        host = f"{tenant}.{FORWARD_DOMAIN}"
        return {"host": host if service == PROVIDER else f"{service}.{host}"}

    def start_stubs(self) -> dict[str, StubProvider]:
        """Each tenant's provider stub (on its socket bound by `mint`) and one stub per tenant and service, whose
        routes and upstreams go into the registry; the registry is saved again."""
        registry = self.require_registry()
        self.stack.callback(lambda: stop_all([*self.stubs.values(), *self.service_stubs.values()]))
        deriver = Deriver(registry, self.registry_path)
        for t in registry:
            stub = PROVIDER_SERVICE.make(t, self.stub_mode)
            assert isinstance(stub, StubProvider), "the provider's stub is scripted by the battery"
            stub.fault, stub.deriver = self.stub_fault, deriver
            self.stubs[t.name] = stub.start(self._stub_socks[t.name])
            for name in self.service_names:
                stub = self.service_stubs[(t.name, name)] = SERVICES[name].make(t, self.stub_mode)
                if isinstance(stub, StubProvider):  # a model: its text answers are derived from what it is asked
                    stub.deriver = deriver
                stub.start()
                services.attach(registry, name, t.name, self.route(t.name, name) if services.listens(name) else None,
                                stub.url)
        self.folder.subfolder(SERVICE_RECORDS)
        registry.save(self.registry_path)
        return self.stubs

    def start_proxy(self, *, wait: bool = True) -> Proxy:
        """mitmdump with the addon on the listeners `mint` bound; `wait=False` returns at once (a connection made
        meanwhile waits in its listener's backlog: `Proxy.wait_ready`)."""
        registry = self.require_registry()
        self.folder.subfolder()
        proxy = Proxy(registry, self.registry_path, self.out, self.procs, topology=self.topology,
                      listeners=self.listeners, phase_file=self.phase_file)
        self.listeners = []
        self.stack.callback(_quietly, proxy.stop)  # teardown goes on whatever stopping it raises
        self.proxy = proxy
        if self.phase_file is not None:
            proxy.label(self.scenario, "end")  # outside every phase, as the home scans
        if wait:
            proxy.start()
        else:
            proxy.spawn()
        return proxy

    def require_registry(self) -> Registry:
        if self.registry is None:
            raise RuntimeError("the session has no registry yet: call mint() first")
        return self.registry

    def finish(self) -> list[str]:
        """Stop mitmdump (the flow file is then complete) and every child (the homes no longer change), and write
        the stubs' log; returns why the run may not be conclusive."""
        reasons = []
        if self.proxy is not None:
            if not self.proxy.alive():
                reasons.append("mitmdump died during the run; flows after its death were not recorded")
            self.proxy.stop()
        reasons += self.procs.quiesce()
        write_stub_log(self.folder.stub_log, [*self.stubs.values(), *self.service_stubs.values()])
        if self.phase_file is not None:
            self.phase_file.unlink(missing_ok=True)
        return reasons


def _interrupter(procs: ProcessSet) -> Callable[[int, FrameType | None], None]:
    """SIGTERM/SIGINT: stop every child at once (no worker thread waits out its turn), then unwind; a
    second signal is ignored so that teardown always finishes."""
    fired = False

    def handler(signum: int, _frame: FrameType | None) -> None:
        nonlocal fired
        if not fired:
            fired = True
            procs.terminate()
            raise Interrupted(signal.Signals(signum).name)

    return handler


def _quietly(stop: Callable[[], object]) -> None:
    with contextlib.suppress(Exception):
        stop()


def write_stub_log(path: Path, stubs: list[Service]) -> None:
    """`stubs.jsonl`: every request every stub saw, one line each (what `_bypass` checks against the flows)."""
    lines = [json.dumps({"tenant": s.tenant.name, **r.to_dict()}) for s in stubs for r in s.snapshot()]
    write_private(path, ("\n".join(lines) + "\n").encode() if lines else b"")

"""The scenario context: what a driver needs (registry, sandbox, Hermes, proxy, stubs, options) and what it
records for the reconciler (phases, turns, findings it observes directly)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.capture.file_versions import FileVersions
from harness.capture.proxy import Proxy
from harness.capture.stubs.base import Service
from harness.capture.stubs.provider import StubProvider
from harness.core.findings import Finding
from harness.core.record import Phase
from harness.core.registry import Registry
from harness.detect.engine.matcher import Matcher, matcher_for
from harness.drive.hermes.agent import Hermes, Sandbox, TurnResult, gateway_config
from harness.drive.hermes.features import Features
from harness.drive.hermes.rpc import RpcLog
from harness.drive.platforms import OUT_OF_SCOPE
from harness.drive.services import DEFAULT_SERVICES, SERVICES, TOOL_GROUPS, UNSETTABLE

#: The scenario that drives every front door in turn (`--scenario all`).
ALL = "all"
#: The prefix of an `--unset` setting the launch profile leaves unset (`launch:SERVICE.NAME`; without it the run's
#: second tenant does).
LAUNCH_UNSET = "launch:"


@dataclass
class ScenarioOptions:
    """What the drivers take from the run's options."""

    turns: int = 1
    timeout: float = 180.0
    phases: list[str] = field(default_factory=list)  # multi-profile phases to run (default: all but cron)
    cron_wait: float = 75.0
    tools: list[str] = field(default_factory=lambda: list(TOOL_GROUPS))  # battery groups; [] = env probe only
    services: list[str] = field(default_factory=lambda: list(DEFAULT_SERVICES))  # services besides the provider
    unset: list[str] = field(default_factory=list)  # settings the second tenant (`launch:`: the launch) leaves unset


@dataclass
class Context:
    """What a scenario driver needs, and what it records (phases, turns) for the reconciler."""

    registry: Registry
    registry_path: Path
    sandbox: Sandbox
    hermes: Hermes
    proxy: Proxy
    stubs: dict[str, StubProvider]
    opts: ScenarioOptions
    out: Path
    say: Callable[[str], None]
    gateway_port: int = 0
    scenario: str = ""
    current_phase: str | None = None
    phases: list[Phase] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)  # what drivers observe directly (route_auth, bleed)
    rpc_logs: dict[str, RpcLog] = field(default_factory=dict)
    service_stubs: dict[tuple[str, str], Service] = field(default_factory=dict)  # (tenant, service) -> its stub
    features: Features = field(default_factory=Features)  # what the release offers
    versions: FileVersions | None = None  # every version of the home files, kept while the scenario runs
    versions_kept: dict[str, Any] = field(default_factory=dict)  # what `versions` kept (the run's record)
    during: list[threading.Thread] = field(default_factory=list)  # plants' writers acting while Hermes runs
    _owners: dict[str, str | None] = field(default_factory=dict)
    _run_scenario: str = field(default="", init=False)

    def __post_init__(self) -> None:
        self._run_scenario = self.scenario  # `all` changes `scenario` as it goes; between phases: the run's

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.proxy.label(self.scenario, name)
        start = time.time()
        self.current_phase = name
        self.say(f"phase {self.scenario}/{name}")
        try:
            yield
            self.settle()
        finally:
            if self.versions is not None:  # what changed in the phase, also without inotify
                self.versions.sweep()
            self.phases.append(Phase(self.scenario, name, start, time.time()))
            self.current_phase = None
            self.proxy.label(self._run_scenario, "end")

    def settle(self, quiet: float = 0.3, longest: float = 5.0) -> None:
        """Wait until no stub has received a request for `quiet` seconds (at most `longest`): what Hermes sends
        in the background after a turn (a memory provider's sync) belongs to the phase of that turn, every run."""
        deadline = time.monotonic() + longest
        while time.monotonic() < deadline:
            if self.idle_seconds() >= quiet:
                return
            time.sleep(0.1)

    def idle_seconds(self) -> float:
        """Seconds since any stub (a provider's or a service's) last received a request that was not a keep-alive
        (a bot's long poll that got nothing comes every few seconds whatever Hermes does)."""
        stubs = [*self.stubs.values(), *self.service_stubs.values()]
        last = (next((r.time for r in reversed(s.snapshot()) if not r.background), 0.0) for s in stubs)
        return time.time() - max(last, default=0.0)

    def matcher(self) -> Matcher:
        return matcher_for(self.registry)

    def mint(self, tenant: str, kind: str, value: str) -> str:
        """Register a canary minted mid-scenario (as `kind_2`... when `kind` is taken); the addon reloads the
        registry file. Returns the kind it was registered as."""
        kind = self.registry.free_kind(tenant, kind)
        self.registry.add_canary(tenant, kind, value)
        self.registry.save(self.registry_path)
        return kind

    def rpc_log(self, name: str) -> RpcLog:
        if name not in self.rpc_logs:
            (self.out / "logs").mkdir(exist_ok=True)
            self.rpc_logs[name] = RpcLog(self.out / "logs" / f"rpc-{name}.jsonl")
        return self.rpc_logs[name]

    def record(self, result: TurnResult, phase: str, *, snapshot: bool = True) -> None:
        """Log a driven step; `snapshot` False when it does not run the env probe (nothing to expect)."""
        flows = sum(1 for _ in self.proxy.ledger_path.open()) if self.proxy.ledger_path.exists() else 0
        entry = {"scenario": self.scenario, "phase": phase, "tenant": result.tenant, "driver": result.driver,
                 "ok": result.ok, "seconds": round(result.seconds, 2), "detail": result.detail, "flows": flows}
        if not snapshot:
            entry["snapshot"] = False
        self.timeline.append(entry)
        if result.log is not None:
            self._owners[result.log.name] = result.tenant
        state = "ok" if result.ok else f"FAILED ({result.detail})"
        self.say(f"  {result.tenant:<10} {result.driver:<8} {result.seconds:5.1f}s  flows so far {flows:<4} {state}")

    def log_owner(self, path: Path) -> str | None:
        """The tenant a log belongs to, or None for a backend serving every tenant."""
        return self._owners.get(path.name)

    def expected_snapshots(self) -> dict[str, int]:
        """Each completed turn must have produced one env snapshot on its tenant's route."""
        want: dict[str, int] = {}
        for e in self.timeline:
            if e["ok"] and e.get("snapshot", True):
                want[e["tenant"]] = want.get(e["tenant"], 0) + 1
        return want

    def services(self) -> list[str]:
        """The services this run drives: those asked for that the release and the topology support."""
        return [s for s, state in self.service_states().items() if state == "on"]

    def service_states(self) -> dict[str, str]:
        """Every service: `on`, `n/a: <why>` (the release lacks it, or the topology), or `not driven: <how>` (not
        asked for: the option that drives it)."""
        states = {}
        for name, spec in SERVICES.items():
            if name not in self.opts.services:
                one = f" (one {spec.slot} per run)" if spec.slot else ""
                states[name] = f"not driven: --{'platforms' if spec.messaging else 'services'} {name}{one}"
            elif not self.features.offers(name):
                states[name] = f"n/a: {spec.coverage.lacks}"
            elif self.proxy.topology == "forward" and spec.coverage.forward:
                states[name] = f"n/a: {spec.coverage.forward}"
            else:
                states[name] = "on"
        return states

    def platform_states(self) -> dict[str, str]:
        """Every messaging platform adapter the release ships (or, unasked, every one this tool knows): a plug-in's
        state as a service's, else `out of scope: <why>`."""
        states = self.service_states()
        known = {n for n, s in SERVICES.items() if s.messaging}
        names = self.features.platforms if self.features.platforms is not None else known | set(OUT_OF_SCOPE)
        return {n: states[n] if n in known else
                f"out of scope: {OUT_OF_SCOPE.get(n, 'no plug-in for this adapter, new to this release')}"
                for n in sorted(names)}

    def services_to_drive(self) -> list[str]:
        """The services each scenario must drive: those on that every turn drives, or whose battery group ran
        (a service on that none of a scenario's requests reached makes the run inconclusive)."""
        return [s for s in self.services() if SERVICES[s].passive or SERVICES[s].battery.group in self.opts.tools]

    def unset_by(self, tenant: str) -> list[str]:
        """The settings (`SERVICE.NAME`) `tenant` leaves unset: the run's `--unset`, those without a prefix for its
        second tenant, those with `launch:` for the launch profile (a platform it lacks, say)."""
        second = tenant == self.registry.names()[1]
        launch = tenant == self.sandbox.launch
        return [s.removeprefix(LAUNCH_UNSET) for s in self.opts.unset
                if (launch if s.startswith(LAUNCH_UNSET) else second)]

    def relaxed(self, tenant: str, service: str, what: str) -> bool:
        """Whether `tenant` need not show `what` (`surface.RELAXES`) at `service`: a setting it leaves unset there
        made that happen."""
        return any(s.split(".", 1)[0] == service and what in UNSETTABLE[s].relaxes for s in self.unset_by(tenant))

    def extra_config(self, tenant: str) -> dict[str, Any]:
        if tenant == self.sandbox.launch and self.gateway_port:
            return gateway_config(self.gateway_port, self.registry[tenant].canaries["api_server_key"])
        return {}

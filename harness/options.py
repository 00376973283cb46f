"""What an audit and a release matrix are asked to do: their options, checked before anything is written
(`check_options`, `check_matrix_options`: UsageError otherwise), and the parsers of the values the command line
and the pytest plugin give them."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from harness.capture.stubs.base import MODES
from harness.core import dsse
from harness.core.evidence import UsageError
from harness.drive import battery, plants, services
from harness.drive.context import LAUNCH_UNSET, ScenarioOptions
from harness.drive.doors import ALL, DOORS, SCENARIOS, backend_offers_every_tool, default_tenants
from harness.drive.hermes.install import default_python
from harness.drive.phases import DEFAULT_PHASES, KNOWN_PHASES
from harness.drive.services import DEFAULT_SERVICES, PROVIDER_SERVICE, SERVICES, TOOL_GROUPS
from harness.report import policy as policies
from harness.report.matrix import Plan

_SHARD = re.compile(r"(\d+)/(\d+)")


@dataclass
class RunOptions:
    scenario: str = "oneshot"
    tenants: int = 2  # the command line's default depends on the scenario: `default_tenants`
    topology: str = "reverse"
    plants: list[str] = field(default_factory=list)
    baseline: Path | None = None
    out: Path | None = None
    hermes_python: Path | None = None
    force: bool = False
    quiet: bool = False
    turns: int = 1
    timeout: float = 180.0
    stub_fault: str = ""
    redact: bool = False  # also write redacted/: flows, ledger, reports with every secret as <tenant:kind>
    phases: list[str] = field(default_factory=list)  # multi-profile phases to run (default: all but cron)
    cron_wait: float = 75.0
    tools: list[str] | None = None  # tool battery groups (None: every group; []: the env probe only)
    stubs: str = "observe"  # "strict": a stub answers a foreign key with 401
    policy: str = policies.DEFAULT  # the isolation policy: `hermes`, `strict` or a policy file
    services: list[str] | None = None  # services besides the provider (None: the default ones; []: the provider only)
    unset: list[str] = field(default_factory=list)  # settings (`SERVICE.NAME`; `launch:SERVICE.NAME`) left unset
    sign_key: Path | None = None  # an ed25519 private key (PEM): the evidence folder's manifest is signed with it

    def tool_groups(self) -> list[str]:
        return list(TOOL_GROUPS) if self.tools is None else list(self.tools)

    def service_names(self) -> list[str]:
        return list(DEFAULT_SERVICES) if self.services is None else list(self.services)

    def scenario_options(self) -> ScenarioOptions:
        return ScenarioOptions(turns=self.turns, timeout=self.timeout, phases=list(self.phases),
                               cron_wait=self.cron_wait, tools=self.tool_groups(), services=self.service_names(),
                               unset=list(self.unset))


def check_options(opts: RunOptions) -> None:
    """Every option is valid before anything is written (UsageError otherwise)."""
    if opts.scenario not in SCENARIOS:
        raise UsageError(f"unknown scenario {opts.scenario!r} (choose from {', '.join(SCENARIOS)})")
    for p in opts.plants:
        if p not in plants.PLANTS:
            raise UsageError(f"unknown plant {p!r} (choose from {', '.join(plants.PLANTS)})")
        if plants.TOPOLOGY.get(p, opts.topology) != opts.topology:
            raise UsageError(f"plant {p!r} needs --topology {plants.TOPOLOGY[p]}")
        doors = SERVICES[plants.SERVICE_PLANTS[p][0]].doors if p in plants.SERVICE_PLANTS else ()
        if doors and opts.scenario not in (*doors, ALL):
            raise UsageError(f"plant {p!r} needs a scenario whose Hermes runs its service (--scenario "
                             f"{', '.join(doors)} or all)")
        if p in plants.DOOR_PLANTS and opts.scenario not in (plants.DOOR_PLANTS[p][0], ALL):
            raise UsageError(f"plant {p!r} needs --scenario {plants.DOOR_PLANTS[p][0]} or all")
        if lacking := set(plants.DOOR_PLANTS.get(p, ("", ()))[1]) - set(opts.phases or DEFAULT_PHASES):
            raise UsageError(f"plant {p!r} needs --phases {','.join(sorted(lacking))}")
        if p in plants.SCENARIO and p not in plants.DOOR_PLANTS and not doors and not backend_offers_every_tool(
                opts.scenario):
            choices = ", ".join(n for n, d in DOORS.items() if d.backend)
            raise UsageError(f"plant {p!r} needs a scenario whose Hermes offers its tool (--scenario {choices} "
                             "or all)")
    for ph in opts.phases:
        if ph not in KNOWN_PHASES:
            raise UsageError(f"unknown phase {ph!r} (choose from {', '.join(KNOWN_PHASES)})")
    if {"kanban", "toolsets"} <= set(opts.phases):
        raise UsageError("phases kanban and toolsets cannot run in one audit (kanban gives every profile the toolset "
                         "toolsets judges)")
    unknown = battery.check_groups(opts.tool_groups())
    if unknown:
        raise UsageError(f"unknown tool group {unknown[0]!r} (choose from {', '.join(TOOL_GROUPS)}, or none)")
    unknown = services.check(opts.service_names())
    if unknown:
        raise UsageError(f"unknown service {unknown[0]!r} (choose from {', '.join(SERVICES)}, or none)")
    for name in opts.service_names():
        doors = SERVICES[name].doors
        if SERVICES[name].messaging is not None and opts.scenario not in (*doors, ALL):
            raise UsageError(f"platform {name!r} needs --scenario {' or '.join(doors)} or all")
    for entry in opts.unset:
        setting = entry.removeprefix(LAUNCH_UNSET)
        if setting not in services.UNSETTABLE:
            raise UsageError(f"unknown setting {setting!r} for --unset (choose from "
                             f"{', '.join(services.UNSETTABLE)}, each also as {LAUNCH_UNSET}SERVICE.NAME)")
        if setting.split(".", 1)[0] not in (PROVIDER_SERVICE.name, *opts.service_names()):
            raise UsageError(f"--unset {entry}: the run does not drive {setting.split('.', 1)[0]!r}")
    clash = services.conflicts(opts.service_names())
    if clash:
        raise UsageError(clash)
    for p in opts.plants:
        if p in plants.SERVICE_PLANTS and plants.SERVICE_PLANTS[p][0] not in opts.service_names():
            raise UsageError(f"plant {p!r} needs the service {plants.SERVICE_PLANTS[p][0]!r} (--services)")
    if opts.stubs not in MODES:
        raise UsageError(f"unknown stub mode {opts.stubs!r} (choose from {', '.join(MODES)})")
    if opts.tenants < 2:
        raise UsageError("--tenants must be at least 2")


def hermes_python(opt: Path | None, say: Callable[[str], None] | None = None) -> Path:
    """--hermes-python, else $TENANCY_HERMES_PYTHON, else the default (`install.default_python`: installed first
    when `say` is given); absolute, links kept (a venv's python is a symlink, and resolving it would leave the
    venv)."""
    if opt is not None:
        return Path(os.path.abspath(opt))
    if env := os.environ.get("TENANCY_HERMES_PYTHON"):
        return Path(os.path.abspath(env))
    return default_python(say)


@dataclass
class MatrixOptions:
    releases: dict[str, Path | None]  # version -> a python to use, or None to install it into the cache
    scenarios: list[str]
    runs: int
    out: Path
    tools: list[str] | None = None
    phases: list[str] = field(default_factory=list)  # none: each scenario's default phases
    services: list[str] | None = None  # None: every service
    shard: tuple[int, int] | None = None
    timeout: float = 180.0
    force: bool = False
    quiet: bool = False
    sign_key: Path | None = None  # every run's manifest is signed with it (`RunOptions.sign_key`)

    @property
    def plan(self) -> Plan:
        return plan_of(list(self.releases), self.scenarios, self.runs, self.tools, self.phases, self.services)


def plan_of(releases: list[str], scenarios: list[str], runs: int, tools: list[str] | None,
            phases: list[str], services: list[str] | None = None) -> Plan:
    """The plan of these runs. Phases are recorded in run order, each once, and the default as None, so that
    two spellings of the same runs merge; services in their table's order, every one as None."""
    ordered = tuple(p for p in KNOWN_PHASES if p in phases)
    chosen = None if services is None else tuple(s for s in SERVICES if s in services)
    return Plan(tuple(releases), tuple(scenarios), runs, None if tools is None else tuple(tools),
                None if not ordered or ordered == DEFAULT_PHASES else ordered,
                None if chosen == DEFAULT_SERVICES else chosen)


def parse_releases(spec: str) -> dict[str, Path | None]:
    """`0.16.0,0.19.0=/path/to/python`: versions (PEP 440), each optionally with the python of an install."""
    releases: dict[str, Path | None] = {}
    for item in (i.strip() for i in spec.split(",")):
        version, _, python = item.partition("=")
        version = version.strip()
        try:
            Version(version)
        except InvalidVersion:
            raise UsageError(f"--hermes: {item!r} is not a release version (e.g. 0.19.0 or 0.19.0=/path/to/python)"
                             ) from None
        if version in releases:
            raise UsageError(f"--hermes: {version} is listed twice")
        if python and not Path(python).exists():
            raise UsageError(f"--hermes: the python {python} given for {version} does not exist")
        releases[version] = Path(python).absolute() if python else None
    return releases


def parse_shard(spec: str) -> tuple[int, int]:
    """`I/N` with 1 <= I <= N."""
    m = _SHARD.fullmatch(spec.strip())
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise UsageError(f"--shard {spec!r}: expected I/N with 1 <= I <= N (e.g. 1/4)")
    return int(m[1]), int(m[2])


def parse_scenarios(spec: str) -> list[str]:
    """A scenario, a comma-separated list, or `all` (every scenario, each as its own audit)."""
    if spec.strip() == "all":
        return [s for s in SCENARIOS if s != "all"]
    names = [s.strip() for s in spec.split(",") if s.strip()]
    for name in names:
        if name not in SCENARIOS or name == "all":
            raise UsageError(f"--scenario: unknown scenario {name!r} (choose from {', '.join(SCENARIOS)})")
    if not names:
        raise UsageError("--scenario: name at least one scenario")
    return names


def check_matrix_options(opts: MatrixOptions) -> None:
    """UsageError unless every run of the matrix would accept its options."""
    if opts.runs < 1:
        raise UsageError("--runs must be at least 1")
    for scenario in opts.scenarios:
        check_options(RunOptions(scenario=scenario, tenants=default_tenants(scenario), tools=opts.tools,
                                 phases=list(opts.phases), services=opts.services))
    if opts.sign_key is not None:
        dsse.signing_key(opts.sign_key)  # a key that cannot sign is one line before anything runs

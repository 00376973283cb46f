"""Every service is a plug-in described once (`harness/drive/services/<name>.py`), every messaging platform
(`harness/drive/platforms/<name>.py`), every front door (`harness/drive/doors/<name>.py`) and every phase
(`harness/drive/phases/<name>.py`) too: each declares all its parts, the registries find them, and nothing else of
the harness names one."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

from harness.core.places import SOURCE
from harness.core.registry import Tenant, mint
from harness.drive import doors, phases, plants, platforms, services
from harness.drive.phases.base import PhaseSpec
from harness.drive.platforms.base import ChatStub
from harness.drive.services import ALL_SERVICES, SERVICES, TOOL_GROUPS
from harness.drive.surface import ServiceSpec, Turn, Where

DOCS, HARNESS = SOURCE / "docs", SOURCE / "harness"
platforms_ = {n for n, s in ALL_SERVICES.items() if s.messaging is not None}


def _tenant(tmp_path: Path) -> Tenant:
    reg = mint(["default", "alpha"], tmp_path / "work", {"default": {"listen": 1}, "alpha": {"listen": 2}})
    services.mint(reg, list(SERVICES))
    return reg["alpha"]


def _declared(package: object, attribute: str, kind: type) -> dict[str, list[str]]:
    """Every module of `package` by whether it declares an `attribute` of type `kind` (`with`) or not (`without`)."""
    out: dict[str, list[str]] = {"with": [], "without": []}
    for m in pkgutil.iter_modules(package.__path__):  # type: ignore[attr-defined]
        module = importlib.import_module(f"{package.__name__}.{m.name}")  # type: ignore[attr-defined]
        out["with" if isinstance(getattr(module, attribute, None), kind) else "without"].append(m.name)
    return out


def test_every_service_module_holds_one_registered_service():
    found, on = _declared(services, "SERVICE", ServiceSpec), _declared(platforms, "SERVICE", ServiceSpec)
    assert set(found["with"]) | set(on["with"]) == set(ALL_SERVICES)
    assert found["without"] == [] and on["without"] == ["base"], "a module of its own for each, and one base"
    assert next(iter(ALL_SERVICES)) == "provider" and "provider" not in SERVICES  # always on, not a choice


@pytest.mark.parametrize("name", sorted(ALL_SERVICES))
def test_a_service_declares_a_stub_canaries_coverage_and_a_plant(name, tmp_path):
    spec = ALL_SERVICES[name]
    tenant = _tenant(tmp_path)
    stub = spec.make(tenant, "observe")
    assert all(hasattr(type(stub), part) for part in ("start", "stop", "snapshot", "url"))
    assert spec.credential and spec.credential_env and spec.kinds()[0] == spec.credential
    assert spec.coverage.probe and (spec.coverage.lacks or not spec.optional)
    assert spec.plants and set(spec.plants) <= set(plants.PLANTS)
    assert f"`{name}`" in (DOCS / "services.md").read_text(), "a row of its own in docs/services.md"
    if spec.optional:
        assert set(spec.kinds()) <= set(tenant.canaries), "its canaries are minted"
        setup = spec.configure(tenant, Where("http://127.0.0.1:9", tmp_path / "registry.yaml", tmp_path))
        assert setup.env.get(spec.credential_env) == tenant.canaries[spec.credential]
        assert spec.battery.group in TOOL_GROUPS or spec.passive, "a battery group drives it, or every run does"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_a_service_s_battery_steps_name_only_its_own_tools(name, tmp_path):
    spec = SERVICES[name]
    tenant = _tenant(tmp_path)
    steps = [*spec.battery.writes(Turn(tenant, "s")), *spec.battery.reads(Turn(tenant, "s")),
             *spec.battery.lookups(Turn(tenant, "s", "default"))]
    assert {s.tool for s in steps} <= set(spec.battery.tools)
    assert spec.battery.parallel_safe <= set(spec.battery.tools)


#: Modules outside the package that may quote a service's name, and why: the stubs are the services' own
#: protocol side (a stub names its kind; the stdio server's record names it, and `detect.records` reads that
#: record format); `mcp` is also the pip extra of Hermes' MCP client; the scorecard seeds a registry of its own
#: (services and the paths their requests take), beside `drive` and not built from it.
QUOTE_A_SERVICE = {"capture/stubs/mcp_stdio.py", "capture/stubs/mcp_http.py", "detect/records.py",
                   "drive/hermes/install.py", "proof/cases.py", "proof/traffic.py"}


def _quoted_outside(package: Path, names: set[str]) -> list[str]:
    """Lines of the harness outside `package` (and `QUOTE_A_SERVICE`) that quote one of `names` as a string."""
    hits = []
    for path in HARNESS.rglob("*.py"):
        where = path.relative_to(HARNESS).as_posix()
        if package in path.parents or where in QUOTE_A_SERVICE:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if any(re.search(rf"""["']{re.escape(name)}["']""", line) for name in names):
                hits.append(f"{where}:{n}: {line.strip()}")
    return hits


def test_no_other_module_names_a_service():
    """A service is added by its module alone: no other module quotes its name (`aux`, `web`, `memory` and
    `delegation` are also words of other meanings, and checked by the registry's other tests)."""
    names = set(SERVICES) - {"aux", "delegation", "web", "memory"}
    assert _quoted_outside(HARNESS / "drive" / "services", names - set(platforms_)) == [], \
        "name a service only in its module"
    assert _quoted_outside(HARNESS / "drive" / "platforms", set(platforms_)) == [], \
        "name a platform only in its module"


def test_every_door_module_holds_one_registered_door():
    found = _declared(doors, "DOOR", doors.Door)
    assert set(found["with"]) == set(doors.DOORS)
    clients = {m for m in found["without"] if m.endswith("_client")}
    assert {c.removesuffix("_client") for c in clients} <= set(doors.DOORS), "a door's client is named after it"
    # besides the clients: the Door shape, the driver tui and serve share, and a step of the api_server door
    assert set(found["without"]) - clients == {"base", "rpc_doors", "run_control"}


@pytest.mark.parametrize("name", sorted(doors.DOORS))
def test_a_door_declares_its_driver_needs_tenants_and_docs(name):
    door = doors.DOORS[name]
    assert callable(door.drive) and door.summary and door.tenants >= 2
    assert all(lack for _, lack in door.needs)
    assert f"`{name}`" in (DOCS / "doors.md").read_text(), "a row of its own in docs/doors.md"


def test_door_coverage_says_what_each_door_did_and_what_no_door_drives():
    from harness.core.findings import Finding
    from harness.detect.tools import door_table

    states = doors.door_states("tui")
    assert states["tui"] == "on" and states["oneshot"] == "not driven: --scenario oneshot or all"
    assert all(states[n].startswith("out of scope: ") for n in doors.NOT_DRIVEN)
    assert {n for n, s in doors.door_states("all").items() if s == "on"} == set(doors.DOORS)
    assert doors.door_states("dashboard")["dashboard"] == "on"  # a door now, no longer a way no door drives
    assert not set(doors.NOT_DRIVEN) & set(doors.DOORS)
    turns = [{"scenario": "tui", "ok": True}, {"scenario": "serve", "ok": False}]
    states = {"tui": "on", "serve": "on", "gateway": "on", "kanban": "out of scope: not yet"}
    leak = Finding("request_leak", "default", "alpha", "memory", "request", "flow", scenario="gateway")
    short = Finding("shortfall", "alpha", None, None, "env", "run", scenario="tui")  # proves nothing leaked
    assert door_table(states, turns, [leak, short]) == {
        "tui": "driven", "serve": "failed", "gateway": "leak", "kanban": "out of scope: not yet"}


def test_a_way_in_that_a_phase_drives_is_covered_where_that_phase_ran():
    from harness.core.findings import Finding
    from harness.detect.tools import door_table

    assert doors.door_states("tui", ["turns", "approvals"])["tool approvals"] == "phase approvals"
    assert doors.door_states("all", ["approvals"])["tool approvals"] == "phase approvals"
    assert doors.door_states("tui")["tool approvals"] == "not driven: --phases approvals"  # the phase did not run
    assert doors.door_states("gateway", ["approvals"])["tool approvals"] == (  # not a phase of the door driven
        "not driven: --phases approvals (with --scenario tui or --scenario serve or all)")
    states = {"tool approvals": "phase approvals"}
    asked = [{"scenario": "tui", "phase": "approvals", "ok": True}]
    bled = Finding("profile_bleed", "alpha", "beta", "approval", "rpc", "tui:approval.request", scenario="tui",
                   phase="approvals")
    elsewhere = Finding("request_leak", "default", "alpha", "memory", "request", "flow", scenario="tui", phase="turns")
    assert door_table(states, asked, [bled]) == {"tool approvals": "leak"}
    assert door_table(states, asked, [elsewhere]) == {"tool approvals": "driven"}  # a leak of another phase
    assert door_table(states, [{**asked[0], "ok": False}], []) == {"tool approvals": "failed"}


def test_every_phase_module_holds_one_registered_phase():
    found = _declared(phases, "PHASE", PhaseSpec)
    assert {m.replace("_", "-") for m in found["with"]} == set(phases.PHASES)
    assert set(found["without"]) == {"base", "attachments", "kanban_workers"}  # the shape, and two phases' helpers


@pytest.mark.parametrize("name", sorted(phases.PHASES))
def test_a_phase_declares_its_doors_selection_coverage_and_plant(name):
    phase = phases.PHASES[name]
    assert phase.summary and phase.doors and set(phase.doors) <= set(doors.DOORS)
    assert phase.selection in ("default", "all", "opt-in", "platforms")
    assert phase.plant in plants.PLANTS or (not phase.plant and phase.unplanted), \
        "a plant the audit catches in the phase, or why there is none"
    assert f"`{name}`" in (DOCS / "phases.md").read_text(), "a row of its own in docs/phases.md"
    if phase.selection == "opt-in":
        assert phase.run is not None, "an opt-in phase runs where its doors run the phases that ask for it"
    if phase.way:
        assert doors.door_states("all", [name])[phase.way] == f"phase {name}"
        assert doors.door_states("all")[phase.way] == f"not driven: {phase.option}"


def test_every_platform_declares_its_messaging_kinds_a_chat_stub_and_a_row(tmp_path):
    assert platforms_, "at least one messaging platform"
    tenant = _tenant(tmp_path)
    for name in sorted(platforms_):
        spec = ALL_SERVICES[name]
        kinds = spec.messaging
        assert kinds is not None and {kinds.user, kinds.channel, kinds.post, kinds.file} <= set(spec.kinds())
        assert kinds.media_file and kinds.deliver and spec.doors == ("gateway",)
        assert isinstance(spec.make(tenant, "observe"), ChatStub)
        assert f"`{name}`" in (DOCS / "platforms.md").read_text(), "a row of its own in docs/platforms.md"
        setup = spec.configure(tenant, Where("http://127.0.0.1:9", tmp_path / "registry.yaml", tmp_path))
        assert setup.files.get(kinds.media_file), "every profile holds its media file"


def _run_options() -> set[str]:
    """Every option of `tenancy-audit run`."""
    import argparse

    from harness.arguments import parser

    commands = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {o for a in commands.choices["run"]._actions for o in a.option_strings}


def _check_state(row: str, state: str, options: set[str]) -> None:
    """`not driven: <an option of run> ...`, or `out of scope: <a reason that names no option>`, or a state of a
    driven row."""
    if state.startswith("not driven: "):
        assert state.split()[2] in options, (row, state)
    elif state.startswith("out of scope: "):
        assert not any(f" {o} " in f" {state} " or f"({o} " in state for o in options), (row, state)
    else:
        assert state in ("on", "driven", "leak", "allowed", "failed", "not offered") or state.startswith(
            ("phase ", "n/a: ")), (row, state)


def test_every_coverage_row_of_all_is_driven_not_driven_with_an_option_or_out_of_scope_with_a_reason():
    """Every coverage table of a run of `--scenario all` with the default options (doors and ways in, services,
    messaging platforms, the battery's tools): a row that says `not driven` names the option that drives it (an
    option of `tenancy-audit run`); one that says `out of scope` gives a reason that is no option of the tool (what
    the audit cannot do)."""
    from harness.core.protocol import OUT_OF_SCOPE as TOOLS_OUT
    from harness.core.record import RunRecord
    from harness.drive.context import Context, ScenarioOptions
    from harness.drive.hermes.features import Features
    from harness.judge import left_out

    options = _run_options()
    for row, state in doors.door_states("all").items():
        _check_state(row, state, options)
    for row, state in doors.door_states("tui").items():  # one door: every other and every way not driven
        _check_state(row, state, options)
    ctx = Context.__new__(Context)
    ctx.opts, ctx.features = ScenarioOptions(), Features()
    ctx.proxy = type("P", (), {"topology": "reverse"})()  # type: ignore[assignment]
    for table in (ctx.service_states(), ctx.platform_states()):
        assert table
        for row, state in table.items():
            _check_state(row, state, options)
    every = [t for tools in TOOL_GROUPS.values() for t in tools]
    for row, option in left_out(RunRecord(tools=every, services=ctx.service_states())).items():
        _check_state(row, f"not driven: {option}", options)
    for row, why in TOOLS_OUT.items():
        _check_state(row, f"out of scope: {why}", options)


def test_a_tool_the_options_left_out_names_the_option_that_drives_it():
    from harness.core.record import RunRecord
    from harness.judge import left_out

    every = [t for tools in TOOL_GROUPS.values() for t in tools]
    off = left_out(RunRecord(tools=every, services={"browser": "not driven: --services browser"}))
    assert off["browser_navigate"] == "--services browser"
    assert "browser_navigate" not in left_out(RunRecord(tools=every, services={"browser": "on"}))  # the near miss
    some = left_out(RunRecord(tools=list(TOOL_GROUPS["files"]), services={"browser": "on"}))
    assert some["memory"] == "--tools memory" and "read_file" not in some
    assert left_out(RunRecord()) == {}  # a record that names no tool says nothing of them

"""Every service is a plug-in described once (`harness/drive/services/<name>.py`), and every front door too
(`harness/drive/doors/<name>.py`): each declares all its parts, the registries find them, and nothing else of
the harness names one."""

from __future__ import annotations

import pkgutil
import re
from pathlib import Path

import pytest

from harness.core.places import SOURCE
from harness.core.registry import Tenant, mint
from harness.drive import doors, plants, services
from harness.drive.services import ALL_SERVICES, SERVICES, TOOL_GROUPS
from harness.drive.services.base import Turn, Where

DOCS, HARNESS = SOURCE / "docs", SOURCE / "harness"


def _tenant(tmp_path: Path) -> Tenant:
    reg = mint(["default", "alpha"], tmp_path / "work", {"default": {"listen": 1}, "alpha": {"listen": 2}})
    services.mint(reg, list(SERVICES))
    return reg["alpha"]


def test_every_service_module_holds_one_registered_service():
    modules = {m.name for m in pkgutil.iter_modules(services.__path__)} - {"base"}
    assert modules == set(ALL_SERVICES)
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
                   "drive/install.py", "proof/cases.py", "proof/traffic.py"}


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
    assert _quoted_outside(HARNESS / "drive" / "services", names) == [], "name a service only in its module"


def test_every_door_module_holds_one_registered_door():
    modules = {m.name for m in pkgutil.iter_modules(doors.__path__)} - {"base"}
    assert modules == set(doors.DOORS)


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
    assert doors.door_states("tui")["tool approvals"].startswith("out of scope: ")  # the phase did not run
    assert doors.door_states("gateway", ["approvals"])["tool approvals"].startswith("out of scope: ")  # not its phase
    states = {"tool approvals": "phase approvals"}
    asked = [{"scenario": "tui", "phase": "approvals", "ok": True}]
    bled = Finding("profile_bleed", "alpha", "beta", "approval", "rpc", "tui:approval.request", scenario="tui",
                   phase="approvals")
    elsewhere = Finding("request_leak", "default", "alpha", "memory", "request", "flow", scenario="tui", phase="turns")
    assert door_table(states, asked, [bled]) == {"tool approvals": "leak"}
    assert door_table(states, asked, [elsewhere]) == {"tool approvals": "driven"}  # a leak of another phase
    assert door_table(states, [{**asked[0], "ok": False}], []) == {"tool approvals": "failed"}

"""Negative controls: deliberate isolation breaks planted into real tenant homes.

Each plant copies something of the first tenant (the donor) into the second (the target) before Hermes
runs; the audit must then report at least the finding kinds listed in `PLANTS`. The plants of the tool
battery's stores (`TOOL_PLANTS`) must moreover be caught through a tool's result: a `request_leak`
attributed to one of the tools listed (the file scan alone does not count). The plants of a service's
settings (`SERVICE_PLANTS`) must be caught through that service: a finding that names it.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from datetime import timedelta
from pathlib import Path

from harness.drive.context import Context
from harness.drive.phases import PHASES
from harness.drive.phases.cron import add_job
from harness.drive.services import ALL_SERVICES, TOOL_GROUPS
from harness.drive.surface import Plant, PlantContext, edit_config


def _append(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write(text)


def _env(c: PlantContext) -> None:
    marker = c.donor.canaries["env_marker"]
    _append(c.target_home / ".env", f"PLANTED_PROVIDER_KEY={c.donor.key}\nPLANTED_MARKER={marker}\n")


def _memory(c: PlantContext) -> None:
    _append(c.target_home / "memories" / "MEMORY.md", f"{c.donor.canaries['memory']}\n")


def _soul(c: PlantContext) -> None:
    _append(c.target_home / "SOUL.md", f"Remember {c.donor.canaries['soul']}.\n")


def _cwd(c: PlantContext) -> None:
    edit_config(c.target_home, lambda cfg: cfg["terminal"].update(cwd=c.donor.canaries["workdir"]))


def _memory_entry(c: PlantContext) -> None:
    """A memory entry the donor's `memory` tool wrote, in the target's memory store."""
    _append(c.target_home / "memories" / "MEMORY.md", f"\n§\n{c.donor.canaries['tool_memory']} (planted)")


def _skill(c: PlantContext) -> None:
    """A skill of the donor (description and body canaries) in the target's skills."""
    name = f"tenancy-{c.donor.name}-planted"
    skill = c.target_home / "skills" / name
    skill.mkdir(parents=True, exist_ok=True)
    (skill / "SKILL.md").write_text(f"---\nname: {name}\ndescription: Tenancy audit skill "
                                    f"{c.donor.canaries['skill_desc']}\n---\n\n{c.donor.canaries['skill_body']}\n")


def _cronjob(c: PlantContext) -> None:
    """A cron job of the donor (its prompt canary) in the target's cron store, due in a day."""
    add_job(c.target_home, f"tenancy-{c.donor.name}-planted", f"{c.donor.canaries['cron_job']} (planted): say hello",
            timedelta(days=1))


def _code_marker(c: PlantContext) -> None:
    """The donor's env marker in a terminal setting of the target: `execute_code` passes its subprocess only an
    allowlist of the environment (no `.env` line), the terminal settings among it (`TERMINAL_DOCKER_IMAGE`)."""
    edit_config(c.target_home, lambda cfg: cfg["terminal"].update(docker_image=c.donor.canaries["env_marker"]))


def _home_path(c: PlantContext) -> None:
    """The donor's Hermes home in the target's `.env`: a path of another tenant in the tools' environment."""
    _append(c.target_home / ".env", f"TENANCY_PLANTED_HOME={c.donor.canaries['home']}\n")


def _kanban_card(c: PlantContext) -> None:
    """A kanban card of the donor on a board in the target's own home: the `hermes` policy allows every profile's
    cards at the shared root (the launch profile's home) only, so this one is a leak. Beside it, the near miss: a
    card one character off."""
    canary = c.donor.canaries["memory"]
    near = canary[:-1] + ("0" if canary[-1] != "0" else "1")
    db = c.target_home / "kanban" / "boards" / "tenancy-planted" / "kanban.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("CREATE TABLE tasks (id TEXT PRIMARY KEY, title TEXT, assignee TEXT)")
        conn.executemany("INSERT INTO tasks VALUES (?, ?, ?)", [("t_planted1", f"{canary} card", c.target.name),
                                                                 ("t_planted2", f"{near} card", c.target.name)])


def _dashboard(c: PlantContext) -> None:
    """The donor's env marker as the target's provider name, which the dashboard's public `/api/model/info`
    serves to any caller (`?profile=TARGET`): a served route answering without the session token with a canary
    of another tenant."""
    edit_config(c.target_home, lambda cfg: cfg["model"].update(provider=f"custom:{c.donor.canaries['env_marker']}"))


#: The files the transient writer writes and removes while Hermes runs, in the target's home.
TRANSIENT_FILE, NEAR_MISS_FILE = "tenancy-checkpoint.json", "tenancy-checkpoint-near.json"


def _transient(c: PlantContext) -> None:
    """A writer that, while the first phase runs, checkpoints a process of the donor into the target's home
    and removes it a second later, as Hermes' process registry does: only a watch of the homes sees it. Beside
    it, a near miss that must not be reported: the donor's canary one character off, and the target's own."""
    canary = c.donor.canaries["bg_process"]
    near = canary[:-1] + ("0" if canary[-1] != "0" else "1")
    own = c.target.canaries["memory"]

    def write() -> None:
        time.sleep(0.5)
        (c.target_home / TRANSIENT_FILE).write_text(json.dumps([{"command": f"echo {canary}", "pid": 1}]))
        (c.target_home / NEAR_MISS_FILE).write_text(json.dumps([{"command": f"echo {near} {own}", "pid": 1}]))
        time.sleep(1.0)
        for name in (TRANSIENT_FILE, NEAR_MISS_FILE):
            (c.target_home / name).write_text("[]")
        (c.target_home / NEAR_MISS_FILE).unlink()

    c.during.append(threading.Thread(target=write, name="plant-transient", daemon=True))



#: How long the ACP session writer keeps copying after the donor's state.db last changed (its turn is over).
ACP_QUIET_SECONDS = 4.0


def _copy_acp_sessions(donor_db: Path, target_db: Path, copied: set[int]) -> bool:
    """Copy the donor's ACP sessions and the messages not copied yet (`copied`: their ids) into the target's
    state.db, both made by Hermes; whether anything new was copied."""
    with contextlib.closing(sqlite3.connect(f"file:{target_db}", uri=True, timeout=5)) as conn, conn:
        conn.execute("ATTACH DATABASE ? AS donor", (f"file:{donor_db}?mode=ro",))
        ids = [r[0] for r in conn.execute("SELECT id FROM donor.sessions WHERE source = 'acp'")]
        conn.executemany("INSERT OR IGNORE INTO main.sessions SELECT * FROM donor.sessions WHERE id = ?",
                         [(i,) for i in ids])
        columns = [r[1] for r in conn.execute("PRAGMA main.table_info(messages)") if r[1] != "id"]
        new = [r[0] for r in conn.execute(
            f"SELECT id FROM donor.messages WHERE session_id IN ({','.join('?' * len(ids))})", ids)
            if r[0] not in copied]
        names = ", ".join(columns)
        conn.executemany(f"INSERT INTO main.messages ({names}) SELECT {names} FROM donor.messages WHERE id = ?",
                         [(i,) for i in new])
        copied.update(new)
        return bool(new)


def _acp_session(c: PlantContext) -> None:
    """The donor's ACP sessions in the target's state.db while Hermes runs, as if the target's ACP process read
    the donor's store: its `session/load` of the donor's session id then finds it (the door's `resume` phase).
    Its own session's load beside it is the near miss."""
    donor_db, target_db = Path(str(c.donor.home)) / "state.db", c.target_home / "state.db"

    def write() -> None:
        copied: set[int] = set()
        quiet_since = deadline = time.monotonic()
        deadline += 180.0
        while time.monotonic() < deadline and time.monotonic() - quiet_since < ACP_QUIET_SECONDS:
            time.sleep(0.2)
            if not (donor_db.exists() and target_db.exists()):
                quiet_since = time.monotonic()
                continue
            with contextlib.suppress(sqlite3.Error):  # a table not made yet, a lock held too long: next time
                if _copy_acp_sessions(donor_db, target_db, copied) or not copied:
                    quiet_since = time.monotonic()

    c.during.append(threading.Thread(target=write, name="plant-acp-session", daemon=True))


#: Plants of the tenants' own files and of the battery's tools (the services' are in their modules).
OWN_PLANTS: dict[str, Plant] = {
    "env": Plant(_env, frozenset({"env_leak", "file_leak"})),
    "memory": Plant(_memory, frozenset({"file_leak", "request_leak"})),
    "soul": Plant(_soul, frozenset({"file_leak", "request_leak"})),
    "cwd": Plant(_cwd, frozenset({"wrong_cwd", "wrong_path"})),
    "memory-entry": Plant(_memory_entry, frozenset({"file_leak", "request_leak"})),
    "skill": Plant(_skill, frozenset({"file_leak", "request_leak"})),
    "cronjob": Plant(_cronjob, frozenset({"file_leak", "request_leak"})),
    "code-env": Plant(_code_marker, frozenset({"env_leak"})),
    "home-path": Plant(_home_path, frozenset({"wrong_path"})),
    "transient": Plant(_transient, frozenset({"file_leak"})),
    "acp-session": Plant(_acp_session, frozenset({"profile_bleed"})),
    "kanban-card": Plant(_kanban_card, frozenset({"file_leak"})),
    "dashboard": Plant(_dashboard, frozenset({"route_auth"})),
}
#: Every plant by name: what it does and the finding kinds the audit must then report.
PLANTS: dict[str, Plant] = {**OWN_PLANTS, **{name: plant for spec in ALL_SERVICES.values()
                                              for name, plant in spec.plants.items()},
                             **{name: plant for phase in PHASES.values() for name, plant in phase.plants.items()}}
#: Plants only a watch of the homes during the run can catch: a finding of theirs must be `transient`.
TRANSIENT_PLANTS = frozenset({"transient"})
#: Plants of a service's settings: the service whose traffic (or record) must carry the finding, and the
#: battery group that drives it.
SERVICE_PLANTS: dict[str, tuple[str, str]] = {
    name: (spec.name, spec.battery.group) for spec in ALL_SERVICES.values()
    for name, plant in spec.plants.items() if plant.through_service}
#: Plants a tool of the battery must catch: the tools through which a finding of the plant's kinds must come
#: (a store's result, a tool subprocess's env).
TOOL_PLANTS: dict[str, frozenset[str]] = {
    "memory-entry": frozenset({"memory"}),
    "skill": frozenset({"skills_list", "skill_view"}),
    "cronjob": frozenset({"cronjob"}),
    "code-env": frozenset({"execute_code"}),
    "home-path": frozenset({"terminal", "execute_code"}),
}
#: Plants the battery's other tools must drive to be seen at all (no finding names the tool: the subagent's own
#: requests carry the model): the battery group they need.
DRIVEN_BY: dict[str, str] = {
    name: spec.battery.group for spec in ALL_SERVICES.values()
    for name, plant in spec.plants.items() if not plant.through_service and spec.battery.group}


def battery_for(name: str) -> list[str]:
    """The battery groups a plant's run needs: those of the tools it must be caught through; none (the env
    probe only) for the other plants, which test the detectors (and a bypass must end inconclusive, which a
    leak the battery finds in Hermes, F8, would turn into a leak)."""
    if name in SERVICE_PLANTS:  # a service without tools (a phase drives it) needs none
        return [SERVICE_PLANTS[name][1]] if SERVICE_PLANTS[name][1] in TOOL_GROUPS else []
    if name in DRIVEN_BY:
        return [DRIVEN_BY[name]]
    tools = TOOL_PLANTS.get(name, frozenset())
    return [group for group, members in TOOL_GROUPS.items() if tools & set(members)]


def services_for(name: str) -> list[str]:
    """The services a plant's run needs: its own for a service's plant, none for the others (they test the
    detectors, which the services only slow down)."""
    return [SERVICE_PLANTS[name][0]] if name in SERVICE_PLANTS else []


#: Plants only one door can catch, with the phases beyond `turns` they need: the ACP adapter's sessions (its door's
#: `resume` phase), the dashboard's public route (its door's own probe, which its end-to-end test plants).
DOOR_PLANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "acp-session": ("acp", ("resume",)), "dashboard": ("dashboard", ()),
    **{name: (phase.doors[0], (phase.name,)) for phase in PHASES.values() for name in phase.plants}}
#: Plants whose tool only some scenarios offer (the one-shot CLI has no `cronjob`), those of one door, and the plants
#: of a service only some front doors drive (the first of them).
SCENARIO = {"cronjob": "tui", **{name: door for name, (door, _) in DOOR_PLANTS.items()},
            **{name: spec.doors[0] for spec in ALL_SERVICES.values() if spec.doors for name in spec.plants}}


def phases_for(name: str) -> list[str]:
    """The phases a plant's run drives: the one-shot door has none to choose; every other door `turns` and the
    phases the plant needs."""
    scenario = SCENARIO.get(name, "oneshot")
    return [] if scenario == "oneshot" else ["turns", *DOOR_PLANTS.get(name, ("", ()))[1]]
#: Plants that only show in one topology (an unowned host is visible only through the forward proxy).
TOPOLOGY = {"egress": "forward"}


def apply(name: str, ctx: PlantContext) -> frozenset[str]:
    """Plant `name`; returns the finding kinds it must produce."""
    plant = PLANTS[name]
    plant.action(ctx)
    for writer in ctx.during:
        writer.start()
    return plant.expects


def plant_all(ctx: Context, names: list[str]) -> dict[str, frozenset[str]]:
    """Plant every named negative control (the first tenant's data into the second's home)."""
    tenants = ctx.registry.names()
    donor, target = ctx.registry[tenants[0]], ctx.registry[tenants[1]]
    planted = {}
    for name in names:
        pc = PlantContext(donor, target, ctx.sandbox.home_of(target.name), ctx.proxy.base_url(donor.name),
                                 ctx.stubs[target.name].url)
        planted[name] = apply(name, pc)
        ctx.during += pc.during
        ctx.say(f"planted {name}: {donor.name} -> {target.name}")
    return planted

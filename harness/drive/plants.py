"""Negative controls: deliberate isolation breaks planted into real tenant homes.

Each plant copies something of the first tenant (the donor) into the second (the target) before Hermes
runs; the audit must then report at least the finding kinds listed in `PLANTS`. The plants of the tool
battery's stores (`TOOL_PLANTS`) must moreover be caught through a tool's result: a `request_leak`
attributed to one of the tools listed (the file scan alone does not count). The plants of a service's
settings (`SERVICE_PLANTS`) must be caught through that service: a finding that names it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from harness.capture.proxy import FORWARD_DOMAIN
from harness.core.protocol import TOOL_GROUPS
from harness.core.registry import Tenant
from harness.drive.hermes import PROVIDER_ID, PROVIDER_KEY_ENV
from harness.drive.services import SERVICES


@dataclass(frozen=True)
class PlantContext:
    donor: Tenant
    target: Tenant
    target_home: Path
    donor_route: str  # the donor's base_url through the proxy
    target_stub: str  # the target's stub, bypassing the proxy
    during: list[threading.Thread] = field(default_factory=list)  # writers that act while Hermes runs (joined)


def _append(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write(text)


def _edit_config(home: Path, edit: Callable[[dict], None]) -> None:
    path = home / "config.yaml"
    cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    edit(cfg)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")


def _env(c: PlantContext) -> None:
    marker = c.donor.canaries["env_marker"]
    _append(c.target_home / ".env", f"PLANTED_PROVIDER_KEY={c.donor.key}\nPLANTED_MARKER={marker}\n")


def _memory(c: PlantContext) -> None:
    _append(c.target_home / "memories" / "MEMORY.md", f"{c.donor.canaries['memory']}\n")


def _soul(c: PlantContext) -> None:
    _append(c.target_home / "SOUL.md", f"Remember {c.donor.canaries['soul']}.\n")


def _route(c: PlantContext) -> None:
    _edit_config(c.target_home, lambda cfg: cfg["providers"][PROVIDER_ID].update(base_url=c.donor_route))


def _cwd(c: PlantContext) -> None:
    _edit_config(c.target_home, lambda cfg: cfg["terminal"].update(cwd=c.donor.canaries["workdir"]))


def _model(c: PlantContext) -> None:
    def edit(cfg: dict) -> None:
        cfg["model"]["default"] = c.donor.model
        cfg["providers"][PROVIDER_ID]["default_model"] = c.donor.model

    _edit_config(c.target_home, edit)


def _key(c: PlantContext) -> None:
    path = c.target_home / ".env"
    lines = [ln for ln in path.read_text().splitlines() if not ln.startswith(f"{PROVIDER_KEY_ENV}=")]
    path.write_text("\n".join([*lines, f"{PROVIDER_KEY_ENV}={c.donor.key}"]) + "\n")


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
    now = datetime.now(UTC)
    due = (now + timedelta(days=1)).isoformat()
    job = {"id": "plantedjob01", "name": f"tenancy-{c.donor.name}-planted",
           "prompt": f"{c.donor.canaries['cron_job']} (planted): say hello", "skills": [], "skill": None,
           "model": None, "provider": None, "base_url": None, "script": None, "no_agent": False,
           "context_from": None, "schedule": {"kind": "once", "run_at": due, "display": "once in 1d"},
           "schedule_display": "once in 1d", "repeat": {"times": 1, "completed": 0}, "enabled": True,
           "state": "scheduled", "paused_at": None, "paused_reason": None, "created_at": now.isoformat(),
           "next_run_at": due, "last_run_at": None, "last_status": None, "last_error": None,
           "last_delivery_error": None, "deliver": "local", "origin": None, "enabled_toolsets": None,
           "workdir": None}
    path = c.target_home / "cron" / "jobs.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    jobs = json.loads(path.read_text())["jobs"] if path.exists() else []
    path.write_text(json.dumps({"jobs": [*jobs, job], "updated_at": now.isoformat()}, indent=2))


def _service_key(service: str) -> Callable[[PlantContext], None]:
    """The donor's credential for `service` under the target's credential variable (its `.env`)."""
    spec = SERVICES[service]

    def plant(c: PlantContext) -> None:
        path = c.target_home / ".env"
        lines = [ln for ln in path.read_text().splitlines() if not ln.startswith(f"{spec.credential_env}=")]
        path.write_text("\n".join([*lines, f"{spec.credential_env}={c.donor.canaries[spec.credential]}"]) + "\n")

    return plant


def _delegate_model(c: PlantContext) -> None:
    """The donor's model for the target's subagents (`delegation.model`): they run on the target's provider."""
    _edit_config(c.target_home, lambda cfg: cfg.setdefault("delegation", {}).update(model=c.donor.model))


def _code_marker(c: PlantContext) -> None:
    """The donor's env marker in a terminal setting of the target: `execute_code` passes its subprocess only an
    allowlist of the environment (no `.env` line), the terminal settings among it (`TERMINAL_DOCKER_IMAGE`)."""
    _edit_config(c.target_home, lambda cfg: cfg["terminal"].update(docker_image=c.donor.canaries["env_marker"]))


def _home_path(c: PlantContext) -> None:
    """The donor's Hermes home in the target's `.env`: a path of another tenant in the tools' environment."""
    _append(c.target_home / ".env", f"TENANCY_PLANTED_HOME={c.donor.canaries['home']}\n")


def _memory_user(c: PlantContext) -> None:
    """The donor's user id at the memory provider in the target's `mem0.json`."""
    path = c.target_home / "mem0.json"
    doc = json.loads(path.read_text())
    doc["user_id"] = c.donor.canaries["memory_user"]
    path.write_text(json.dumps(doc))


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


def _bypass(c: PlantContext) -> None:
    _edit_config(c.target_home, lambda cfg: cfg["providers"][PROVIDER_ID].update(base_url=f"{c.target_stub}/v1"))


def _egress(c: PlantContext) -> None:
    url = f"https://unowned-{c.target.name}.{FORWARD_DOMAIN}/v1"
    _edit_config(c.target_home, lambda cfg: cfg["providers"][PROVIDER_ID].update(base_url=url))


#: plant name -> (what it does, the finding kinds the audit must then report)
PLANTS: dict[str, tuple[Callable[[PlantContext], None], frozenset[str]]] = {
    "env": (_env, frozenset({"env_leak", "file_leak"})),
    "memory": (_memory, frozenset({"file_leak", "request_leak"})),
    "soul": (_soul, frozenset({"file_leak", "request_leak"})),
    "route": (_route, frozenset({"wrong_key", "wrong_model", "request_leak"})),
    "cwd": (_cwd, frozenset({"wrong_cwd", "wrong_path"})),
    "model": (_model, frozenset({"wrong_model"})),
    "key": (_key, frozenset({"wrong_key", "file_leak"})),
    "bypass": (_bypass, frozenset({"bypass"})),
    "egress": (_egress, frozenset({"egress"})),
    "memory-entry": (_memory_entry, frozenset({"file_leak", "request_leak"})),
    "skill": (_skill, frozenset({"file_leak", "request_leak"})),
    "cronjob": (_cronjob, frozenset({"file_leak", "request_leak"})),
    "mcp-key": (_service_key("mcp"), frozenset({"wrong_key"})),
    "mcp-stdio-key": (_service_key("mcp_stdio"), frozenset({"wrong_key"})),
    "memory-key": (_service_key("memory"), frozenset({"wrong_key"})),
    "memory-user": (_memory_user, frozenset({"wrong_identity"})),
    "web-key": (_service_key("web"), frozenset({"wrong_key"})),
    "aux-key": (_service_key("aux"), frozenset({"wrong_key"})),
    "delegate-model": (_delegate_model, frozenset({"wrong_model"})),
    "code-env": (_code_marker, frozenset({"env_leak"})),
    "home-path": (_home_path, frozenset({"wrong_path"})),
    "transient": (_transient, frozenset({"file_leak"})),
}
#: Plants only a watch of the homes during the run can catch: a finding of theirs must be `transient`.
TRANSIENT_PLANTS = frozenset({"transient"})
#: Plants of a service's settings: the service whose traffic (or record) must carry the finding, and the
#: battery group that drives it.
SERVICE_PLANTS: dict[str, tuple[str, str]] = {
    "mcp-key": ("mcp", "mcp"), "mcp-stdio-key": ("mcp_stdio", "mcp"), "memory-key": ("memory", "mem0"),
    "memory-user": ("memory", "mem0"), "web-key": ("web", "web"), "aux-key": ("aux", "vision"),
}
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
DRIVEN_BY = {"delegate-model": "delegate"}


def battery_for(name: str) -> list[str]:
    """The battery groups a plant's run needs: those of the tools it must be caught through; none (the env
    probe only) for the other plants, which test the detectors (and a bypass must end inconclusive, which a
    leak the battery finds in Hermes, F8, would turn into a leak)."""
    if name in SERVICE_PLANTS:
        return [SERVICE_PLANTS[name][1]]
    if name in DRIVEN_BY:
        return [DRIVEN_BY[name]]
    tools = TOOL_PLANTS.get(name, frozenset())
    return [group for group, members in TOOL_GROUPS.items() if tools & set(members)]


def services_for(name: str) -> list[str]:
    """The services a plant's run needs: its own for a service's plant, none for the others (they test the
    detectors, which the services only slow down)."""
    return [SERVICE_PLANTS[name][0]] if name in SERVICE_PLANTS else []


#: Plants whose tool only some scenarios offer (the one-shot CLI has no `cronjob`).
SCENARIO = {"cronjob": "tui"}
#: Plants that only show in one topology (an unowned host is visible only through the forward proxy).
TOPOLOGY = {"egress": "forward"}


def apply(name: str, ctx: PlantContext) -> frozenset[str]:
    """Plant `name`; returns the finding kinds it must produce."""
    action, expected = PLANTS[name]
    action(ctx)
    for writer in ctx.during:
        writer.start()
    return expected

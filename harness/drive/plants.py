"""Negative controls: deliberate isolation breaks planted into real tenant homes.

Each plant copies something of the first tenant (the donor) into the second (the target) before Hermes
runs; the audit must then report at least the finding kinds listed in `PLANTS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from harness.capture.proxy import FORWARD_DOMAIN
from harness.core.registry import Tenant
from harness.drive.hermes import PROVIDER_ID, PROVIDER_KEY_ENV


@dataclass(frozen=True)
class PlantContext:
    donor: Tenant
    target: Tenant
    target_home: Path
    donor_route: str  # the donor's base_url through the proxy
    target_stub: str  # the target's stub, bypassing the proxy


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
    "cwd": (_cwd, frozenset({"wrong_cwd", "env_leak"})),
    "model": (_model, frozenset({"wrong_model"})),
    "key": (_key, frozenset({"wrong_key", "file_leak"})),
    "bypass": (_bypass, frozenset({"bypass"})),
    "egress": (_egress, frozenset({"egress"})),
}
#: Plants that only show in one topology (an unowned host is visible only through the forward proxy).
TOPOLOGY = {"egress": "forward"}


def apply(name: str, ctx: PlantContext) -> frozenset[str]:
    """Plant `name`; returns the finding kinds it must produce."""
    action, expected = PLANTS[name]
    action(ctx)
    return expected

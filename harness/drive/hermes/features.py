"""What a Hermes release offers the drivers, detected rather than assumed from its version number.

Older releases lack some of what the scenarios drive: `hermes -z --usage-file` (0.16.0 judges a one-shot
turn by its exit code only), `hermes serve`, the multiplexed gateway (`gateway.multiplex_profiles`), the
tui backend's per-profile sessions, the ACP adapter (`hermes acp`: `acp_adapter` and the package of Hermes' `acp`
extra), the web dashboard. `doors.missing(features, scenario)` names what a scenario's door needs
and the release lacks: the run is then impossible (`run`: one line, exit 2; `matrix`: an `n/a` cell with that reason).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.drive.hermes.agent import Hermes, HermesError

#: One child reports what it can import and what the one-shot entry point takes.
_PROBE = """
import dataclasses, importlib.util, inspect, json, os
report = os.fdopen(os.dup(1), "w")  # tui_gateway takes stdout over when imported
def has(mod):
    try:
        return importlib.util.find_spec(mod) is not None
    except ImportError:
        return False
usage = False
if has("hermes_cli.oneshot"):
    from hermes_cli.oneshot import run_oneshot
    usage = "usage_file" in inspect.signature(run_oneshot).parameters
multiplex = False
if has("gateway.config"):
    from gateway.config import GatewayConfig
    multiplex = "multiplex_profiles" in {f.name for f in dataclasses.fields(GatewayConfig)}
def imports(mod):
    try:
        importlib.import_module(mod)
        return True
    except Exception:
        return False
def source_has(mod, text):
    try:
        spec = importlib.util.find_spec(mod)
        return bool(spec and spec.origin and text in open(spec.origin, encoding="utf-8").read())
    except (ImportError, OSError, ValueError):
        return False
def adapter_has(name, text):
    # a platform's adapter where the release keeps it: plugins/platforms/NAME/adapter.py, or gateway/platforms/NAME.py
    return source_has(f"plugins.platforms.{name}.adapter", text) or source_has(f"gateway.platforms.{name}", text)
def dist():
    spec = importlib.util.find_spec("hermes_cli")
    dirs = (spec.submodule_search_locations or []) if spec else []
    return any(os.path.exists(os.path.join(d, "web_dist", "index.html")) for d in dirs)
dashboard = has("uvicorn") and source_has("hermes_cli.web_server", "HERMES_DASHBOARD_READY") and dist()
services = [name for name, offered in {SERVICES}.items() if offered]
tui = has("tui_gateway.entry") and has("tui_gateway.server")
if tui:
    from tui_gateway.server import _methods
    create = _methods.get("session.create")
    tui = create is not None and '"profile"' in inspect.getsource(create)
acp = has("acp_adapter.server") and has("acp")
platforms = []
if has("gateway.config"):
    from gateway.config import Platform
    platforms = [p.value for p in Platform]
plugins = importlib.util.find_spec("plugins.platforms") if has("plugins") else None
for d in (plugins.submodule_search_locations or []) if plugins else []:
    platforms += [n for n in sorted(os.listdir(d)) if os.path.exists(os.path.join(d, n, "adapter.py"))]
print(json.dumps({"oneshot": has("hermes_cli.oneshot"), "usage_file": usage, "multiplex": multiplex, "tui": tui,
                  "acp": acp, "dashboard": dashboard, "services": services, "platforms": sorted(set(platforms))}),
      file=report, flush=True)
os._exit(0)  # no interpreter teardown: 0.16.0's tui_gateway crashes there (SIGSEGV) now and then
"""


@dataclass(frozen=True)
class Features:
    """What one Hermes install offers the drivers."""

    oneshot: bool = True  # `hermes -z PROMPT`
    usage_file: bool = True  # `hermes -z --usage-file FILE` (else a turn is judged by its exit code)
    serve: bool = True  # `hermes serve`
    multiplex: bool = True  # `hermes gateway run` serving every profile (`gateway.multiplex_profiles`)
    tui: bool = True  # `tui_gateway.entry` with per-profile sessions (`session.create {profile}`)
    acp: bool = True  # `hermes acp`: the ACP adapter (`acp_adapter`) and its `agent-client-protocol` package
    dashboard: bool = True  # `hermes dashboard` with its built web UI, printing the port it bound (from 0.17.0)
    services: frozenset[str] | None = None  # the services it has (each service's `coverage.probe`; None: every one)
    platforms: frozenset[str] | None = None  # the gateway's platform adapters it ships (None: not asked)

    def offers(self, service: str) -> bool:
        """Whether it has `service`."""
        return self.services is None or service in self.services


def _probe_script(services: Mapping[str, str]) -> str:
    """The probe, with every service's test (`services`: name -> its `ServiceSpec.coverage.probe`) in it."""
    tests = ", ".join(f"{name!r}: {probe}" for name, probe in services.items())
    return _PROBE.replace("{SERVICES}", "{" + tests + "}")


#: Probes by (install, version): one process audits the same install many times (`--runs N`, the e2e suite).
_probed: dict[tuple[Path, str], Features] = {}


def probe(hermes: Hermes, version: str, services: Mapping[str, str]) -> Features:
    """What the install running `version` (as `hermes.check()` found) offers, `services` (name -> its probe)
    among it; asked once per process."""
    key = (hermes.python.parent.resolve() / hermes.python.name, version)  # not the venv's symlink to its base
    if key not in _probed:
        _probed[key] = _ask(hermes, services)
    return _probed[key]


def _ask(hermes: Hermes, services: Mapping[str, str]) -> Features:
    """Ask the install itself (two short children in the sandbox): its modules, and `hermes serve --help`."""
    env, cwd = hermes.env(), hermes.sandbox.home
    cwd.mkdir(parents=True, exist_ok=True)
    rc, out, err = hermes.procs.run([str(hermes.python), "-c", _probe_script(services)], env=env, cwd=cwd, timeout=120)
    if rc != 0:
        last = (err.strip().splitlines() or ["no output"])[-1]
        raise HermesError(f"cannot probe the features of the Hermes at {hermes.python}: {last[:200]}")
    try:
        found = json.loads(out.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise HermesError(f"the feature probe of the Hermes at {hermes.python} printed no report") from None
    rc, _, _ = hermes.procs.run([str(hermes.python), "-m", "hermes_cli.main", "serve", "--help"], env=env, cwd=cwd,
                                timeout=120)
    return Features(oneshot=found["oneshot"], usage_file=found["usage_file"], serve=rc == 0,
                    multiplex=found["multiplex"], tui=found["tui"], acp=found["acp"], dashboard=found["dashboard"],
                    services=frozenset(found["services"]),
                    platforms=frozenset(found["platforms"]) if "platforms" in found else None)

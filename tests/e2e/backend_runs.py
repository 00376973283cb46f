"""The baseline runs of the backends that serve every tenant in one process (`test_backends.py`: tui and gateway;
`test_backend_serve.py`: serve, whose run waits for the cron ticker): what each run must show. Two modules take
them so that the two test workers share them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.core.findings import Finding
from harness.core.protocol import OUT_OF_SCOPE
from harness.detect.file_versions import version_of
from harness.drive.phases import ALL_PHASES
from harness.drive.services import DEFAULT_SERVICES, GROUP_SERVICES, SERVICES, TOOL_GROUPS
from harness.pytest_plugin import assert_reproduced

ROOT = Path(__file__).resolve().parents[2]
BASELINES = ROOT / "baselines"
#: The backend whose run adds the `cron` phase (75 s: the ticker must get a second tick). The driver's cron
#: code is the same for the gateway, whose baseline (made with `--phases all`) holds its cron classes.
TICKERS = ("serve",)
#: The battery's tools in a run without `--services`: a service's group runs only where one of its services is on
#: (a tool of a service chosen by name only, such as the browser's, is `not driven: --services browser` there).
DEFAULT_TOOLS = frozenset(t for g, tools in TOOL_GROUPS.items()
                          if g not in GROUP_SERVICES or set(GROUP_SERVICES[g]) & set(DEFAULT_SERVICES) for t in tools)


def _summaries(findings: list[dict]) -> str:
    return "\n".join(f"{f['kind']} {f['canary']} {f['channel']} {f['scenario']}/{f['phase']}" for f in findings)


def check_backend(tenancy_audit: Callable[..., Any], scenario: str) -> None:
    """One run per backend (each costs a Hermes backend, and with a ticker a cron tick): the battery and every
    phase against the committed baseline, plus a planted leak no baseline entry can know (default's SOUL in
    alpha's home; no baseline holds a `soul` hop). Every finding but the plant's must be known, no
    incident may go missing, and the plant must fail the run."""
    phases = list(ALL_PHASES) if scenario in TICKERS else []
    audit = tenancy_audit(scenario=scenario, tenants=3, baseline=BASELINES / f"{scenario}.json", plants=["soul"],
                          phases=phases)
    planted = [f for f in audit.doc["findings"] if (f["victim"], f["canary"]) == ("default", "soul")]
    others = [f for f in audit.doc["findings"] if f not in planted]
    assert others == [], "new findings:\n" + _summaries(others)
    assert ("request_leak", "alpha") in {(f["kind"], f["seen_in"]) for f in planted}, _summaries(planted)
    assert audit.doc["fixed"] == [], f"baseline incidents no longer seen: {audit.doc['fixed']}"
    # an incident baseline, made with the locked venv; Hermes' calls to hosts no tenant routes (model metadata, update
    # checks) are refused at the proxy and named in one line, never a finding
    warnings = [w for w in audit.doc["warnings"] if not w.startswith("the proxy refused ")]
    assert warnings == [], audit.doc["warnings"]
    assert audit.doc["reasons"] == []
    assert audit.code == 1 and audit.verdict == "leak"
    assert audit.doc["known"], "Hermes 0.19.0 is known to leak here: the audit must see it"
    # F17: the checkpoint of every profile's background process in the launch home, cleared before the end:
    # only the watch of the homes sees it (a transient finding, its version kept in the evidence)
    gone = [f for f in audit.doc["known"] if f["transient"] and f["location"].startswith("processes.json@")]
    assert {(f["victim"], f["seen_in"]) for f in gone} == {("alpha", "default"), ("beta", "default")}, gone
    assert all((audit.out / "versions" / version_of(Finding.from_dict(f))).is_file() for f in gone)
    assert {t["tenant"] for t in audit.doc["timeline"]} >= {"default", "alpha", "beta"}
    # observe-mode stubs: no turn fails for a foreign key, so every tenant runs every battery tool
    assert all(t["ok"] for t in audit.doc["timeline"] if t["phase"] != "cron"), audit.doc["timeline"]
    coverage = audit.doc["coverage"][scenario]
    offered = {t for t, state in coverage.items() if state != "not offered"}
    # every offered tool is driven (or allowed by the policy) or documented out of scope; serve offers them all,
    # so there the out-of-scope list is exactly what the battery does not drive (it can only shrink)
    left_out = {t for t, state in coverage.items() if state.startswith("not driven: --")}  # a service not asked for
    assert {coverage[t] for t in left_out} <= {"not driven: --services browser"}, left_out
    assert offered - DEFAULT_TOOLS - left_out <= set(OUT_OF_SCOPE), offered - DEFAULT_TOOLS
    if scenario == "serve":  # text_to_speech alone is offered only when its provider's import check passes
        # at that moment (edge-tts through Hermes' lazy-deps check): a fresh venv's first serve run has lacked it
        assert set(OUT_OF_SCOPE) - {"text_to_speech"} <= offered - DEFAULT_TOOLS - left_out <= set(OUT_OF_SCOPE)
    states = {t: s for t, s in coverage.items() if t in DEFAULT_TOOLS and t in offered}
    assert set(states.values()) <= {"driven", "leak", "allowed"}, states
    services = audit.doc["service_coverage"][scenario]  # every service was driven (Hermes 0.19.0 leaks at each)
    assert set(services) == set(SERVICES), services
    assert {services[n] for n in DEFAULT_SERVICES} <= {"driven", "leak"}, services
    assert all(services[n].startswith(f"not driven: --{'platforms' if SERVICES[n].messaging else 'services'} {n}")
               for n in SERVICES if n not in DEFAULT_SERVICES)
    if scenario in TICKERS:  # a due job seeded in every profile; the backend's ticker must fire each
        cron = [t for t in audit.doc["timeline"] if t["phase"] == "cron"]
        assert {t["tenant"] for t in cron} == {"default", "alpha", "beta"}
        assert any(t["ok"] for t in cron), "not even the launch profile's cron job fired"
        order = [t["phase"] for t in audit.doc["timeline"]]  # alone, before any turn (a job shares its stub)
        assert max(i for i, p in enumerate(order) if p == "cron") < order.index("turns"), order
    assert_reproduced(audit)

"""The messaging platforms as a family: `--platforms` (added to the services, checked), a platform the audited Hermes
cannot run (one line naming Hermes' extra), and the platform coverage, a row for every adapter a release ships."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.arguments import services_of
from harness.core.findings import Finding
from harness.detect.tools import platform_table
from harness.drive.context import Context
from harness.drive.hermes import features
from harness.drive.hermes.features import Features
from harness.drive.platforms import OUT_OF_SCOPE
from harness.drive.services import DEFAULT_SERVICES, PLATFORMS, SERVICES, unavailable
from harness.options import RunOptions, UsageError, check_options

ONE = next(iter(PLATFORMS))


def _args(services: str | None = None, platforms: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(services=services, platforms=platforms)


def test_platforms_are_added_to_the_services_asked_for():
    assert services_of(_args()) is None  # the default services, no platform
    assert services_of(_args(platforms=ONE)) == [*DEFAULT_SERVICES, ONE]
    assert services_of(_args("web", ONE)) == ["web", ONE]
    assert services_of(_args(f"web,{ONE}", ONE)) == ["web", ONE]  # named twice, once
    assert services_of(_args("none", "all")) == list(PLATFORMS)


def test_an_unknown_platform_or_a_platform_without_its_door_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown platform 'nosuch'"):
        services_of(_args(platforms="nosuch"))
    with pytest.raises(UsageError, match=f"platform '{ONE}' needs --scenario gateway or all"):
        check_options(RunOptions(scenario="tui", services=[ONE]))
    check_options(RunOptions(scenario="gateway", services=[ONE]))  # the near miss
    check_options(RunOptions(scenario="all", services=[ONE]))


def test_a_platform_the_release_cannot_run_names_hermes_extra_a_service_it_lacks_does_not_stop_the_run():
    lack = unavailable(lambda name: name != ONE, ["web", ONE])
    assert lack == f"platform {ONE}: {SERVICES[ONE].coverage.lacks}"
    assert unavailable(lambda name: name != "web", ["web", ONE]) is None  # a service it lacks: n/a, not an error
    assert unavailable(lambda name: True, [ONE]) is None


def _context(platforms: frozenset[str] | None, services: list[str]) -> Context:
    ctx = Context.__new__(Context)
    ctx.features = Features(platforms=platforms)
    ctx.opts = SimpleNamespace(services=services)  # type: ignore[assignment]
    ctx.proxy = SimpleNamespace(topology="reverse")  # type: ignore[assignment]
    return ctx


def test_the_platform_coverage_has_a_row_for_every_adapter_the_release_ships():
    shipped = frozenset({ONE, "line", "google_chat", "brandnew"})
    states = _context(shipped, [ONE]).platform_states()
    assert set(states) == shipped
    assert states[ONE] == "on"
    assert states["line"].startswith("out of scope: a webhook platform")
    assert states["brandnew"] == "out of scope: no plug-in for this adapter, new to this release"
    assert _context(shipped, []).platform_states()[ONE] == f"not driven: --platforms {ONE}"
    unasked = _context(None, []).platform_states()  # no probe: every adapter this tool knows
    assert set(unasked) == set(PLATFORMS) | set(OUT_OF_SCOPE)


def test_no_adapter_is_both_a_plug_in_and_out_of_scope_and_every_reason_is_no_option():
    assert not set(OUT_OF_SCOPE) & set(PLATFORMS)
    assert all(why and not why.startswith("--") and " --platforms" not in why for why in OUT_OF_SCOPE.values())


def test_a_platform_is_driven_failed_or_a_leak_by_its_own_steps_and_findings():
    states = {ONE: "on", "line": "out of scope: x"}
    ok = [{"driver": ONE, "ok": True, "phase": "messaging"}]
    assert platform_table(states, ok, []) == {ONE: "driven", "line": "out of scope: x"}
    assert platform_table(states, [*ok, {"driver": ONE, "ok": False}], [])[ONE] == "failed"
    assert platform_table(states, [], [])[ONE] == "failed"  # no bot signed in: nothing it proves
    leak = Finding("profile_bleed", "alpha", "beta", "message", "rpc", "gateway", service=ONE)
    assert platform_table(states, ok, [leak])[ONE] == "leak"
    elsewhere = Finding("profile_bleed", "alpha", "beta", "message", "rpc", "gateway", service="web")
    assert platform_table(states, ok, [elsewhere])[ONE] == "driven"  # the near miss: another service's finding


def _probe_tree(root, files: dict[str, str]) -> dict:
    """The feature probe's report for a release made of `files` (path -> source): a tree of packages on its own."""
    for path, text in files.items():
        for parent in Path(path).parents:
            if parent != Path("."):
                (root / parent).mkdir(parents=True, exist_ok=True)
                (root / parent / "__init__.py").touch()
        (root / path).write_text(text)
    probes = {name: SERVICES[name].coverage.probe for name in ("ntfy", "signal", "email")}
    done = subprocess.run([sys.executable, "-c", features._probe_script(probes)], capture_output=True, text=True,
                          timeout=60, cwd=root, env={"PYTHONPATH": str(root), "PATH": os.environ["PATH"]})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_platform_adapter_is_found_where_its_release_keeps_it(tmp_path):
    """A plug-in's adapter (plugins/platforms/NAME/adapter.py) and one of the gateway's own modules
    (gateway/platforms/NAME.py, where releases before 0.18 kept Telegram, Slack and email) are both the platform's;
    the near misses: an adapter without what the plug-in drives, and another module beside the adapter's."""
    got = _probe_tree(tmp_path, {"plugins/platforms/ntfy/adapter.py": "'/json'",
                                 "gateway/platforms/email.py": "IMAP4_SSL",
                                 "gateway/platforms/signal.py": "no event stream",
                                 "gateway/platforms/signal_stream.py": "/api/v1/events"})
    assert sorted(got["services"]) == ["email", "ntfy"]

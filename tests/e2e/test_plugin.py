"""The pytest plugin composed into a custom scenario: tenancy_proxy + tenant_homes + hermes + assert_isolated."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.drive.plants import PlantContext, apply
from harness.pytest_plugin import IsolationError, assert_isolated

pytestmark = pytest.mark.e2e
PROMPT = "Run the environment probe for this tenant."


def test_custom_scenario_is_isolated(tenancy_proxy, tenant_homes, hermes):
    assert set(tenant_homes) == set(tenancy_proxy.ports) == {"default", "alpha"}
    with ThreadPoolExecutor(max_workers=2) as pool:
        turns = list(pool.map(lambda name: hermes.oneshot(name, PROMPT, timeout=120), tenancy_proxy.registry.names()))
    result = tenancy_proxy.check(turns)
    assert_isolated(result)
    assert result.flows_per_tenant["default"] > 0 and result.flows_per_tenant["alpha"] > 0
    assert {name: len(s) for name, s in result.snapshots.items()} == {"default": 1, "alpha": 1}
    assert tenancy_proxy.flows_path.stat().st_size > 0


def test_planted_leak_fails_assert_isolated(tenancy_proxy, tenant_homes, hermes):
    registry = tenancy_proxy.registry
    donor, target = registry["default"], registry["alpha"]
    apply("memory", PlantContext(donor, target, tenant_homes["alpha"], tenancy_proxy.base_url("default"),
                                 tenancy_proxy.stubs["alpha"].url))
    turn = hermes.oneshot("alpha", PROMPT, timeout=120)
    assert turn.ok, turn.detail
    result = tenancy_proxy.check([turn])
    with pytest.raises(IsolationError) as failed:
        assert_isolated(result)
    assert isinstance(failed.value, AssertionError)
    assert failed.value.findings == result.findings and failed.value.reasons == result.reasons
    message = str(failed.value)
    assert "tenants not proven isolated" in message
    assert "request_leak: default -> alpha memory (request)" in message
    assert "file_leak: default -> alpha memory (file)" in message
    assert donor.canaries["memory"] not in message  # the message names canaries, never shows them


def test_the_documented_example_runs_as_a_third_party_would(hermes_python, tmp_path):
    """docs/examples/test_tenancy_plugin.py, run by its own pytest in a folder of its own (only the plugin's
    entry point and the installed harness, none of this suite's configuration)."""
    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "test_tenancy_plugin.py"
    (tmp_path / "test_example.py").write_text(example.read_text())
    env = {**os.environ, "PYTHONPATH": str(example.parents[2])}  # this checkout's harness, as if installed
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--hermes-python",
                           str(hermes_python), "test_example.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=900, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "3 passed" in done.stdout, done.stdout[-2000:]

"""The pytest plugin composed into a custom scenario: tenancy_proxy + tenant_homes + hermes + assert_isolated."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from harness.drive.plants import PlantContext, apply
from harness.pytest_plugin import assert_isolated

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
    with pytest.raises(pytest.fail.Exception) as failed:
        assert_isolated(result)
    message = str(failed.value)
    assert "tenants not proven isolated" in message
    assert "request_leak: default's memory in alpha's request" in message
    assert "file_leak: default's memory in alpha's file" in message
    assert donor.canaries["memory"] not in message  # the message names canaries, never shows them

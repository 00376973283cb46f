"""A complete example of the tenancy pytest plugin: copy this file into your own test suite.

Install tenancy-audit into the environment that runs pytest (`pip install -e /path/to/tenancy-audit`; the
plugin registers itself through its `pytest11` entry point) and name the Hermes to audit with
`pytest --hermes-python /path/to/hermes-venv/bin/python` or `$TENANCY_HERMES_PYTHON`. Each test drives real
Hermes through mitmproxy; a leak makes `assert_isolated` raise `IsolationError` (an AssertionError).
"""

from __future__ import annotations

import pytest

from harness.pytest_plugin import IsolationError, assert_isolated

PROMPT = "Run the environment probe for this tenant."


def test_a_whole_audit(tenancy_audit):
    """One call: two tenants, one-shot Hermes turns through the proxy, every invariant reconciled."""
    # tools=[]: the env probe only. With the tool battery (the default), Hermes 0.19.0 leaks through
    # session_search (docs/hermes-findings.md, F8); judge such a run against a baseline instead.
    audit = tenancy_audit(scenario="oneshot", tools=[])
    assert_isolated(audit)  # raises IsolationError listing every finding class and inconclusive reason
    assert (audit.code, audit.verdict) == (0, "clean")
    assert (audit.out / "report.html").exists()  # the whole evidence folder, as `tenancy-audit run` writes it


def test_a_scenario_of_my_own(tenancy_proxy, tenant_homes, hermes):
    """Compose the parts: the proxy, the tenants' homes, and a Hermes driver; then reconcile."""
    registry = tenancy_proxy.registry  # harness.core.registry.Registry: tenants by name
    alpha = registry["alpha"]  # a Tenant: name, key, model, route, upstream, home, canaries
    assert alpha.canaries["memory"] in (tenant_homes["alpha"] / "memories" / "MEMORY.md").read_text()
    turns = [hermes.oneshot(name, PROMPT, timeout=120) for name in registry.names()]
    check = tenancy_proxy.check(turns)  # a Reconciliation: findings, reasons, flows, snapshots, ...
    assert_isolated(check)
    assert check.flows_per_tenant["alpha"] > 0 and len(check.snapshots["alpha"]) == 1


def test_a_planted_leak_is_caught(tenancy_proxy, tenant_homes, hermes):
    """A negative control: default's memory written into alpha's home must be found in alpha's request."""
    default = tenancy_proxy.registry["default"]
    memory = tenant_homes["alpha"] / "memories" / "MEMORY.md"
    memory.write_text(memory.read_text() + default.canaries["memory"] + "\n")
    turn = hermes.oneshot("alpha", PROMPT, timeout=120)
    with pytest.raises(IsolationError) as caught:
        assert_isolated(tenancy_proxy.check([turn]))
    crossed = {(f.kind, f.victim, f.seen_in, f.canary) for f in caught.value.findings}
    assert ("file_leak", "default", "alpha", "memory") in crossed
    assert ("request_leak", "default", "alpha", "memory") in crossed
    assert default.canaries["memory"] not in str(caught.value)  # reports name canaries, never show them

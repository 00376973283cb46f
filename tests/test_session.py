"""`AuditSession`: the set-up every audit shares (bind -> mint -> stubs -> registry -> mitmdump)."""

from __future__ import annotations

from pathlib import Path

from harness.capture.proxy import port_of
from harness.session import AuditSession, tenant_names


def test_a_second_mint_hands_mitmdump_the_listeners_of_its_registry_only(tmp_path: Path) -> None:
    """Minting again (the plugin's `tenancy_registry(n)` before `tenancy_proxy`) replaces the listeners: mitmdump
    gets one per port of the registry in force, and serves them."""
    with AuditSession(tmp_path, tenant_names(2)) as session:
        session.mint()
        registry = session.mint(tenant_names(3))
        assert sorted(port_of(s) for s in session.listeners) == sorted(t.listen for t in registry)
        session.start_stubs()
        proxy = session.start_proxy()
        assert proxy.alive()
    assert session.survivors == 0

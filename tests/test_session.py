"""`AuditSession`: the set-up every audit shares (bind -> mint -> stubs -> registry -> mitmdump)."""

from __future__ import annotations

from pathlib import Path

from harness.capture.proxy import port_of
from harness.session import AuditSession, tenant_names


def test_a_second_mint_hands_mitmdump_the_listeners_of_its_registry_only(tmp_path: Path) -> None:
    """Minting again (the plugin's `tenancy_registry(n)` before `tenancy_proxy`) replaces the listeners: mitmdump
    gets one per port of the registry in force, and the regular one every child's other requests go to, and serves
    them."""
    with AuditSession(tmp_path, tenant_names(2)) as session:
        session.mint()
        registry = session.mint(tenant_names(3))
        *reverse, regular = (port_of(s) for s in session.listeners)  # and the regular listener, last
        assert sorted(reverse) == sorted(t.listen for t in registry)
        session.start_stubs()
        proxy = session.start_proxy()
        assert proxy.alive() and proxy.forward_port == regular and proxy.ports() == [*reverse, regular]
        assert proxy.child_env()["HTTPS_PROXY"] == f"http://127.0.0.1:{regular}"
        assert proxy.child_env()["NO_PROXY"] == "127.0.0.1,localhost,::1"  # the reverse listeners: direct
    assert session.survivors == 0

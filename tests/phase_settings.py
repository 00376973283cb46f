"""A stand-in for the audit context of a phase's `settings` (what it adds to a profile's config from the start):
the phases asked for, the scenario, and three tenants of which `default` is the launch profile."""

from __future__ import annotations

from types import SimpleNamespace

from harness.drive import phases


def settings_context(phases: list[str], scenario: str = "tui") -> SimpleNamespace:
    names = ["default", "alpha", "beta"]
    return SimpleNamespace(opts=SimpleNamespace(phases=phases), scenario=scenario,
                           sandbox=SimpleNamespace(launch="default"), registry=SimpleNamespace(names=lambda: names))


def laid(ctx: SimpleNamespace, tenant: str) -> tuple[dict, dict[str, str]]:
    """What the phases asked for lay in a tenant's config and `.env` (`phases.settings`, which asks each phase only
    where it runs)."""
    done = phases.settings(ctx, tenant)  # type: ignore[arg-type]
    return done.config, done.env

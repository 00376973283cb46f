"""A stand-in for the audit context of a phase's `settings` (what it adds to a profile's config from the start):
the phases asked for, the scenario, and three tenants of which `default` is the launch profile."""

from __future__ import annotations

from types import SimpleNamespace


def settings_context(phases: list[str], scenario: str = "tui") -> SimpleNamespace:
    names = ["default", "alpha", "beta"]
    return SimpleNamespace(opts=SimpleNamespace(phases=phases), scenario=scenario,
                           sandbox=SimpleNamespace(launch="default"), registry=SimpleNamespace(names=lambda: names))

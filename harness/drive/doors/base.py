"""The shape every front door declares once (`Door`): how Hermes is driven through it, what a release needs to
offer for it, and how many tenants it runs unless told."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness.drive.context import Context


@dataclass(frozen=True)
class Door:
    """One way into Hermes. `needs`: (a `features.Features` field, what a release without it lacks); `backend`:
    one long-lived process serving every profile (the multi-profile phases run, and it offers every tool, the
    `cronjob` tool among them); `gateway`: it needs a port for the gateway's API server; `packages`: distributions
    of the Hermes venv only this door uses (normalized names: no baseline of a run without it warns of them)."""

    name: str
    summary: str
    rank: int  # its place in `--scenario all` and every list
    drive: Callable[[Context], None]
    needs: tuple[tuple[str, str], ...]
    tenants: int = 3
    backend: bool = True
    gateway: bool = False
    packages: tuple[str, ...] = ()

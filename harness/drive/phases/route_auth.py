"""The `route-auth` phase (gateway, dashboard): every tenant's credential tried on every tenant's route, the gateway's
API server (`/p/<tenant>/v1/models`) and the dashboard's data routes; a key opens its own route only. The doors run
it themselves."""

from __future__ import annotations

from harness.drive.phases.base import PhaseSpec

PHASE = PhaseSpec("route-auth", "every tenant's credential tried on every tenant's route", rank=70,
                  doors=("gateway", "dashboard"), plant="dashboard")

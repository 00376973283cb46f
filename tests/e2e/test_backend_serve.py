"""`hermes serve` audited phase by phase, the cron phase included (its ticker must fire every profile's due job):
the run must reproduce the committed baseline and catch a planted leak it does not know (`backend_runs.py`)."""

from __future__ import annotations

import pytest

from tests.e2e.backend_runs import check_backend

pytestmark = pytest.mark.e2e


def test_serve_reproduces_its_baseline_and_catches_an_unknown_plant(tenancy_audit):
    check_backend(tenancy_audit, "serve")

"""Every service's plant against real Hermes: a tenant's credential or data planted in another tenant's service
set-up must be caught through that service's own traffic (the runs in `plant_runs.py`; the tool and core plants
are in `test_oneshot.py`)."""

from __future__ import annotations

import pytest

from tests.e2e.plant_runs import RUNS, SERVICE_RUNS, check_run

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("run", sorted(SERVICE_RUNS))
def test_planted_service_leaks_are_caught(tenancy_audit, run):
    check_run(tenancy_audit, RUNS[run])

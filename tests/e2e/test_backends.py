"""One Hermes process serving every tenant (tui, serve, gateway), audited phase by phase.

Hermes 0.19.0 is known to leak between profiles inside one process; the committed baselines list those
incidents (entry point and hops). Each scenario must reproduce its baseline (nothing new, no incident gone
but intermittent ones) while, in the same run, a planted leak the baseline does not know fails it;
`reconcile` of each evidence folder must reach the run's verdict, incidents, findings and counts again.
"""

from __future__ import annotations

import pytest

from tests.e2e.backend_runs import check_backend

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("scenario", ("tui", "gateway"))
def test_scenario_reproduces_its_baseline_and_catches_an_unknown_plant(tenancy_audit, scenario):
    check_backend(tenancy_audit, scenario)

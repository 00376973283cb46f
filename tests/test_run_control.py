"""Run control's judgement without Hermes: another profile's stop or approval of a tenant's run that was done is a
finding (the plant), refused is not, and the tenant's own is never one (the near miss); the finding enters through
`run` and is F18's."""

from __future__ import annotations

from harness.detect.incidents import build, entry_point
from harness.drive.doors.run_control import taken
from harness.report.documented import documented


def test_a_stop_or_approval_of_another_profiles_run_that_was_done_is_a_finding():
    stop = taken("alpha", "beta", "stop", 200, {"status": "stopping"}, "api_server", "lookups")
    approval = taken("alpha", "beta", "approval", 200, {"resolved": 1}, "api_server", "lookups")
    assert [(f.kind, f.victim, f.seen_in, f.canary) for f in stop + approval] == [
        ("profile_bleed", "alpha", "beta", "run_control")] * 2
    assert {entry_point(f) for f in stop + approval} == {"run"}
    assert [(i.entry, documented(i)) for i in build(stop + approval)] == [("run", ["F18"])]


def test_a_refused_or_unresolved_control_and_the_owners_own_are_not():
    assert taken("alpha", "beta", "stop", 404, {"error": "Run not found"}, "api_server", "lookups") == []
    assert taken("alpha", "beta", "approval", 409, {"error": "no pending"}, "api_server", "lookups") == []
    assert taken("alpha", "beta", "approval", 200, {"resolved": 0}, "api_server", "lookups") == []
    assert taken("alpha", "alpha", "approval", 200, {"resolved": 1}, "api_server", "lookups") == []
    assert taken("alpha", "alpha", "stop", 200, {"status": "stopping"}, "api_server", "lookups") == []

"""The `approvals` phase's judgement without Hermes: an "always" approval of one tenant that let another tenant's
command run unasked is a finding (the plant); the tenant's own command running on its own "always" is not (the
near miss); the finding is a root cause of its own (entry `approval`, F19), not the terminal's environment."""

from __future__ import annotations

from harness.detect.incidents import build, entry_point
from harness.drive.approvals import bleeds
from harness.report.documented import documented


def test_a_command_of_another_tenant_that_ran_unasked_is_a_finding_and_its_own_is_not():
    found = bleeds("alpha", {"beta": 0, "default": 2, "alpha": 0}, "tui", "tui")
    assert [(f.kind, f.victim, f.seen_in, f.canary, f.tool) for f in found] == [
        ("profile_bleed", "alpha", "beta", "approval", "terminal")]
    assert found[0].phase == "approvals" and found[0].scenario == "tui"
    assert bleeds("alpha", {"beta": 1, "default": 1, "alpha": 0}, "serve", "serve") == []  # every other was asked


def test_an_approval_enters_through_its_own_entry_point_and_is_f19():
    found = bleeds("alpha", {"beta": 0, "default": 0}, "serve", "serve")
    assert {entry_point(f) for f in found} == {"approval"}
    incidents = build(found)
    assert [(i.entry, documented(i)) for i in incidents] == [("approval", ["F19"])]

"""The `toolsets` phase's judgement without Hermes: another profile offered the tools of a toolset only the launch
profile enables is a finding (the plant); the launch profile's own, a profile offered other tools only, and a tool
whose name merely contains the toolset's are not (the near misses); the finding enters through `toolsets` and is
F35. Only the launch profile's config enables the toolset, and only when the phase runs."""

from __future__ import annotations

import pytest

from harness.detect.incidents import build, entry_point
from harness.drive.phases.toolsets import TOOLSET, bleeds
from harness.options import RunOptions, UsageError, check_options
from harness.report.documented import documented
from tests.phase_settings import laid, settings_context


def test_another_profile_offered_the_launch_profiles_toolset_is_a_finding_and_the_launch_profiles_own_is_not():
    tools = {"default": {"terminal", "kanban_create"}, "alpha": {"terminal", "kanban_create", "kanban_list"},
             "beta": {"terminal", "memory", "list_kanban_boards"}}
    found = bleeds("default", tools, "tui", "tui")
    assert [(f.kind, f.victim, f.seen_in, f.canary) for f in found] == [("profile_bleed", "default", "alpha",
                                                                         "toolsets")]
    assert "2 kanban_* tools" in found[0].evidence
    assert [entry_point(f) for f in found] == ["toolsets"]
    assert [(i.entry, documented(i)) for i in build(found)] == [("toolsets", ["F35"])]


def test_only_the_launch_profile_enables_the_toolset_and_only_when_the_phase_runs():
    ctx = settings_context(["turns", "toolsets"])
    assert [laid(ctx, n)[0] for n in ("default", "alpha")] == [{"toolsets": ["hermes-cli", TOOLSET]}, {}]
    assert laid(settings_context(["turns"]), "default") == ({}, {})
    assert laid(settings_context(["turns", "toolsets"], scenario="gateway"), "default") == ({}, {})


def test_the_kanban_phase_and_the_toolsets_phase_cannot_run_together():
    with pytest.raises(UsageError, match="kanban and toolsets"):
        check_options(RunOptions(scenario="tui", phases=["turns", "kanban", "toolsets"]))

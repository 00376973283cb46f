"""The `approvals` phase's judgement without Hermes: an "always" approval or a seeded command allowlist of one
tenant that let another tenant's command run unasked is a finding (the plant); the tenant's own command running on
its own "always" or allowlist is not (the near miss); the finding is a root cause of its own (entry `approval`,
F19), not the terminal's environment. Only the phase's first tenant has the allowlist, and only when the phase
runs."""

from __future__ import annotations

import fnmatch

from harness.detect.incidents import build, entry_point
from harness.drive.phases.approvals import ALLOWLIST, ALWAYS, SEEDED, bleeds, saved_always
from harness.report.documented import documented
from tests.phase_settings import laid, settings_context


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


def test_another_tenants_command_that_ran_on_the_first_tenants_allowlist_is_a_finding_and_its_own_is_not():
    found = bleeds("alpha", {"beta": 0, "default": 1, "alpha": 0}, "serve", "serve", SEEDED)
    assert [(f.kind, f.victim, f.seen_in, f.canary) for f in found] == [
        ("profile_bleed", "alpha", "beta", "command_allowlist")]
    assert ALLOWLIST in found[0].detail
    assert bleeds("alpha", {"beta": 1, "default": 1, "alpha": 0}, "serve", "serve", SEEDED) == []
    assert [(i.entry, documented(i)) for i in build(found)] == [("approval", ["F19"])]


def test_the_allowlist_names_the_seeded_command_in_any_workdir_and_not_the_recursive_delete():
    seeded, always = SEEDED[0].format("/w/beta/allowlisted-1a2b"), ALWAYS[0].format("/w/beta/approval-1a2b")
    assert fnmatch.fnmatchcase(seeded, ALLOWLIST) and not fnmatch.fnmatchcase(always, ALLOWLIST)


def test_only_the_first_tenant_that_is_not_the_launch_profile_has_the_allowlist_and_only_when_the_phase_runs():
    ctx = settings_context(["turns", "approvals"])
    assert [laid(ctx, n)[0] for n in ("default", "alpha", "beta")] == [{}, {"command_allowlist": [ALLOWLIST]}, {}]
    assert laid(settings_context(["turns"]), "alpha") == ({}, {})
    assert laid(settings_context(["turns", "approvals"], scenario="gateway"), "alpha") == ({}, {})
    under_all = settings_context(["turns", "approvals"], scenario="all")
    assert laid(under_all, "alpha") == ({"command_allowlist": [ALLOWLIST]}, {})


def test_an_always_an_earlier_door_saved_in_the_first_tenants_own_config_is_in_force_and_its_seed_is_not(tmp_path):
    """In `--scenario all` Hermes saved the first tenant's "always" (`delete in root path`) into its own config in
    the tui door, so in serve its recursive delete runs unasked: the part's precondition holds. Near misses: the
    seeded allowlist alone, and no config, are no saved approval (never asked there is still a failed part)."""
    (tmp_path / "config.yaml").write_text(f"command_allowlist:\n- {ALLOWLIST}\n- delete in root path\n")
    assert saved_always(tmp_path)
    (tmp_path / "config.yaml").write_text(f"approvals:\n  mode: manual\ncommand_allowlist:\n- {ALLOWLIST}\n")
    assert not saved_always(tmp_path)
    assert not saved_always(tmp_path / "missing")

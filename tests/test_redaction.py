"""The `redaction` phase's judgement without Hermes, and Hermes' own masker on the phase's secret: a tenant whose
profile says redact and whose key-shaped secret reached its model whole is a finding (the plant); the launch
profile's own secret whole, under its own `false`, is not (the near miss); a masked one is not either. The
finding is a root cause of its own (entry `redaction`, F26)."""

from __future__ import annotations

import subprocess

from harness.detect.incidents import build, entry_point
from harness.drive.hermes.agent import hermetic_env
from harness.drive.phases.redaction import bleeds, secret
from harness.report.documented import documented
from tests.phase_settings import laid, settings_context


def test_a_secret_shown_whole_against_its_profiles_setting_is_a_finding_and_the_launch_profiles_is_not():
    found = bleeds("default", {"default": True, "alpha": True, "beta": False}, "serve", "serve")
    assert [(f.kind, f.victim, f.seen_in, f.canary, f.tool) for f in found] == [
        ("profile_bleed", "default", "alpha", "redaction", "terminal")]
    assert found[0].phase == "redaction" and found[0].scenario == "serve"
    assert bleeds("default", {"default": True, "alpha": False, "beta": False}, "serve", "serve") == []


def test_a_redaction_bleed_enters_through_its_own_entry_point_and_is_f26():
    found = bleeds("default", {"alpha": True, "beta": True}, "serve", "serve")
    assert {entry_point(f) for f in found} == {"redaction"}
    assert [(i.entry, documented(i)) for i in build(found)] == [("redaction", ["F26"])]


def test_hermes_masks_the_phases_secret_when_redaction_is_on(tmp_path, hermes_python):
    value = secret()
    code = ("from agent.redact import redact_terminal_output; "
            f"print(redact_terminal_output('OPENAI_API_KEY={value}', 'cat key.txt', force=True))")
    (tmp_path / ".hermes").mkdir()
    done = subprocess.run([str(hermes_python), "-c", code], capture_output=True, text=True, timeout=120,
                          env=hermetic_env(tmp_path, hermes_python), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout.strip()
    assert value not in out and out.startswith("OPENAI_API_KEY=sk-")  # masked, the shape kept


def test_the_phases_settings_are_laid_down_for_its_doors_and_for_all_and_nowhere_else():
    for scenario in ("serve", "gateway", "all"):  # `all` lays every door's homes down once
        assert laid(settings_context(["turns", "redaction"], scenario), "default") == (
            {"security": {"redact_secrets": False}}, {"HERMES_REDACT_SECRETS": "false"})
        assert laid(settings_context(["turns", "redaction"], scenario), "alpha")[0] == {
            "security": {"redact_secrets": True}}
    assert laid(settings_context(["turns", "redaction"], "tui"), "default") == ({}, {})  # tui never honours it
    assert laid(settings_context(["turns"], "serve"), "default") == ({}, {})  # the phase not asked for


def test_the_evidence_names_the_kind_the_secret_was_minted_as():
    [found] = bleeds("default", {"alpha": True}, "all", "serve", {"alpha": "redaction_key_2"})
    assert found.evidence == "<alpha:redaction_key_2> unmasked in its terminal result"

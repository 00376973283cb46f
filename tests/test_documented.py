"""Incidents linked to the documented Hermes findings: each signature with an incident it must match and a
near miss it must not, and the table in docs/hermes-findings.md equal to the code's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.core.findings import Finding
from harness.detect.incidents import build
from harness.report.documented import SIGNATURES, Clause, documented, text

DOC = Path(__file__).resolve().parent.parent / "docs" / "hermes-findings.md"
FLOW = "flow:0b7e2c1a-1111-2222-3333-444455556666:request.body@9"


def crossing(kind: str, victim: str = "default", seen_in: str = "alpha", canary: str | None = "key", *,
             channel: str = "request", tool: str | None = None, service: str | None = None, scenario: str = "tui",
             phase: str = "turns", location: str = FLOW, carrier: str | None = None) -> list[str]:
    """The F-numbers of the incident one such crossing makes."""
    [incident] = build([Finding(kind, victim, seen_in, canary, channel, location, scenario=scenario, phase=phase,
                                tool=tool, service=service, time=1.0, carrier=carrier)])
    return documented(incident)


# (F-number, an incident of it, a near miss of it: same entry point, another kind/direction/scenario/canary)
CASES = [
    ("F1", dict(kind="wrong_key"), dict(kind="wrong_key", victim="alpha", seen_in="beta")),
    ("F2", dict(kind="wrong_cwd", seen_in="default", canary="workdir", channel="env", tool="terminal"),
     dict(kind="request_leak", canary="memory")),
    ("F3", dict(kind="profile_bleed", victim="alpha", canary="model", channel="rpc", location="tui:session.create"),
     dict(kind="text_leak", canary="memory", channel="rpc", location="rpc-tui.jsonl#7@1")),
    ("F5", dict(kind="file_leak", victim="alpha", seen_in="default", canary="model", channel="file",
                location="logs/agent.log@186"),
     dict(kind="file_leak", canary="model", channel="file", location="logs/agent.log@186")),
    ("F6", dict(kind="shortfall", seen_in=None, canary=None, channel="env", phase="cron", location="serve:cron"),
     dict(kind="shortfall", seen_in=None, canary=None, channel="env", phase="turns", location="serve:turns")),
    ("F7", dict(kind="file_leak", victim="alpha", seen_in="default", canary="saved_key", channel="file",
                location=".env@155"),
     dict(kind="file_leak", canary="saved_key", channel="file", location=".env@155")),
    ("F8", dict(kind="request_leak", tool="session_search"), dict(kind="request_leak", tool="todo")),
    ("F9", dict(kind="request_leak", tool="process"), dict(kind="request_leak", tool="terminal")),
    ("F10", dict(kind="env_leak", channel="env", tool="terminal"),
     dict(kind="env_leak", channel="env", tool="terminal", scenario="oneshot")),
    ("F11", dict(kind="request_leak", tool="mcp__tenancy__recall"), dict(kind="request_leak", tool="mcp_notes")),
    ("F12", dict(kind="wrong_key", canary="memory_key", service="memory"),
     dict(kind="wrong_key", seen_in="default", canary="memory_key", service="memory")),
    ("F13", dict(kind="request_leak", victim="alpha", seen_in="default", canary="web_query", service="web"),
     dict(kind="request_leak", tool="webhook")),
    ("F14", dict(kind="wrong_key", canary="aux_key", service="aux"),
     dict(kind="request_leak", canary="title", service="aux")),
    ("F18", dict(kind="request_leak", victim="beta", canary="tool_memory", tool="memory", carrier="conversation",
                 scenario="api_server", phase="lookups"),
     dict(kind="request_leak", victim="beta", canary="tool_memory", tool="memory", carrier="conversation",
          scenario="tui", phase="resume")),
    ("F20", dict(kind="wrong_key", canary="supermemory_key", service="supermemory"),
     dict(kind="wrong_key", seen_in="default", canary="supermemory_key", service="supermemory")),
    ("F21", dict(kind="wrong_identity", victim="alpha", seen_in="default", canary="honcho_peer", service="honcho"),
     dict(kind="request_leak", tool="honcho")),
    ("F22", dict(kind="wrong_key", canary="hindsight_key", service="hindsight"),
     dict(kind="wrong_key", seen_in="default", canary="hindsight_key", service="hindsight")),
    ("F23", dict(kind="wrong_identity", victim="alpha", seen_in="default", canary="browser_user", service="browser"),
     dict(kind="request_leak", tool="browse")),
    ("F24", dict(kind="profile_bleed", canary="allowed_channels", channel="rpc", service="mattermost"),
     dict(kind="profile_bleed", canary="mattermost_post", channel="rpc", service="mattermost")),
    ("F25", dict(kind="profile_bleed", victim="alpha", seen_in="default", canary="allowed_users", channel="rpc",
                 service="mattermost"),
     dict(kind="shortfall", seen_in=None, canary=None, channel="env", phase="turns", location="gateway:turns")),
    ("F26", dict(kind="profile_bleed", canary="redaction", tool="terminal", location="serve:alpha:tool terminal"),
     dict(kind="profile_bleed", victim="alpha", seen_in="default", canary="redaction", tool="terminal",
          location="serve:default:tool terminal")),
    ("F27", dict(kind="request_leak", canary="home", tool="skill_manage"), dict(kind="request_leak", tool="todo")),
    ("F28", dict(kind="request_leak", canary="cron_job", tool="cronjob"),
     dict(kind="file_leak", canary="cron_job", channel="file", tool="cronjob", location="cron/jobs.json@9")),
    ("F29", dict(kind="wrong_cwd", seen_in="default", canary="workdir", channel="env", tool="execute_code",
                 scenario="oneshot"),
     dict(kind="wrong_cwd", seen_in="default", canary="workdir", channel="env", tool="execute_code")),
    ("F30", dict(kind="wrong_key", victim="alpha", canary="aux_key", service="aux", scenario="oneshot"),
     dict(kind="wrong_key", victim="alpha", canary="aux_key", service="aux", scenario="tui")),
    ("F31", dict(kind="request_leak", victim="alpha", seen_in="beta", canary="mattermost_file", service="mattermost",
                 scenario="gateway", phase="messaging"),
     dict(kind="wrong_key", victim="alpha", seen_in="beta", canary="mattermost_key", service="mattermost",
          scenario="gateway", phase="messaging")),
    ("F40", dict(kind="profile_bleed", victim="alpha", canary="allowed_channels", channel="rpc", service="signal",
                 scenario="gateway", phase="messaging"),
     dict(kind="profile_bleed", victim="alpha", canary="cron_delivery", channel="rpc", service="signal",
          scenario="gateway", phase="messaging")),
    ("F41", dict(kind="profile_bleed", victim="alpha", canary="reactions", channel="rpc", service="signal",
                 scenario="gateway", phase="messaging"),
     dict(kind="profile_bleed", victim="alpha", canary="reactions", channel="rpc", service="mattermost",
          scenario="gateway", phase="messaging")),
    ("F42", dict(kind="wrong_key", canary="signal_account", service="signal", scenario="gateway", phase="messaging"),
     dict(kind="wrong_key", canary="signal_user", service="signal", scenario="gateway", phase="messaging")),
    ("F55", dict(kind="shortfall", seen_in=None, canary=None, channel="env", scenario="gateway",
                 phase="messaging-connect:ntfy", location="gateway:messaging-connect:ntfy"),
     dict(kind="shortfall", seen_in=None, canary=None, channel="env", scenario="gateway",
          phase="messaging-connect:signal", location="gateway:messaging-connect:signal")),
    ("F56", dict(kind="wrong_key", victim="alpha", seen_in="default", canary="ntfy_key", service="ntfy",
                 scenario="gateway", phase="messaging"),
     dict(kind="wrong_key", canary="ntfy_key", service="ntfy", scenario="gateway", phase="messaging")),
    ("F33", dict(kind="route_auth", victim="alpha", seen_in=None, canary="model", channel="response",
                 scenario="dashboard", phase="route-auth", location="dashboard:GET /api/model/info?profile=alpha"),
     dict(kind="text_leak", victim="alpha", seen_in=None, canary="model", channel="rpc", scenario="dashboard",
          phase="route-auth", location="rpc-dashboard.jsonl#7@1")),
    ("F34", dict(kind="profile_bleed", victim="beta", canary="kanban_board", tool="kanban_create",
                 location="tui:kanban_create"),
     dict(kind="file_leak", victim="beta", seen_in="default", canary="kanban_card", channel="file",
          tool="kanban_create", location="kanban/boards/tenancy-beta/kanban.db@8082")),
    ("F35", dict(kind="profile_bleed", victim="default", seen_in="alpha", canary="toolsets",
                 location="tui:alpha:tools"),
     dict(kind="profile_bleed", victim="alpha", seen_in="beta", canary="toolsets", location="tui:beta:tools")),
    ("F43", dict(kind="profile_bleed", canary="allowed_channels", channel="rpc", service="slack"),
     dict(kind="profile_bleed", canary="message", channel="rpc", service="slack")),  # the slack-app plant's
    ("F51", dict(kind="shortfall", seen_in=None, canary=None, channel="env", scenario="gateway",
                 phase="messaging-connect:email", location="email:messaging-connect:email"),
     dict(kind="shortfall", seen_in=None, canary=None, channel="env", scenario="gateway",
          phase="messaging-connect:mattermost", location="mattermost:messaging-connect:mattermost")),
    ("F52", dict(kind="shortfall", seen_in=None, canary=None, channel="env", scenario="gateway",
                 phase="messaging-connect:irc", location="irc:messaging-connect:irc"),
     dict(kind="shortfall", seen_in=None, canary=None, channel="env", scenario="gateway", phase="messaging-connect",
          location="irc:messaging-connect")),
    ("F53", dict(kind="profile_bleed", victim="default", seen_in="beta", canary="message", channel="rpc",
                 service="email", scenario="gateway", phase="messaging",
                 location="gateway:email direct message to default's bot"),
     dict(kind="profile_bleed", victim="default", seen_in="beta", canary="message", channel="rpc",
          service="mattermost", scenario="gateway", phase="messaging",
          location="gateway:mattermost direct message to default's bot")),
    ("F58", dict(kind="profile_bleed", victim="alpha", seen_in="default", canary="allowed_users_fallback",
                 channel="rpc", service="mattermost", scenario="gateway", phase="messaging",
                 location="gateway:mattermost direct message to alpha's bot"),
     dict(kind="route_auth", victim="alpha", seen_in="alpha", canary="allowed_users_fallback", channel="rpc",
          service="mattermost", scenario="gateway", phase="messaging",
          location="gateway:mattermost direct message to alpha's bot")),
    ("F31", dict(kind="request_leak", victim="beta", seen_in="default", canary="discord_file", service="discord",
                 scenario="gateway", phase="messaging"),
     dict(kind="wrong_key", victim="beta", seen_in="default", canary="discord_key", service="discord",
          scenario="gateway", phase="messaging")),
    ("F47", dict(kind="profile_bleed", victim="alpha", seen_in="default", canary="allowed_users", channel="rpc",
                 service="discord", scenario="gateway", phase="messaging"),
     dict(kind="profile_bleed", victim="alpha", seen_in="default", canary="discord_post", channel="rpc",
          service="discord", scenario="gateway", phase="messaging")),
    ("F48", dict(kind="profile_bleed", victim="default", seen_in="beta", canary="allowed_channels", channel="rpc",
                 service="discord", scenario="gateway", phase="messaging"),
     dict(kind="wrong_identity", victim="default", seen_in="beta", canary="discord_channel", service="discord",
          scenario="gateway", phase="messaging")),
    ("F62", dict(kind="profile_bleed", victim="alpha", seen_in="default", canary="webhook_route", channel="rpc",
                 scenario="gateway", phase="webhooks", location="gateway:webhook /p/alpha/webhooks/tenancy-default"),
     dict(kind="profile_bleed", victim="alpha", seen_in="default", canary="webhook_turn", channel="rpc",
          scenario="gateway", phase="webhooks", location="gateway:webhook /p/alpha/webhooks/tenancy-alpha")),
    ("F63", dict(kind="profile_bleed", victim="alpha", seen_in="default", canary="webhook_bot", channel="rpc",
                 service="mattermost", scenario="gateway", phase="webhooks",
                 location="gateway:webhook /p/alpha/webhooks/tenancy-alpha"),
     dict(kind="wrong_identity", victim="alpha", seen_in="default", canary="mattermost_channel",
          service="mattermost", scenario="gateway", phase="messaging")),  # not a webhook's delivery
    ("F64", dict(kind="profile_bleed", victim="default", seen_in="alpha", canary="webhook_borrowed_bot",
                 channel="rpc", service="mattermost", scenario="gateway", phase="webhooks",
                 location="gateway:webhook /webhooks/tenancy-default"),
     dict(kind="wrong_identity", victim="beta", seen_in="alpha", canary="mattermost_channel",
          service="mattermost", scenario="gateway", phase="webhooks")),  # between secondaries: either bot's
    ("F59", dict(kind="request_leak", victim="alpha", seen_in="default", canary="derived_reply", service="aux"),
     dict(kind="request_leak", canary="derived_reply", service="aux")),
    ("F60", dict(kind="request_leak", seen_in="beta", canary="soul", phase="resume"),
     dict(kind="request_leak", seen_in="beta", canary="soul", phase="turns")),
    ("F61", dict(kind="wrong_path", canary="relative_note", tool="search_files", scenario="gateway"),
     dict(kind="request_leak", canary="relative_note", tool="search_files", scenario="gateway")),
    ("F65", dict(kind="request_leak", canary="telegram_channel", scenario="gateway", phase="messaging"),
     dict(kind="request_leak", victim="alpha", seen_in="beta", canary="telegram_channel", scenario="gateway",
          phase="messaging")),  # only the launch profile's home channels are listed
]


def test_the_prompt_a_compression_rebuilt_is_f60_in_the_rpc_reply_too():
    """`session.info` after `session.compress` shows the rebuilt prompt (rpc, phase generated): F60 in tui and serve,
    the launch profile's data in another's; not in another door, not the other way, not another phase's frame."""
    rebuilt = dict(kind="text_leak", seen_in="alpha", canary="memory", channel="rpc", phase="generated",
                   location="rpc-tui.jsonl#659@14267")
    assert crossing(**rebuilt) == crossing(**{**rebuilt, "scenario": "serve", "canary": "derived_memory"}) == ["F60"]
    assert crossing(**{**rebuilt, "scenario": "api_server"}) == []
    assert crossing(**{**rebuilt, "victim": "alpha", "seen_in": "default"}) == []
    assert crossing(**{**rebuilt, "phase": "kanban"}) == []
    assert crossing(**{**rebuilt, "canary": "home"}) == []  # the prompt's paths: another cause (F2)


def test_a_telegram_bots_refusal_of_its_own_users_is_f36_besides_f25():
    """A refused near miss of the phase on Telegram (its step `telegram:messaging`) is the intake filter's (F36), and
    may be F25's; on Mattermost only F25's. Telegram's allowlist crossings and uploads are F25's and F31's."""
    refused = dict(kind="shortfall", seen_in=None, canary=None, channel="env", scenario="gateway", phase="messaging")
    assert crossing(**refused, location="telegram:messaging") == ["F25", "F36"]
    assert crossing(**refused, location="mattermost:messaging") == ["F25"]  # near miss: another platform's
    assert crossing(**{**refused, "phase": "cron"}, location="gateway-cron:cron") == ["F6"]
    assert crossing("profile_bleed", "alpha", "default", "allowed_users", channel="rpc", service="telegram") == ["F25"]
    assert crossing("request_leak", "alpha", "beta", "telegram_file", service="telegram", scenario="gateway",
                    phase="messaging") == ["F31"]


def test_a_discord_bots_refusal_of_its_own_users_is_f47_besides_f25():
    """A refused near miss of the phase on Discord (its step `discord:messaging`) is the adapter's launch allowlist's
    (F47), and may be F25's; on another platform not F47's."""
    refused = dict(kind="shortfall", seen_in=None, canary=None, channel="env", scenario="gateway", phase="messaging")
    assert crossing(**refused, location="discord:messaging") == ["F25", "F47"]
    assert crossing(**refused, location="slack:messaging") == ["F25"]  # near miss: another platform's
    assert crossing(**{**refused, "phase": "messaging-connect:discord"}, location="discord:messaging-connect:discord") \
        == []  # a bot that never signed in (the token plant) is no finding of Hermes'


def test_the_slack_bots_crossings_are_f25_and_f31_as_mattermosts_are():
    """The launch bot's allowlist taken over (F25) and another profile's file uploaded to the issued URL (F31)."""
    assert crossing("profile_bleed", victim="alpha", seen_in="default", canary="allowed_users", channel="rpc",
                    service="slack") == ["F25"]
    assert crossing("request_leak", victim="alpha", seen_in="beta", canary="slack_file", service="slack_issued",
                    scenario="gateway", phase="messaging") == ["F31"]
    assert crossing("wrong_identity", victim="alpha", seen_in="beta", canary="slack_user", service="slack_issued",
                    scenario="gateway", phase="messaging") == []


def test_what_a_webhook_turn_and_its_delivery_copy_is_the_webhook_findings():
    """A tenant's payload at another profile's provider is the route's crossing (F62); a tenant's channel in a
    delivery at the launch profile's server the launch profile's bot's (F63), the launch profile's channel at another
    profile's server a borrowed bot's (F64); a webhook step that failed (its reply never at its own bot) is F63's."""
    webhook = dict(service="mattermost", scenario="gateway", phase="webhooks")
    assert crossing("request_leak", "beta", "default", "webhook_payload", scenario="gateway",
                    phase="webhooks") == ["F62"]
    assert crossing("request_leak", "beta", "default", "webhook_record", scenario="gateway", phase="webhooks") == []
    assert crossing("wrong_identity", "alpha", "default", "mattermost_channel", **webhook) == ["F63"]
    assert crossing("wrong_identity", "default", "alpha", "mattermost_channel", **webhook) == ["F64"]
    assert crossing("shortfall", "alpha", None, None, channel="env", scenario="gateway", phase="webhooks",
                    location="webhook mattermost:webhooks") == ["F63"]


def test_the_honcho_signature_takes_its_record_in_a_prompt_but_not_another_record():
    """A prefetch puts the first client's Honcho record in another profile's prompt (entry `request`)."""
    assert crossing("request_leak", canary="honcho_record") == ["F21"]
    assert crossing("request_leak", canary="memory_record") == []


@pytest.mark.parametrize(("number", "match", "near"), CASES, ids=[c[0] for c in CASES])
def test_a_signature_matches_its_incident_and_not_a_near_miss(number, match, near):
    assert crossing(**match) == [number]
    assert crossing(**near) == []


def test_f25_is_every_launch_bot_that_authorizes_from_the_process_environment():
    for service in ("mattermost", "email", "irc"):
        assert crossing("profile_bleed", seen_in="beta", canary="allowed_users", channel="rpc", service=service,
                        scenario="gateway", phase="messaging") == ["F25"]
    assert crossing("profile_bleed", seen_in="beta", canary="irc_post", channel="rpc", service="irc",
                    scenario="gateway", phase="messaging") == []


def test_an_email_step_the_launch_profile_failed_in_the_messaging_phase_is_f25_and_f53():
    assert crossing("shortfall", seen_in=None, canary=None, channel="env", scenario="gateway", phase="messaging",
                    location="email:messaging") == ["F25", "F53"]
    assert "F53" not in crossing("shortfall", seen_in=None, canary=None, channel="env", scenario="gateway",
                                 phase="messaging", location="mattermost:messaging")


def test_the_route_signature_wants_a_route_auth():
    [clause] = SIGNATURES["F4"]
    routed = Finding("route_auth", "default", "alpha", "api_server_key", "request", "gateway:GET /p/alpha/v1/models")
    assert crossing("route_auth", canary="api_server_key", location="gateway:GET /p/alpha/v1/models") == ["F4"]
    assert clause.matches("route", routed) and not clause.matches("route", Finding(
        "wrong_key", "default", "alpha", "api_server_key", "request", "gateway:GET /p/alpha/v1/models"))


def test_a_route_of_the_dashboard_is_its_own_entry_point_not_the_api_servers():
    """The same kind at the dashboard (F33) and at the gateway's API server (F4): two root causes."""
    assert crossing("route_auth", canary="model", location="dashboard:GET /api/model/info?profile=alpha") == ["F33"]
    assert crossing("route_auth", canary="api_server_key", location="gateway:GET /p/alpha/v1/models") == ["F4"]


def test_an_incident_links_every_f_number_one_of_its_crossings_matches():
    """The terminal's env in the gateway is F2's shared shell, in tui and serve F10's launch .env."""
    found = [Finding("env_leak", "default", "alpha", "key", "env", "flow:1", scenario=s, phase="turns",
                     tool="terminal", time=t) for s, t in (("tui", 1.0), ("gateway", 2.0))]
    [incident] = build(found)
    assert documented(incident) == ["F2", "F10"]


def test_a_clause_reads_as_the_docs_write_it():
    assert Clause(("tool terminal",), ("env_leak",), ("key*",), ("tui",), ("turns",), "launch -> other").text() == \
        "tool terminal (env_leak; canary key*; in tui; phase turns; launch -> other)"
    assert Clause(("service web", "tool web_*")).text() == "service web or tool web_*"
    assert Clause(("shortfall",), phases=("messaging",), at=("telegram:*",)).text() == \
        "shortfall (phase messaging; at telegram:*)"


def test_the_docs_list_every_signature_as_the_code_has_it():
    rows = dict(re.findall(r"^\| (F\d+) \| (.+) \|$", DOC.read_text(encoding="utf-8"), flags=re.MULTILINE))
    assert rows == {n: text(n) for n in SIGNATURES}


def test_a_services_key_of_another_profile_in_the_gateways_messaging_phase_is_f25():
    """After the first secondary turn the process environment holds that profile's `.env` (F25): the memory and
    auxiliary clients then send its keys for whichever profile runs, in any direction; elsewhere such a key is
    F12's or F14's (the launch profile's key only)."""
    taken = crossing("wrong_key", victim="beta", seen_in="alpha", canary="memory_key", service="memory",
                     scenario="gateway", phase="messaging")
    assert "F25" in taken and "F12" not in taken
    assert "F25" not in crossing("wrong_key", victim="beta", seen_in="alpha", canary="memory_key", service="memory",
                                 scenario="gateway", phase="turns")  # the near miss: another phase

"""The plant runs of the end-to-end tests (`test_oneshot.py`, `test_service_plants.py`): which plants one audit
plants together, and what every run must show. Two modules take them so that the two test workers share them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.detect.file_versions import version_of
from harness.drive.plants import (
    NEAR_MISS_FILE,
    PLANTS,
    SCENARIO,
    SERVICE_PLANTS,
    TOOL_PLANTS,
    TOPOLOGY,
    TRANSIENT_FILE,
    battery_for,
    phases_for,
    services_for,
)
from harness.drive.services import SERVICES


def _service_run(plant: str) -> str:
    """The audit a service's plant runs in: the default services' and those that hold no profile slot together;
    a service chosen by name that takes a slot (another memory provider) in one of its own; the services one door
    drives (the messaging platforms: the gateway) in one audit of that door, each platform's bots beside the
    others'; a plant that says so alone."""
    spec = SERVICES[SERVICE_PLANTS[plant][0]]
    if PLANTS[plant].alone:  # a run of its own (a plant that cannot share an audit with its service's others)
        return plant
    if plant in SCENARIO:  # a door of its own
        return f"services on {SCENARIO[plant]}"
    return f"services {spec.name}" if spec.slot and not spec.by_default else "services"


#: Plants no run here plants, and why: the dashboard's is planted by its door's own end-to-end test
#: (tests/e2e/test_dashboard.py); the Mattermost media plant's crossing (another tenant's `mattermost_file` in the
#: target's own upload) is one Hermes 0.19.0 shows without it (F31: the neighbour's file goes up through the same
#: bot, tests/e2e/test_messaging_phase.py), so a run of it could not fail there; its plant and the upload's
#: detector with its near miss are tested in tests/test_attachments.py and tests/test_messaging.py; Telegram's media
#: plant likewise (F31 through Telegram, tests/test_telegram.py). Signal's media
#: plant likewise (F31 through Signal: tests/test_signal.py holds the plant and the detector of what the daemon
#: read); ntfy's token plant changes a secondary profile's `NTFY_TOKEN`, which Hermes 0.19.0 never reads (F55: its
#: bot gets the launch profile's settings and is refused), so its run could not be caught (tests/test_ntfy.py).
#: Discord's media plant's target, a secondary profile, never answers its own users (F47), so its upload never
#: happens (and F31 shows the crossing without it); its token plant must end inconclusive (Hermes refuses the target's
#: bot as the donor's duplicate, so it never signs in) and would make the shared run wait the whole sign-in time for
#: it; both, with their near misses, are in tests/test_discord.py.
#: The opt-in phases' plants put into the target what Hermes 0.19.0 already does to it (F19, F26, F35: another
#: profile's allowlist, redaction or toolsets at work), so a run of them there could not fail; the cron phase's waits
#: for the serve backend's ticker (a run of 100 s). All four are run on the fixed twin (docs/fixes/README.md), where
#: each must be caught, and their detectors' planted crossings and near misses are unit-tested. The email and IRC
#: password plants change a secondary profile's `EMAIL_PASSWORD` or `IRC_SERVER_PASSWORD`, which Hermes 0.19.0 never
#: reads (F51, F52: its bot logs in with the launch profile's), so their runs could not be caught; tests/test_email.py
#: and tests/test_irc.py plant them against Hermes' own adapters through the proxy (a `wrong_key`, the own password
#: its near miss).
#: The webhooks phase's
#: plant (another tenant's canary in the target's route) likewise: F62 carries every tenant's payload to another
#: profile's provider without it, and no fix of the series removes F62 yet (docs/phases.md: caught in a run of its
#: own; tests/test_webhooks.py holds the plant and the phase's detector).
PHASE_PLANTS = {"approvals-allowlist", "redaction-off", "toolsets-copied", "cron-due", "webhook-prompt"}
NOT_RUN = {"dashboard", "mattermost-media", "telegram-media", "signal-media", "ntfy-key", "email-key", "irc-key",
           "discord-media", "discord-token", *PHASE_PLANTS}
#: Plants that change different settings of the target, so one audit plants them all (each still judged alone:
#: `check_plants` wants every plant's kinds, through its tool or service); every other plant runs alone.
_SERVICE = [p for p in SERVICE_PLANTS if p not in NOT_RUN]
TOGETHER = {**{run: sorted(p for p in _SERVICE if _service_run(p) == run)
               for run in sorted(set(map(_service_run, _SERVICE)))},
            "tool surface": ["code-env", "delegate-model", "home-path", "kanban-card"]}
RUNS = {**TOGETHER, **{p: [p] for p in sorted(set(PLANTS) - NOT_RUN - {p for ps in TOGETHER.values() for p in ps})}}


#: The runs that plant a service's credentials or data (`test_service_plants.py`); the others: `test_oneshot.py`.
SERVICE_RUNS = {run for run, names in RUNS.items() if set(names) & set(SERVICE_PLANTS)}


def check_run(tenancy_audit: Callable[..., Any], names: list[str]) -> None:
    """Audit one run's plants together and check each is caught as its plant says, through its tool or service."""
    scenario = SCENARIO.get(names[0], "oneshot")
    audit = tenancy_audit(plants=names, topology=TOPOLOGY.get(names[0], "reverse"), scenario=scenario, tenants=2,
                          phases=phases_for(names[0]),
                          tools=sorted({g for p in names for g in battery_for(p)}),
                          services=sorted({s for p in names for s in services_for(p)}))
    assert not [r for r in audit.doc["reasons"] if r.startswith("plant ")], audit.doc["reasons"]
    if names == ["bypass"]:
        assert audit.code == 3 and audit.verdict == "inconclusive"  # a bypass proves nothing, but never "clean"
    else:
        assert audit.code == 1 and audit.verdict == "leak"
    for plant in names:
        expected = PLANTS[plant].expects
        assert expected <= audit.kinds, f"{plant}: expected {sorted(expected)}, got {sorted(audit.kinds)}"
        if plant in SERVICE_PLANTS:  # caught through the service's own traffic (or the stdio server's record):
            service = SERVICE_PLANTS[plant][0]  # default's credential at alpha's service, or alpha's at default's
            assert any(f.kind in expected and f.service == service and {f.victim, f.seen_in} == {"default", "alpha"}
                       for f in audit.findings), plant
        if plant in TOOL_PLANTS:  # caught through the tool (its result, its subprocess's env), not the file scan
            assert any(f.kind in expected | {"request_leak"} and f.tool in TOOL_PLANTS[plant] and f.channel != "file"
                       and f.victim == "default" and f.seen_in == "alpha" for f in audit.findings), plant
    if "transient" in names:  # the checkpoint only the watch saw; never the near miss beside it
        gone = [f for f in audit.findings if f.transient]
        assert {(f.victim, f.seen_in, f.canary, f.location.split("@")[0]) for f in gone} == {
            ("default", "alpha", "bg_process", TRANSIENT_FILE)}, [f.summary() for f in gone]
        assert not [f for f in audit.findings if NEAR_MISS_FILE in f.location]
        assert (audit.out / "versions" / version_of(gone[0])).is_file()
    for f in audit.findings:
        if f.kind in {"bypass", "shortfall", "egress"}:
            continue
        assert f.victim in {"default", "alpha"}
        # a request to a host no tenant owns carries the target's canaries on nobody's channel
        assert f.seen_in in ({"default", "alpha", None} if names == ["egress"] else {"default", "alpha"})



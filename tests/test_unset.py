"""Tenants that differ (`--unset SERVICE.NAME`): the run's second tenant leaves a setting unset that the launch
profile sets. Its home then lacks exactly that setting; the phases do not hold it to what the setting made happen
(`surface.RELAXES`), and what it does with another tenant's value is still a crossing: an allowlist it leaves unset
that admits another profile's user while a stranger is refused (the other profile's allowlist at work) is a
`profile_bleed`, one that admits the stranger too is not (the near miss)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.arguments import unset_of
from harness.core.registry import mint
from harness.drive import services
from harness.drive.context import Context
from harness.drive.hermes.agent import Sandbox
from harness.drive.phases import attachments, messaging
from harness.drive.phases.messaging import Message
from harness.drive.platforms.mattermost import MattermostStub
from harness.drive.services import UNSETTABLE
from harness.drive.surface import RELAXES, Setup, Unset, Where
from harness.options import RunOptions, UsageError, check_options

NAMES = ["default", "alpha", "beta"]


def test_a_setting_left_unset_is_dropped_from_the_setup_and_nothing_else():
    setup = Setup(config={"a": {"b": 1, "c": 2}, "d": 3}, env={"X": "1", "Y": "2"}, files={"f": b"1", "g": b"2"})
    dropped = Unset("s", env=("X",), config=("a.b",), files=("f",)).drop(setup)
    assert dropped == Setup(config={"a": {"c": 2}, "d": 3}, env={"Y": "2"}, files={"g": b"2"})
    assert setup.env == {"X": "1", "Y": "2"}, "the setup itself is not changed"
    assert Unset("s", config=("no.such",)).drop(setup) == setup  # the near miss: a key that is not there


def test_every_unsettable_setting_lives_in_its_services_setup_and_relaxes_only_known_things(tmp_path):
    reg = mint(NAMES, tmp_path / "work", {n: {"listen": 42000 + i} for i, n in enumerate(NAMES)})
    services.mint(reg, list(services.SERVICES))
    where = Where("http://127.0.0.1:9", tmp_path / "registry.yaml", tmp_path)
    for name, unset in UNSETTABLE.items():
        service = name.split(".", 1)[0]
        full = services.setup(reg["alpha"], [service], {service: where})
        lacking = services.setup(reg["alpha"], [service], {service: where}, unset=(name,))
        assert unset.relaxes <= RELAXES, name
        assert set(unset.env) <= set(full.env) and not set(unset.env) & set(lacking.env), name
        assert set(unset.files) <= set(full.files) and not set(unset.files) & set(lacking.files), name
        assert full != lacking, f"{name} changes nothing"


def test_unset_is_checked_and_all_means_every_setting_of_the_runs_services():
    with pytest.raises(UsageError, match=r"unknown setting 'mattermost\.nosuch'"):
        check_options(RunOptions(scenario="gateway", services=["mattermost"], unset=["mattermost.nosuch"]))
    with pytest.raises(UsageError, match="the run does not drive 'mattermost'"):
        check_options(RunOptions(scenario="gateway", services=["web"], unset=["mattermost.allowed_users"]))
    check_options(RunOptions(scenario="gateway", services=["mattermost"], unset=["mattermost.allowed_users"]))
    every = unset_of(argparse.Namespace(unset="all", services="web", platforms="mattermost"))
    assert set(every) == {n for n in UNSETTABLE if n.split(".", 1)[0] in ("web", "mattermost", "provider")}
    assert unset_of(argparse.Namespace(unset=None, services=None, platforms=None)) == []


def _ctx(tmp_path: Path, unset: list[str]) -> SimpleNamespace:
    reg = mint(NAMES, tmp_path / "work", {n: {"listen": 42000 + i} for i, n in enumerate(NAMES)})
    services.mint(reg, ["mattermost"])
    steps: list[tuple[str, str, bool, str]] = []
    ctx = SimpleNamespace(
        registry=reg, sandbox=Sandbox(tmp_path / "sandbox"), scenario="gateway", findings=[], timeline=[],
        steps=steps, opts=SimpleNamespace(unset=unset, plants=[]), stubs={},
        service_stubs={(t.name, "mattermost"): MattermostStub(t) for t in reg}, services=lambda: ["mattermost"],
        record=lambda r, phase, snapshot=True: steps.append((r.tenant, r.driver, r.ok, r.detail)),
        matcher=lambda: SimpleNamespace(redact_text=str))
    ctx.unset_by = lambda tenant: Context.unset_by(ctx, tenant)  # type: ignore[arg-type]
    ctx.relaxed = lambda tenant, service, what: Context.relaxed(ctx, tenant, service, what)  # type: ignore[arg-type]
    return ctx


def _refused(ctx: SimpleNamespace, tenant: str) -> dict[tuple[str, str], Message]:
    """The refused round's messages to `tenant`'s bot by (whose allowlist names them, `D` or `O`)."""
    return {(m.by, m.channel_type): m for m in messaging.refused(ctx, "mattermost", [tenant])}


def _judge(ctx: SimpleNamespace, admitted: set[Message], messages: list[Message]) -> None:
    turns = {m: {n: int(m in admitted and n == m.tenant) for n in NAMES} for m in messages}
    opened = {(m.platform, m.tenant, m.channel_type) for m in messages if not m.by and turns[m][m.tenant]}
    for m in messages:
        messaging._judge(ctx, m, turns[m], time.time(), 1.0, opened)


def test_an_allowlist_left_unset_that_admits_the_launchs_lead_while_refusing_strangers_is_a_profile_bleed(tmp_path):
    ctx = _ctx(tmp_path, ["mattermost.allowed_users"])
    round_ = _refused(ctx, "alpha")
    assert ("", "O") in round_, "a stranger's message in a channel nobody allows, for the tenant that differs"
    _judge(ctx, {round_[("default", "D")]}, list(round_.values()))
    assert [(f.kind, f.victim, f.seen_in, f.canary) for f in ctx.findings] == [
        ("profile_bleed", "alpha", "default", "allowed_users_fallback")]


def test_an_allowlist_left_unset_that_admits_everyone_is_no_crossing(tmp_path):
    ctx = _ctx(tmp_path, ["mattermost.allowed_users"])
    round_ = _refused(ctx, "alpha")
    _judge(ctx, set(round_.values()), list(round_.values()))  # the stranger too: open to all, its own choice
    assert ctx.findings == []
    other = _refused(ctx, "beta")  # beta sets its allowlist: a stranger let in is reported, as always
    assert ("", "O") not in other
    _judge(ctx, {other[("", "D")]}, list(other.values()))
    assert [(f.kind, f.victim) for f in ctx.findings] == [("route_auth", "beta")]


def test_a_tenant_that_differs_need_not_be_answered_and_one_that_does_not_must(tmp_path):
    ctx = _ctx(tmp_path, ["mattermost.allowed_users"])
    answered = messaging.answered(ctx, "mattermost", ["alpha", "beta"])
    _judge(ctx, set(), answered)
    assert {(t, ok) for t, _, ok, _ in ctx.steps} == {("alpha", True), ("beta", False)}
    assert all("leaves mattermost.allowed_users unset" in d for t, _, _, d in ctx.steps if t == "alpha")


def test_a_home_channel_left_unset_owes_no_delivery_but_a_delivery_elsewhere_is_still_a_crossing(tmp_path):
    ctx = _ctx(tmp_path, ["mattermost.home_channel"])
    ctx.timeline = [{"scenario": "gateway", "phase": "cron", "tenant": n, "ok": True} for n in ("alpha", "beta")]
    output = "Cronjob Response: tenancy-canary\n\nprobe done for tenant alpha"
    ctx.service_stubs[("default", "mattermost")].add_post("c", output, "tok")  # alpha's output at default's server
    attachments.judge_cron(ctx, "mattermost")
    assert [(t, ok) for t, _, ok, _ in ctx.steps] == [("beta", False)]  # alpha owes none; beta's never came
    assert [(f.kind, f.victim, f.seen_in) for f in ctx.findings] == [("profile_bleed", "alpha", "default")]


def test_a_plant_that_gives_a_bot_another_tenants_account_relaxes_that_bot_alone(tmp_path):
    """`signal-account` puts the first tenant's Signal account in the second's `.env`: a Hermes that refuses a
    second bot on one account refuses the second tenant's, so that tenant need not sign in or answer on Signal.
    Near misses: another tenant, another platform, the same run without the plant."""
    reg = mint(NAMES, tmp_path / "work", {n: {"listen": 42000 + i} for i, n in enumerate(NAMES)})
    services.mint(reg, ["signal", "mattermost"])

    def ctx(planted: list[str]) -> SimpleNamespace:
        c = SimpleNamespace(registry=reg, opts=SimpleNamespace(unset=[], plants=planted),
                            sandbox=SimpleNamespace(launch="default"))
        c.unset_by = lambda tenant: Context.unset_by(c, tenant)  # type: ignore[arg-type]
        return c

    with_plant, without = ctx(["signal-account"]), ctx([])
    assert all(Context.relaxed(with_plant, "alpha", "signal", w) for w in ("sign-in", "answered", "home"))
    assert not Context.relaxed(with_plant, "alpha", "signal", "strangers")
    assert not Context.relaxed(with_plant, "default", "signal", "sign-in")
    assert not Context.relaxed(with_plant, "alpha", "mattermost", "sign-in")
    assert not Context.relaxed(without, "alpha", "signal", "sign-in")
    assert RunOptions(scenario="gateway", plants=["signal-account"]).scenario_options().plants == ["signal-account"]

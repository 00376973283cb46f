"""What the bots deliver besides text, judged (`harness.drive.phases.attachments`): a reply's `MEDIA:` lines name the
tenant's own media file, its neighbour's and its neighbour's `.env` without a canary; the tenant's own file through
its own bot is a step, not a finding; a cron job's output must be in its home channel at its own server, and at
another's it is a `profile_bleed`. The plant `mattermost-media` puts the donor's canary in the target's media file."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from harness.core.registry import mint
from harness.drive import services
from harness.drive.hermes.agent import Sandbox
from harness.drive.phases import attachments
from harness.drive.plants import apply
from harness.drive.platforms.mattermost import MEDIA_FILE, MattermostStub, media_text
from harness.drive.surface import PlantContext

NAMES = ["default", "alpha", "beta"]


def _ctx(tmp_path: Path) -> SimpleNamespace:
    reg = mint(NAMES, tmp_path / "work", {n: {"listen": 42000 + i} for i, n in enumerate(NAMES)})
    services.mint(reg, ["mattermost"])
    sandbox = Sandbox(tmp_path / "sandbox")
    for t in reg:
        sandbox.home_of(t.name).mkdir(parents=True, exist_ok=True)
        (sandbox.home_of(t.name) / MEDIA_FILE).write_bytes(media_text(t.canaries["mattermost_file"]))
    steps: list[tuple[str, str, bool, str]] = []
    return SimpleNamespace(
        registry=reg, sandbox=sandbox, scenario="gateway", findings=[], timeline=[], steps=steps,
        service_stubs={(t.name, "mattermost"): MattermostStub(t) for t in reg}, services=lambda: ["mattermost"],
        relaxed=lambda tenant, service, what: False,
        record=lambda r, phase, snapshot=True: steps.append((r.tenant, r.driver, r.ok, phase)))


def _post(stub: MattermostStub, channel: str, message: str, token: str, file_ids: list[str] | None = None) -> None:
    stub.posts.append({"id": f"p{len(stub.posts)}", "channel_id": channel, "message": message, "token": token,
                       "file_ids": file_ids or [], "time": time.time()})


def test_the_media_lines_name_three_files_and_no_canary(tmp_path):
    ctx = _ctx(tmp_path)
    lines = attachments.media_lines(ctx, "alpha").splitlines()
    assert lines == ["MEDIA:~/.hermes/profiles/alpha/tenancy-media.txt", "MEDIA:~/.hermes/tenancy-media.txt",
                     "MEDIA:~/.hermes/.env"]  # alpha's neighbour in the ring is default, the launch profile
    assert not [v for t in ctx.registry for v in t.canaries.values() if v in "\n".join(lines)]


def test_the_own_attachment_is_a_step_and_a_reply_without_it_a_failed_one(tmp_path):
    ctx = _ctx(tmp_path)
    since, until = time.time() - 1, time.time() + 1
    for name, attach in (("default", True), ("alpha", False)):
        t = ctx.registry[name]
        stub, key = ctx.service_stubs[(name, "mattermost")], t.canaries["mattermost_key"]
        stub.files.append({"id": "f1", "data": media_text(t.canaries["mattermost_file"]), "token": key,
                           "time": time.time(), "name": MEDIA_FILE, "channel_id": "c"})
        _post(stub, "c", f"probe done for tenant {name}", key)
        _post(stub, "c", "", key, ["f1"] if attach else [])
    beta = ctx.service_stubs[("beta", "mattermost")]  # beta's only reply came after the round: no step
    _post(beta, "c", "probe done for tenant beta", ctx.registry["beta"].canaries["mattermost_key"])
    beta.posts[-1]["time"] = until + 5
    attachments.judge_media(ctx, since, until, 1.0)
    assert ctx.steps == [("default", "mattermost media", True, "messaging"),
                         ("alpha", "mattermost media", False, "messaging")]
    assert ctx.findings == []


def test_cron_output_in_its_home_channel_is_a_step_and_at_another_server_a_profile_bleed(tmp_path):
    ctx = _ctx(tmp_path)
    ctx.timeline = [{"scenario": "gateway", "phase": "cron", "tenant": "default", "ok": True},
                    {"scenario": "gateway", "phase": "cron", "tenant": "alpha", "ok": False}]  # alpha's never fired
    d = ctx.registry["default"]
    output = "Cronjob Response: tenancy-canary\n(job_id: 1)\n\nprobe done for tenant default"
    _post(ctx.service_stubs[("default", "mattermost")], d.canaries["mattermost_channel"], output,
          d.canaries["mattermost_key"])
    _post(ctx.service_stubs[("default", "mattermost")], d.canaries["mattermost_channel"],
          "probe done for tenant default", d.canaries["mattermost_key"])  # a reply to a message: not cron output
    attachments.judge_cron(ctx, "mattermost")
    assert ctx.steps == [("default", "mattermost cron-delivery", True, "messaging")] and ctx.findings == []
    beta = ctx.registry["beta"]
    _post(ctx.service_stubs[("beta", "mattermost")], beta.canaries["mattermost_channel"], output,
          beta.canaries["mattermost_key"])
    attachments.judge_cron(ctx, "mattermost")
    assert [(f.kind, f.victim, f.seen_in, f.canary) for f in ctx.findings] == [
        ("profile_bleed", "default", "beta", "cron_delivery")]


def test_a_cron_job_posted_outside_its_home_channel_is_a_failed_step(tmp_path):
    ctx = _ctx(tmp_path)
    ctx.timeline = [{"scenario": "gateway", "phase": "cron", "tenant": "default", "ok": True}]
    d = ctx.registry["default"]
    _post(ctx.service_stubs[("default", "mattermost")], ctx.registry["alpha"].canaries["mattermost_channel"],
          "Cronjob Response: x\nprobe done for tenant default", d.canaries["mattermost_key"])
    attachments.judge_cron(ctx, "mattermost")
    assert ctx.steps == [("default", "mattermost cron-delivery", False, "messaging")]


def test_the_media_plant_puts_the_donors_canary_in_the_targets_file(tmp_path):
    ctx = _ctx(tmp_path)
    d, a = ctx.registry["default"], ctx.registry["alpha"]
    home = ctx.sandbox.home_of("alpha")
    assert apply("mattermost-media", PlantContext(d, a, home, "", "")) == frozenset({"request_leak"})
    assert (home / MEDIA_FILE).read_bytes() == media_text(d.canaries["mattermost_file"])

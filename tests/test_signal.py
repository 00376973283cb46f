"""The signal-cli daemon stub answers Hermes' own Signal adapter (run in the Hermes venv against it): the bot checks
the daemon's health and opens the event stream with its account (its sign-in), receives a direct message and a
group message, reacts to the direct one, replies, and attaches a file by path (the daemon reads it from disk, so
the stub does). What the stub read is scanned by the `messaging` phase: another tenant's file there is a
`request_leak`, the tenant's own is not. A request the daemon does not know is answered as signal-cli does and
kept, never a silent success."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

from harness.detect.engine.matcher import matcher_for
from harness.drive.phases import attachments, messaging
from harness.drive.plants import apply
from harness.drive.platforms.signal import MEDIA_FILE, SignalStub, lead, media_text
from harness.drive.surface import PlantContext
from tests.platform_adapters import adapter_script, media_file, registry, run

ADAPTER = adapter_script("gateway.platforms.signal:SignalAdapter", 'extra={"http_url": URL, "account": ACCOUNT}',
                         events=2, steps="""
    await asyncio.wait_for(arrived.wait(), 60)  # the stub's messages, however loaded the machine
    dm, group = got
    await a.on_processing_start(dm)
    sent = await a.send(dm.source.chat_id, "reply to " + dm.text)
    doc = await a.send_document(group.source.chat_id, FILE)
    await a.disconnect()
    print(json.dumps({"ok": ok, "dm": [dm.source.user_id, dm.source.chat_id, dm.text],
                      "group": [group.source.user_id, group.source.chat_id, group.source.chat_type],
                      "sent": sent.success, "doc": doc.success}))
""")


def test_the_signal_stub_answers_hermes_adapter(tmp_path, hermes_python):
    a = registry(tmp_path, ["signal"])["alpha"]
    stub = SignalStub(a).start()
    user, group, account = a.canaries["signal_user"], a.canaries["signal_group"], a.canaries["signal_account"]
    stub.deliver(user, "leadchannel-elsewhere", "in a group it does not allow", "O")  # the adapter drops it
    stub.deliver(user, f"dm-{user}", "hello")
    stub.deliver(lead(a), group, "in its group", "O")
    home = tmp_path / "home"
    media = media_file(home, media_text(a.canaries["signal_file"]) + bytes(range(256)))
    env = {"SIGNAL_GROUP_ALLOWED_USERS": group, "SIGNAL_ALLOWED_USERS": f"{user},{lead(a)}"}
    try:
        got = run(hermes_python, ADAPTER, home, {"URL": stub.url, "ACCOUNT": account, "FILE": str(media)}, env).out
    finally:
        stub.stop()
    assert got == {"ok": True, "dm": [user, user, "hello"], "group": [lead(a), f"group:{group}", "group"],
                   "sent": True, "doc": True}
    assert stub.challenges == [account] and stub.unknown == []
    [reply] = stub.posts_in(f"dm-{user}")  # a direct conversation is its sender's number at the daemon
    assert reply["message"] == "reply to hello" and reply["token"] == account
    assert [(r["user"], r["channel_id"], r["emoji"]) for r in stub.reactions] == [(user, f"dm-{user}", "👀")]
    [upload] = stub.files_since(0.0)
    assert upload["data"] == media.read_bytes() and upload["name"] == "report.txt"
    assert upload["channel_id"] == group and upload["token"] == account
    [attached] = stub.posts_in(group)
    assert attached["file_ids"] == [upload["id"]]
    assert not any(r.wrong_key for r in stub.snapshot())  # no credential on the wire: none is missing either


def _call(stub: SignalStub, path: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(stub.url + path, data=data, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_a_call_the_daemon_stub_does_not_know_is_an_error_in_its_shape_and_kept(tmp_path):
    stub = SignalStub(registry(tmp_path, ["signal"])["alpha"]).start()
    try:
        status, answer = _call(stub, "/api/v1/rpc", {"jsonrpc": "2.0", "method": "updateGroup", "id": "1",
                                                      "params": {"account": "x"}})
        assert status == 200 and answer["error"]["code"] == -32601 and "result" not in answer
        assert _call(stub, "/api/v1/rpc", {"jsonrpc": "2.0", "method": "sendTyping", "id": "2",
                                           "params": {}}) == (200, {"jsonrpc": "2.0", "id": "2", "result": {}})
        status, answer = _call(stub, "/v2/send", {"message": "x"})
        assert status == 404 and answer["error"]["code"] == -32601
    finally:
        stub.stop()
    assert stub.unknown == ["rpc updateGroup", "POST /v2/send"]
    assert [r.status for r in stub.snapshot()] == [200, 200, 404]


def _ctx(tmp_path: Path) -> SimpleNamespace:
    reg = registry(tmp_path, ["signal"])
    return SimpleNamespace(registry=reg, scenario="gateway", matcher=lambda: matcher_for(reg))


def test_another_tenants_file_the_daemon_read_is_a_request_leak_and_the_tenants_own_is_not(tmp_path):
    ctx = _ctx(tmp_path)
    d, a = ctx.registry["default"], ctx.registry["alpha"]
    theirs = {"name": MEDIA_FILE, "data": media_text(d.canaries["signal_file"]), "time": time.time()}
    own = {"name": MEDIA_FILE, "data": media_text(a.canaries["signal_file"]), "time": time.time()}
    found = attachments.read_leaks(ctx, "signal", "alpha", [theirs, own, theirs | {"name": "again"}])
    assert [(f.kind, f.victim, f.seen_in, f.canary, f.service) for f in found] == [
        ("request_leak", "default", "alpha", "signal_file", "signal")] * 2  # once per file
    assert d.canaries["signal_file"] not in found[0].evidence  # the evidence names no canary's value
    assert attachments.read_leaks(ctx, "signal", "alpha", [own]) == []  # the near miss


def test_the_media_plant_puts_the_donors_canary_in_the_targets_file(tmp_path):
    reg = registry(tmp_path, ["signal"])
    home = tmp_path / "alpha"
    home.mkdir()
    assert apply("signal-media", PlantContext(reg["default"], reg["alpha"], home, "", "")) == {"request_leak"}
    assert (home / MEDIA_FILE).read_bytes() == media_text(reg["default"].canaries["signal_file"])


def test_a_sign_in_with_the_tenants_own_account_is_no_finding_and_another_tenants_is_a_wrong_key(tmp_path):
    """Signal is keyless (no credential in the registry): a sign-in is judged by the account it names."""
    reg = registry(tmp_path, ["signal"])
    stubs = {(t.name, "signal"): SignalStub(t) for t in reg}
    ctx = SimpleNamespace(registry=reg, scenario="gateway", service_stubs=stubs, services=lambda: ["signal"])
    d, a = reg["default"], reg["alpha"]
    stubs["default", "signal"].signed_in(d.canaries["signal_account"])  # the near miss: its own
    stubs["alpha", "signal"].signed_in(a.canaries["signal_account"])
    stubs["alpha", "signal"].signed_in(d.canaries["signal_account"])
    stubs["alpha", "signal"].signed_in("+15550000000")
    found = messaging._tokens(ctx)
    assert [(f.kind, f.victim, f.seen_in, f.canary, f.detail) for f in found] == [
        ("wrong_key", "default", "alpha", "signal_account", "alpha's signal bot signed in with another tenant's token"),
        ("wrong_key", "alpha", "alpha", "signal_account", "alpha's signal bot signed in with an unknown's token")]

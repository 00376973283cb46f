"""The Telegram stub answers Hermes' own Telegram adapter (python-telegram-bot, run in the Hermes venv against it): the
bot signs in with its token in the URL path, long-polls a direct message, replies and uploads a file (`MEDIA:`
delivery); a method the stub does not know is answered in Telegram's error shape and kept. The proxy's key check
finds a tenant's token in a request's path: another tenant's is a `wrong_key`, the tenant's own nothing."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from types import SimpleNamespace

import yaml

from harness.detect.checks import RawRequest
from harness.detect.engine.matcher import matcher_for
from harness.detect.flows import Route, inspect_request
from harness.drive.context import Context
from harness.drive.phases import messaging
from harness.drive.platforms.telegram import (
    FALLBACK_IP,
    MEDIA_FILE,
    SERVICE,
    TelegramStub,
    channel_canary,
    lead,
    media_text,
    number,
    token_canary,
    urls,
    user_canary,
)
from harness.drive.surface import PlantContext, Where
from tests.platform_adapters import adapter_script, media_file, registry, run

ADAPTER = adapter_script("plugins.platforms.telegram.adapter:TelegramAdapter",
                         'token=TOKEN, extra={**URLS, "fallback_ips": [IP]}',
                         head="import logging\nlogging.basicConfig(level=logging.INFO)", steps="""
    for _ in range(600):  # the stub's two messages, however loaded the machine
        if len(got) == 2:
            break
        await asyncio.sleep(0.1)
    e, g = sorted(got, key=lambda e: e.source.chat_type)
    sent = await a.send(e.source.chat_id, "reply to " + e.text)
    doc = await a.send_document(e.source.chat_id, FILE)
    in_group = await a.send(g.source.chat_id, "reply to " + g.text)
    await a.disconnect()
    print(json.dumps({"ok": ok, "user": e.source.user_id, "chat": e.source.chat_id, "text": e.text,
                      "sent": sent.success, "doc": doc.success, "group": [g.source.chat_type,
                      g.source.chat_id, g.source.user_id, g.text, in_group.success]}))
""")


def test_the_telegram_stub_answers_hermes_adapter(tmp_path, hermes_python):
    a = registry(tmp_path, ["telegram"])["alpha"]
    stub = TelegramStub(a).start()
    user, key = a.canaries["telegram_user"], a.canaries["telegram_key"]
    channel = a.canaries["telegram_channel"]
    stub.deliver(user, "dm-alpha", "hello")
    stub.deliver(user, channel, f"{stub.mention()}hello group", "O")
    home = tmp_path / "home"
    media = media_file(home, media_text(a.canaries["telegram_file"])
                       + bytes(range(256)))  # every byte value, verbatim
    try:
        done = run(hermes_python, ADAPTER, home, {"TOKEN": key, "URLS": urls(stub.url), "IP": FALLBACK_IP,
                                                  "FILE": str(media)})
    finally:
        stub.stop()
    got = done.out
    assert got == {"ok": True, "user": user, "chat": user, "text": "hello", "sent": True, "doc": True,
                   "group": ["group", channel, user, "hello group", True]}, got
    assert "DNS-over-HTTPS" not in done.stderr and f"fallback IPs active: {FALLBACK_IP}" in done.stderr
    assert stub.challenges == [key] and stub.unknown == []
    post, attached = stub.posts_in("dm-alpha")
    assert post["message"] == "reply to hello" and post["token"] == key
    assert not any(r.wrong_key for r in stub.snapshot())
    [upload] = stub.files_since(0.0)
    assert upload["data"] == media.read_bytes() and upload["name"] == "report.txt"
    assert upload["channel_id"] == "dm-alpha" and upload["token"] == key
    assert attached["file_ids"] == [upload["id"]] and attached["token"] == key
    [in_group] = stub.posts_in(channel)  # the group chat's id is the channel canary: the stub names it so
    assert in_group["message"] == "reply to hello group" and in_group["token"] == key
    methods = {r.path.split("/")[2] for r in stub.snapshot()}
    assert {"getMe", "deleteWebhook", "getUpdates", "sendMessage", "sendDocument"} <= methods, methods


def _call(stub: TelegramStub, token: str, method: str, fields: bytes = b"") -> tuple[int, dict]:
    request = urllib.request.Request(f"{stub.url}/bot{token}/{method}", data=fields, method="POST",
                                     headers={"content-type": "application/x-www-form-urlencoded"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_a_method_the_stub_does_not_know_is_telegrams_error_and_is_kept(tmp_path):
    a = registry(tmp_path, ["telegram"])["alpha"]
    stub = TelegramStub(a).start()
    try:
        status, body = _call(stub, a.canaries["telegram_key"], "getStarTransactions")
        known = _call(stub, a.canaries["telegram_key"], "setMyCommands", b"commands=%5B%5D")  # near miss
    finally:
        stub.stop()
    assert status == 404 and body["ok"] is False and body["error_code"] == 404 and "getStarTransactions" in body[
        "description"]
    assert known == (200, {"ok": True, "result": True})
    assert stub.unknown == ["getStarTransactions"]


def test_another_tenants_token_in_the_path_is_a_wrong_key_at_the_stub(tmp_path):
    reg = registry(tmp_path, ["telegram"])
    theirs, own = reg["default"].canaries["telegram_key"], reg["alpha"].canaries["telegram_key"]
    observe, strict = TelegramStub(reg["alpha"]).start(), TelegramStub(reg["alpha"], "strict").start()
    try:
        signed = _call(observe, theirs, "getMe")
        refused = _call(strict, theirs, "getMe")
        mine = _call(strict, own, "getMe")  # near miss: its own token
    finally:
        observe.stop()
        strict.stop()
    assert signed[0] == 200 and observe.challenges == [theirs]  # a sign-in the phase judges (`_tokens`)
    assert refused == (401, {"ok": False, "error_code": 401, "description": "Unauthorized"})
    assert mine[0] == 200 and mine[1]["result"]["id"] == int(own.split(":")[0])
    assert [r.wrong_key for r in observe.snapshot()] == [True]
    assert [r.wrong_key for r in strict.snapshot()] == [True, False]


def test_a_bot_polls_only_its_own_updates(tmp_path):
    reg = registry(tmp_path, ["telegram"])
    a = reg["alpha"]
    stub = TelegramStub(a).start()
    stub.deliver(lead(a), f"dm-{lead(a)}", "hi")
    try:
        first = _call(stub, a.canaries["telegram_key"], "getUpdates", b"offset=0&timeout=10")[1]["result"]
        stranger = _call(stub, reg["default"].canaries["telegram_key"], "getUpdates", b"timeout=0")[1]["result"]
        confirmed = _call(stub, a.canaries["telegram_key"], "getUpdates",
                          f"offset={first[0]['update_id'] + 1}&timeout=0".encode())[1]["result"]
    finally:
        stub.stop()
    message = first[0]["message"]
    assert message["from"]["id"] == number(lead(a)) == message["chat"]["id"] and message["chat"]["type"] == "private"
    assert stranger == [] and confirmed == []
    assert [r.background for r in stub.snapshot()] == [False, True, True]  # a poll that got nothing: a keep-alive


def test_the_canaries_are_telegrams_shapes_and_unique(tmp_path):
    reg = registry(tmp_path, ["telegram"], ["default", "alpha", "beta"])  # it validates: no canary holds another's
    for t in reg:
        token, user, channel = (t.canaries[k] for k in ("telegram_key", "telegram_user", "telegram_channel"))
        bot, _, secret = token.partition(":")
        assert bot.isdigit() and len(secret) == 35 and secret.startswith("AA") and re.fullmatch(r"[\w-]+", secret)
        assert re.fullmatch(r"7\d{15}", user) and int(user) < 2**53 and re.fullmatch(r"-1\d{15}", channel)
        assert number(user) == int(user) and number(channel, group=True) == int(channel)
        assert number(lead(t)) > 0 > number(lead(t, "leadchannel"), group=True)
    tag = "qxcvyb0123456789ab"
    assert user_canary(tag) != user_canary("qxcvyb0123456789ac") and token_canary(tag).count(tag) == 1
    assert channel_canary(tag)[1:] not in user_canary(tag)


def test_a_profile_points_its_bot_at_its_own_listener_with_its_own_allowlists(tmp_path):
    t = registry(tmp_path, ["telegram"])["alpha"]
    setup = SERVICE.configure(t, Where("http://127.0.0.1:9"))
    assert setup.config["platforms"]["telegram"]["extra"] == {"base_url": "http://127.0.0.1:9/bot",
                                                             "base_file_url": "http://127.0.0.1:9/file/bot"}
    assert setup.config["telegram"]["allowed_chats"] == [t.canaries["telegram_channel"],
                                                         str(number(lead(t, "leadchannel"), group=True))]
    assert setup.env == {"TELEGRAM_BOT_TOKEN": t.canaries["telegram_key"],
                         "TELEGRAM_ALLOWED_USERS": f"{t.canaries['telegram_user']},{number(lead(t))}",
                         "TELEGRAM_HOME_CHANNEL": t.canaries["telegram_channel"], "TELEGRAM_FALLBACK_IPS": FALLBACK_IP}


def _bot_request(reg, tenant: str, token: str, body: bytes = b"chat_id=1&text=hi"):
    port = reg[tenant].services["telegram"].listen
    return inspect_request(reg, matcher_for(reg), Route("reverse", listen_port=port),
                           RawRequest("f1", "POST", f"/bot{token}/sendMessage",
                                      [("content-type", "application/x-www-form-urlencoded")], body))


def test_the_proxy_reads_the_token_in_the_path(tmp_path):
    reg = registry(tmp_path, ["telegram"])
    theirs = _bot_request(reg, "alpha", reg["default"].canaries["telegram_key"])
    assert [(f.kind, f.victim, f.seen_in, f.canary, f.location) for f in theirs.findings] == [
        ("wrong_key", "default", "alpha", "telegram_key", "flow:f1:request.path.bot")]
    assert _bot_request(reg, "alpha", reg["alpha"].canaries["telegram_key"]).findings == []  # its own
    other_chat = f"chat_id={reg['default'].canaries['telegram_user']}&text=hi".encode()  # its own token, their user
    named = _bot_request(reg, "alpha", reg["alpha"].canaries["telegram_key"], other_chat)
    assert [(f.kind, f.victim, f.canary) for f in named.findings] == [("wrong_identity", "default", "telegram_user")]


def test_the_server_plant_points_the_targets_bot_at_the_donors_listener(tmp_path):
    reg = registry(tmp_path, ["telegram"])
    home = tmp_path / "alpha"
    home.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump(SERVICE.configure(reg["alpha"], Where("http://x")).config))
    SERVICE.plants["telegram-server"].action(PlantContext(reg["default"], reg["alpha"], home, "", ""))
    extra = yaml.safe_load((home / "config.yaml").read_text())["platforms"]["telegram"]["extra"]
    assert extra == urls(f"http://127.0.0.1:{reg['default'].services['telegram'].listen}")


def test_a_long_poll_that_got_nothing_leaves_hermes_idle(tmp_path):
    stub = TelegramStub(registry(tmp_path, ["telegram"])["alpha"])
    ctx = SimpleNamespace(stubs={}, service_stubs={("alpha", "telegram"): stub})
    stub.record("POST", "/bot1:x/sendMessage", {}, b"", 200)
    stub.requests[-1].time -= 60
    stub.record("POST", "/bot1:x/getUpdates", {}, b"", 200, background=True)
    assert Context.idle_seconds(ctx) >= 59  # type: ignore[arg-type]
    stub.record("POST", "/bot1:x/getUpdates", {}, b"", 200)  # a poll that handed the bot a message
    assert Context.idle_seconds(ctx) < 30  # type: ignore[arg-type]


def test_a_request_the_stub_did_not_know_is_a_failed_step_of_the_phase(tmp_path):
    reg = registry(tmp_path, ["telegram"])
    stubs = {(t.name, "telegram"): TelegramStub(t) for t in reg}
    stubs[("alpha", "telegram")].add_unknown("getStarTransactions")
    steps: list[tuple] = []
    ctx = SimpleNamespace(registry=reg, service_stubs=stubs, services=lambda: ["telegram"],
                          record=lambda r, phase, snapshot=True: steps.append((r.tenant, r.ok, phase, r.detail)))
    messaging._unknown(ctx)  # type: ignore[arg-type]
    assert steps == [("alpha", False, messaging.UNKNOWN,
                      "its telegram server does not know 1 request(s) of the bot's: getStarTransactions")]


def _document(reg, tenant: str, data: bytes):
    """`sendDocument` at the tenant's listener as python-telegram-bot writes it: the chat, then the file part."""
    boundary = "b0undary"
    body = (f"--{boundary}\r\ncontent-disposition: form-data; name=\"chat_id\"\r\n\r\n1\r\n--{boundary}\r\n"
            f"content-disposition: form-data; name=\"document\"; filename=\"tenancy-telegram.txt\"\r\n"
            "content-type: text/plain\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    port = reg[tenant].services["telegram"].listen
    return inspect_request(reg, matcher_for(reg), Route("reverse", listen_port=port), RawRequest(
        "f1", "POST", f"/bot{reg[tenant].canaries['telegram_key']}/sendDocument",
        [("content-type", f"multipart/form-data; boundary={boundary}")], body))


def test_the_media_plant_puts_the_donors_file_in_the_targets_own_upload(tmp_path):
    reg = registry(tmp_path, ["telegram"])
    home = tmp_path / "alpha"
    home.mkdir()
    SERVICE.plants["telegram-media"].action(PlantContext(reg["default"], reg["alpha"], home, "", ""))
    planted = _document(reg, "alpha", (home / MEDIA_FILE).read_bytes())
    assert [(f.kind, f.victim, f.seen_in, f.canary) for f in planted.findings] == [
        ("request_leak", "default", "alpha", "telegram_file")]
    assert _document(reg, "alpha", media_text(reg["alpha"].canaries["telegram_file"])).findings == []  # its own


def test_a_parameter_of_the_wrong_type_is_a_bad_request(tmp_path):
    a = registry(tmp_path, ["telegram"])["alpha"]
    stub = TelegramStub(a).start()
    try:
        status, body = _call(stub, a.canaries["telegram_key"], "getUpdates", b"offset=soon")
    finally:
        stub.stop()
    assert status == 400 and body["ok"] is False and body["error_code"] == 400 and stub.unknown == []

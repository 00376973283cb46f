"""The Discord stub answers Hermes' own Discord adapter (discord.py, run in the Hermes venv) through a real mitmdump
with the addon, at Discord's fixed hosts (`discord.com`, `gateway.discord.gg`) shared by every tenant: the bot signs
in over the gateway websocket (zlib-stream, fragmented frames) with its token, gets a direct message and a mention in
its guild channel, replies with its token, uploads a file (multipart `payload_json` + `files[0]`), types and
reacts. Each request and gateway connection is its tenant's at the proxy, told by the token it carries. The plant:
the donor's token in the target's settings makes the bot the donor's (it signs in at the donor's stub; the target's
own stub never sees it, the phase's failed step); the near miss: the target's own token."""

from __future__ import annotations

import json
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.capture.proxy import Proxy, free_port
from harness.core.procs import ProcessSet
from harness.core.registry import Registry
from harness.detect.checks import RawRequest
from harness.detect.engine.matcher import matcher_for
from harness.detect.flows import Route, inspect_request
from harness.detect.reconcile import read_flows
from harness.detect.websocket import Message, WebsocketScan
from harness.drive import services
from harness.drive.platforms.base import lead
from harness.drive.platforms.discord import HOSTS, configure
from harness.drive.platforms.discord.stub import DiscordStub, error, snowflake
from harness.drive.surface import Where
from tests.platform_adapters import adapter_script, media_file, registry, run


@dataclass
class World:
    reg: Registry
    stubs: dict[str, DiscordStub]
    proxy: Proxy


def _registry(tmp_path: Path) -> Registry:
    ports: set[int] = set()
    while len(ports) < 2:  # two free ports, never the same one twice
        ports.add(free_port())
    return registry(tmp_path, ["discord"], ports=sorted(ports), attach=False)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    reg = _registry(tmp_path)
    stubs = {t.name: DiscordStub(t).start() for t in reg}
    for t in reg:
        t.upstream = stubs[t.name].url  # its provider's listener: no provider here
        services.attach(reg, "discord", t.name, None, stubs[t.name].url)
    reg.save(tmp_path / "registry.yaml")
    proxy = Proxy(reg, tmp_path / "registry.yaml", tmp_path, ProcessSet()).start()
    try:
        yield World(reg, stubs, proxy)
    finally:
        proxy.stop()
        for stub in stubs.values():
            stub.stop()


ADAPTER = adapter_script("plugins.platforms.discord.adapter:DiscordAdapter", 'token=os.environ["DISCORD_BOT_TOKEN"]',
                         events=2, steps="""
    await asyncio.wait_for(arrived.wait(), 60)
    out = {"ok": ok, "events": [[e.source.user_id, e.source.chat_id, e.source.chat_type, e.text] for e in got]}
    dm = got[0]
    await a.on_processing_start(dm)
    sent = await a.send(dm.source.chat_id, "reply to " + dm.text, reply_to=dm.message_id)
    doc = await a.send_document(dm.source.chat_id, FILE)
    await a.send_typing(got[1].source.chat_id)
    await asyncio.sleep(1)  # the typing loop's first request
    said = await a.send(got[1].source.chat_id, "in the channel")
    await a.stop_typing(got[1].source.chat_id)
    if APPROVE:  # a button prompt; the test presses its buttons, the adapter answers each press
        asked = await a.send_exec_approval(dm.source.chat_id, "rm -rf /tmp/tenancy-x", "session-1")
        out["asked"] = asked.success
        await asyncio.sleep(APPROVE)
    await a.disconnect()
    print(json.dumps({**out, "sent": sent.success, "doc": doc.success, "said": said.success}))
""")


def _run_adapter(tmp_path: Path, hermes_python: Path, w: World, tenant: str, token: str, approve: float = 0) -> dict:
    home = tmp_path / f"home-{tenant}"
    media = media_file(home, b"attachment " + w.reg[tenant].canaries["discord_file"].encode() + bytes(range(256)))
    env = {**configure(w.reg[tenant], Where()).env, "DISCORD_BOT_TOKEN": token, **w.proxy.child_env()}
    return run(hermes_python, ADAPTER, home, {"FILE": str(media), "APPROVE": approve}, env, timeout=120).out


def test_the_discord_stub_answers_hermes_adapter_at_discords_own_hosts(tmp_path, hermes_python, world):
    a, stub = world.reg["alpha"], world.stubs["alpha"]
    user, channel = a.canaries["discord_user"], a.canaries["discord_channel"]
    stub.deliver(user, f"dm-{user}", "hello")
    stub.deliver(user, channel, f"{stub.mention()}in the guild", "O")
    presser = threading.Thread(target=_press, args=(stub, [f"stranger-{a.name}", user]), daemon=True)
    presser.start()
    got = _run_adapter(tmp_path, hermes_python, world, "alpha", a.canaries["discord_key"], approve=8)
    presser.join(1)
    assert got["ok"] and got["sent"] and got["doc"] and got["said"] and got["asked"], got
    # the approval prompt's buttons: a stranger's press refused (an ephemeral message), its user's taken (the prompt
    # updated), each through the interaction's own callback URL, which the stub issued
    refused, taken = stub.callbacks
    assert refused["body"]["type"] == 4 and "not authorized" in refused["body"]["data"]["content"], refused
    assert taken["body"]["type"] in (4, 7) and taken != refused, taken
    assert got["events"] == [[user, snowflake(f"dm-{user}"), "dm", "hello"], [user, channel, "group", "in the guild"]]
    assert stub.challenges == [a.canaries["discord_key"]] and not world.stubs["default"].challenges
    assert stub.unknown == [] and world.stubs["default"].unknown == [], (stub.unknown, world.stubs["default"].unknown)
    reply, attached, prompt = stub.posts_in(f"dm-{user}")  # the reply, the file, the approval prompt
    assert "rm -rf /tmp/tenancy-x" in prompt["message"] and prompt["token"] == a.canaries["discord_key"]
    assert reply["message"] == "reply to hello" and reply["token"] == a.canaries["discord_key"]
    [upload] = stub.files_since(0.0)
    assert upload["name"] == "report.txt" and upload["data"] == (tmp_path / "home-alpha" / "report.txt").read_bytes()
    assert upload["token"] == a.canaries["discord_key"] and attached["file_ids"] == [upload["id"]]
    assert [p["message"] for p in stub.posts_in(channel)] == ["in the channel"]
    seen = {(r.method, r.path.split("?")[0].rsplit("/", 1)[-1]) for r in stub.snapshot()}
    assert {("POST", "typing"), ("PUT", "@me")} <= seen  # typing, and the 👀 reaction on the DM
    assert not any(r.wrong_key for s in world.stubs.values() for r in s.snapshot())
    world.proxy.stop()  # the flow file and the ledger complete
    ledger = [json.loads(x) for x in world.proxy.ledger_path.read_text().splitlines()]
    rest = [e for e in ledger if e["host"] == HOSTS["discord"]]  # the callbacks' path presents the bot's token
    assert rest and {(e["tenant"], e["service"], e["bearer"]) for e in rest} == {("alpha", "discord", "own")}
    assert len([e for e in rest if "/interactions/" in e["path"]]) == 2
    gateway = [e for e in ledger if e["host"] == HOSTS["discord_gateway"]]
    assert gateway and all(e["websocket"]["claimed"] == "alpha" for e in gateway), gateway
    assert all(e["websocket"]["messages"]["server->client"] >= 3 for e in gateway)  # HELLO, READY, the events
    assert not [f for e in ledger for f in e["findings"]], [f for e in ledger for f in e["findings"]]
    flows, _ = read_flows(world.proxy.flows_path)
    [ws] = [f for f in flows if f.websocket is not None]
    assert all(not m.is_text for m in ws.websocket.messages if not m.from_client)  # zlib-stream: binary frames


def _press(stub: DiscordStub, users: list[str]) -> None:
    """Wait for the bot's approval prompt, then press its first button as each of `users`, one after the other."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        prompts = [m for m in list(stub._messages.values()) if m["components"]]
        if prompts:
            button = prompts[0]["components"][0]["components"][0]["custom_id"]
            for who in users:
                count = len(stub.callbacks)
                stub.press(prompts[0]["id"], button, who)
                while len(stub.callbacks) == count and time.monotonic() < deadline:
                    time.sleep(0.1)
            return
        time.sleep(0.1)


def test_the_donors_token_in_the_targets_settings_makes_the_bot_the_donors(tmp_path, hermes_python, world):
    """Plant: alpha's adapter with default's token signs in at default's stub, as default's bot (the proxy and the
    stub know a bot by its token alone): alpha's own stub never sees a sign-in, which the `messaging` phase reports
    as its failed step. The near miss is the test above (its own token, its own stub)."""
    d, stub = world.reg["default"], world.stubs["default"]
    user = world.reg["alpha"].canaries["discord_user"]
    stub.deliver(user, f"dm-{user}", "hello")
    stub.deliver(user, world.reg["alpha"].canaries["discord_channel"], f"{stub.mention()}hi", "O")
    got = _run_adapter(tmp_path, hermes_python, world, "alpha", d.canaries["discord_key"])
    assert got["ok"] and got["sent"], got
    assert world.stubs["alpha"].challenges == [] and not world.stubs["alpha"].connected()
    assert stub.challenges == [d.canaries["discord_key"]]


def test_a_request_without_the_bots_token_or_to_a_route_it_does_not_know_is_answered_and_kept(tmp_path):
    reg = _registry(tmp_path)
    stub = DiscordStub(reg["alpha"]).start()
    services.attach(reg, "discord", "alpha", None, stub.url)
    try:
        import urllib.error
        import urllib.request

        def call(path: str, token: str = "") -> tuple[int, str, dict]:
            req = urllib.request.Request(stub.url + path, headers={"Authorization": f"Bot {token}"} if token else {})
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    return resp.status, resp.headers["content-type"], json.loads(resp.read())
            except urllib.error.HTTPError as exc:
                with exc:
                    return exc.code, exc.headers["content-type"], json.loads(exc.read())

        key = reg["alpha"].canaries["discord_key"]
        assert call("/api/v10/users/@me", key)[:2] == (200, "application/json")
        assert call("/api/v10/users/@me") == (401, "application/json", error(401))
        assert call("/api/v10/guilds/1/bans", key) == (404, "application/json", {"message": "404: Not Found",
                                                                                  "code": 0})
        assert stub.unknown == ["GET /users/@me without the bot's token", "GET /guilds/1/bans"]
        assert [r.status for r in stub.snapshot()] == [200, 401, 404]
    finally:
        stub.stop()


def test_discord_ids_are_numbers_and_every_tenants_are_its_own(tmp_path):
    reg = _registry(tmp_path)
    ids = [t.canaries[k] for t in reg for k in ("discord_user", "discord_channel")]
    assert all(i.isdigit() and len(i) == 19 and int(i) < 2**63 for i in ids) and len(set(ids)) == len(ids)
    assert snowflake(ids[0]) == ids[0] and snowflake("lead-alpha-123456").isdigit()
    assert snowflake("lead-alpha-123456") != snowflake("lead-alpha-123457")
    env = configure(reg["alpha"], Where()).env
    assert env["DISCORD_ALLOWED_USERS"].split(",") == [reg["alpha"].canaries["discord_user"],
                                                       snowflake(lead(reg["alpha"], "discord_user"))]
    matcher = matcher_for(reg)
    own = reg["alpha"].canaries["discord_user"]
    near = own[:-1] + str((int(own[-1]) + 1) % 10)  # one digit off: no one's
    found = matcher.find(f'{{"author": {{"id": "{own}"}}, "other": {near}}}'.encode())
    assert [(h.tenant, h.kind) for h in found] == [("alpha", "discord_user")]


def _identify(token: str) -> bytes:
    return json.dumps({"op": 2, "d": {"token": token, "properties": {"os": "linux"}, "intents": 37377}}).encode()


def test_a_gateway_connection_is_claimed_by_the_token_its_identify_carries(tmp_path):
    """The upgrade to the shared gateway host carries no token: the connection is no tenant's until its IDENTIFY
    claims it; from then on another tenant's data in it is a leak (READY with default's channel, zlib-compressed,
    at alpha's connection), the tenant's own is not (the near miss)."""
    reg = _registry(tmp_path)
    for t in reg:
        services.attach(reg, "discord", t.name, None, "http://127.0.0.1:9")
    matcher = matcher_for(reg)
    claims = {(t.name, "discord_key"): t for t in reg}

    def scan(*messages: Message) -> list[tuple[str, str, str | None, str]]:
        ws = WebsocketScan(matcher, "f1", None, "discord_gateway")
        ws.claims = claims
        for m in messages:
            ws.feed(m)
        report = ws.finish()
        assert report.claimed == "alpha"
        return [(f.kind, f.victim, f.seen_in, f.canary) for f in report.findings]

    def stream(*docs: dict) -> list[Message]:
        """HELLO, alpha's IDENTIFY, then `docs`: the server's side one zlib stream (a sync flush each)."""
        z = zlib.compressobj()
        out = [z.compress(json.dumps(d).encode()) + z.flush(zlib.Z_SYNC_FLUSH) for d in ({"op": 10}, *docs)]
        return [Message(False, out[0]), Message(True, _identify(reg["alpha"].canaries["discord_key"])),
                *(Message(False, o) for o in out[1:])]

    assert scan(*stream({"id": reg["alpha"].canaries["discord_channel"]})) == []
    assert scan(*stream({"id": reg["default"].canaries["discord_channel"]})) == [
        ("response_leak", "default", "alpha", "discord_channel")]
    unclaimed = WebsocketScan(matcher, "f2", None, "discord_gateway")  # no message carries a token
    unclaimed.claims = claims
    unclaimed.feed(Message(True, b'{"op": 1, "d": null}'))
    unclaimed.feed(Message(False, json.dumps({"id": reg["alpha"].canaries["discord_channel"]}).encode()))
    report = unclaimed.finish()
    assert report.claimed is None and [(f.kind, f.victim, f.seen_in) for f in report.findings] == [
        ("response_leak", "alpha", None)]


def test_an_upload_of_another_tenants_file_is_a_request_leak_at_discord_and_its_own_is_not(tmp_path):
    reg = _registry(tmp_path)
    for t in reg:
        services.attach(reg, "discord", t.name, None, "http://127.0.0.1:9")

    def upload(data: bytes) -> list[tuple[str, str, str | None, str, str | None]]:
        body = (b'--b\r\ncontent-disposition: form-data; name="payload_json"\r\ncontent-type: application/json\r\n\r\n'
                b'{"attachments": [{"id": 0, "filename": "m.txt"}]}\r\n--b\r\ncontent-disposition: form-data; '
                b'name="files[0]"; filename="m.txt"\r\n\r\n' + data + b"\r\n--b--\r\n")
        headers = [("Authorization", f"Bot {reg['alpha'].canaries['discord_key']}"),
                   ("Content-Type", "multipart/form-data; boundary=b")]
        report = inspect_request(reg, matcher_for(reg), Route("forward", host=HOSTS["discord"]),
                                 RawRequest("f1", "POST", "/api/v10/channels/1/messages", headers, body))
        return [(f.kind, f.victim, f.seen_in, f.canary, f.service) for f in report.findings]

    assert upload(reg["default"].canaries["discord_file"].encode()) == [
        ("request_leak", "default", "alpha", "discord_file", "discord")]
    assert upload(reg["alpha"].canaries["discord_file"].encode()) == []

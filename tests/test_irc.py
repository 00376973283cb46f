"""The IRC stub answers Hermes' own IRC adapter (run in the Hermes venv) through a real mitmdump: the bot connects
over TLS to the tenant's raw TCP listener (mitmproxy terminates it with the project's CA, which the adapter
verifies), registers with its password, joins, receives a direct message and a message in its channel that names
it, replies in both; a file it attaches becomes Hermes' notice (IRC takes none). Every line passes the proxy as a
TCP flow of the tenant's, inspected: a `PASS` with another tenant's password is a `wrong_key` there (the plant
`irc-key`), the tenant's own is not; a command the stub does not know gets IRC's `421` and is kept."""

from __future__ import annotations

import threading
import time

from harness.capture.proxy import RAW_SCHEMES
from harness.detect.reconcile import read_flows, reconcile
from harness.drive.platforms.base import bot_id
from harness.drive.platforms.irc import IrcStub, configure, lead, parse
from harness.drive.surface import Where
from tests.line_world import world
from tests.platform_adapters import adapter_script

ADAPTER = adapter_script("plugins.platforms.irc.adapter:IRCAdapter", "extra={}", events=2, handler=True, steps="""
    print("connected", flush=True)
    await a._send_raw("WHOIS nobody")  # a command the stub does not know
    await asyncio.wait_for(arrived.wait(), 60)
    for e in got:
        await a.send(e.source.chat_id, "reply to " + e.text)
    doc = await a.send_document(got[0].source.chat_id, os.environ["MEDIA"])
    await a.disconnect()
    print(json.dumps({"ok": ok, "events": [[e.source.user_id, e.source.chat_id, e.source.chat_type, e.text]
                                           for e in got], "doc": doc.success}))
""")

#: The plant's bot: it signs in, sends its unknown command and leaves (no message comes).
SIGN_IN = adapter_script("plugins.platforms.irc.adapter:IRCAdapter", "extra={}", handler=True, steps="""
    await a._send_raw("WHOIS nobody")
    await a.disconnect()
    print(json.dumps({"ok": ok}))
""")


def _env(w, tenant: str, password: str, media: str) -> dict[str, str]:
    t = w.reg[tenant]
    return {**configure(t, Where(f"tcp://127.0.0.1:{w.listener(tenant, 'irc')}")).env,
            "IRC_SERVER_PASSWORD": password, "MEDIA": media}


def test_the_irc_stub_answers_hermes_adapter_through_the_proxy(tmp_path, hermes_python):
    with world(tmp_path, "irc") as w:
        a = w.reg["alpha"]
        stub: IrcStub = w.stubs["alpha"]
        assert stub.url.startswith(RAW_SCHEMES)
        user, channel = a.canaries["irc_user"], a.canaries["irc_channel"]
        media = tmp_path / "report.txt"
        media.write_text("attachment\n")
        env = _env(w, "alpha", a.canaries["irc_key"], str(media))

        def talk() -> None:  # once the bot is on: a direct message from its lead, one in its channel from its user
            deadline = time.monotonic() + 60
            while not stub.connected() and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(1.0)  # its JOIN
            stub.deliver(lead(a), f"dm-{lead(a)}", "hello")
            stub.deliver(user, channel, f"{stub.mention()}hi there", "O")

        threading.Thread(target=talk, daemon=True).start()
        got = w.run(hermes_python, ADAPTER, env)
        ledger = w.stop()
    assert got["ok"] and got["doc"]
    assert got["events"] == [[lead(a), lead(a), "dm", "hello"], [user, f"#{channel}", "group", "hi there"]]
    assert stub.challenges == [a.canaries["irc_key"]] and stub.unknown == ["WHOIS (421)"]
    posts = {(p["channel_id"], p["message"]) for p in stub.posts_since(0.0)}
    assert {(f"dm-{lead(a)}", "reply to hello"), (channel, "reply to hi there")} <= posts
    assert any("Couldn't deliver the file attachment" in m for _, m in posts)  # Hermes' notice: IRC takes no file
    assert not any(r.wrong_key for r in stub.snapshot())
    (line,) = [x for x in ledger if x["tenant"] == "alpha"]  # one connection: one TCP flow, the tenant's
    assert line["method"] == "TCP" and line["service"] == "irc" and not line["flagged"]
    assert line["tcp"]["messages"]["client->server"] >= 5 and "websocket" not in line
    flows, _ = read_flows(w.proxy.flows_path, others=(others := []))
    assert flows == [] and len(others) == 1
    assert b"PASS " + a.canaries["irc_key"].encode() in b"".join(m.content for m in others[0].messages)
    rec = reconcile(w.reg, w.proxy.flows_path)
    assert rec.findings == [] and rec.inspected["tcp"] == 1


def test_a_bot_that_gives_another_tenants_password_is_a_wrong_key_at_the_proxy(tmp_path, hermes_python):
    """The plant `irc-key`: default's password in alpha's profile; alpha's own (the test above) is the near miss."""
    with world(tmp_path, "irc") as w:
        theirs = w.reg["default"].canaries["irc_key"]
        got = w.run(hermes_python, SIGN_IN, _env(w, "alpha", theirs, ""))
        ledger = w.stop()
    assert got["ok"]
    (line,) = [x for x in ledger if x["tenant"] == "alpha"]
    assert line["flagged"] and {(f["kind"], f["victim"], f["seen_in"], f["canary"], f["service"])
                                for f in line["findings"]} == {("wrong_key", "default", "alpha", "irc_key", "irc")}
    assert w.stubs["alpha"].challenges == [theirs] and any(r.wrong_key for r in w.stubs["alpha"].snapshot())
    rec = reconcile(w.reg, w.proxy.flows_path)
    assert {(f.kind, f.victim, f.seen_in, f.canary) for f in rec.findings} == {
        ("wrong_key", "default", "alpha", "irc_key")}


def test_lines_parse_as_irc_does():
    assert parse(":nick!u@h PRIVMSG #chan :hello: there :x") == ("PRIVMSG", ["#chan", "hello: there :x"])
    assert parse("nick botalpha") == ("NICK", ["botalpha"])
    assert parse("") == ("", [])
    assert bot_id("alpha") == "botalpha"

"""The mail stub answers Hermes' own email adapter (run in the Hermes venv) through a real mitmdump: IMAP over the
TLS mitmproxy terminates on the tenant's raw TCP listener, SMTP through the stub's STARTTLS front (the adapter
verifies its certificate against the project's CA) relayed in clear through the same listener. The bot's connection
test signs in, a mail from the tenant's user reaches it, its reply and an attachment arrive as a post with a file.
Every connection is a TCP flow of the tenant's, inspected in clear: another tenant's password in the `LOGIN` line
and in the `AUTH PLAIN` line (base64) is a `wrong_key` there (the plant `email-key`), the tenant's own is not, and
another tenant's file in a mail's attachment is a `request_leak`; a command the stub does not know gets IMAP's `BAD`
or SMTP's `502` and is kept."""

from __future__ import annotations

import imaplib
import smtplib
import socket
import threading
import time

import pytest

from harness.capture.stubs.lines import tls_context
from harness.detect.reconcile import reconcile
from harness.drive.platforms.email import EmailStub, address, bot_address, configure, imap_args, in_set, lead
from harness.drive.surface import Where
from tests.line_world import World, world
from tests.platform_adapters import adapter_script

ADAPTER = adapter_script("plugins.platforms.email.adapter:EmailAdapter", "extra={}", handler=True, steps="""
    if os.environ.get("WAIT") == "1":
        await asyncio.wait_for(arrived.wait(), 60)
        e = got[0]
        sent = await a.send(e.source.chat_id, "reply to " + e.text, reply_to=e.message_id)
        doc = await a.send_document(e.source.chat_id, os.environ["MEDIA"])
    await a.disconnect()
    print(json.dumps({"ok": ok, "events": [[e.source.user_id, e.source.chat_type, e.text] for e in got],
                      "sent": bool(got) and sent.success and doc.success}))
""")


def _env(w: World, tenant: str, password: str, media: str, wait: bool) -> dict[str, str]:
    stub: EmailStub = w.stubs[tenant]
    where = Where(f"tcp://127.0.0.1:{w.listener(tenant, 'email')}", direct=stub.direct)
    return {**configure(w.reg[tenant], where).env, "EMAIL_PASSWORD": password, "EMAIL_POLL_INTERVAL": "1",
            "MEDIA": media, "WAIT": "1" if wait else "0"}


def _short(findings: list[dict]) -> set[tuple]:
    return {(f["kind"], f["victim"], f["seen_in"], f["canary"], f["service"]) for f in findings}


def test_the_mail_stub_answers_hermes_adapter_through_the_proxy(tmp_path, hermes_python):
    with world(tmp_path, "email") as w:
        a, d = w.reg["alpha"], w.reg["default"]
        stub: EmailStub = w.stubs["alpha"]
        user, home = a.canaries["email_user"], a.canaries["email_channel"]
        media = tmp_path / "report.txt"
        media.write_bytes(f"attachment {d.canaries['email_file']}\n".encode())  # default's file, through alpha's bot

        def mail() -> None:  # once the bot's connection test is done: a mail from its user
            deadline = time.monotonic() + 60
            while not stub.connected() and time.monotonic() < deadline:
                time.sleep(0.1)
            stub.deliver(user, home, f"hello {a.canaries['email_post']}")

        threading.Thread(target=mail, daemon=True).start()
        got = w.run(hermes_python, ADAPTER, _env(w, "alpha", a.canaries["email_key"], str(media), True))
        ledger = w.stop()
    text = f"[Subject: Hello]\n\nhello {a.canaries['email_post']}"
    assert got == {"ok": True, "events": [[address(user), "dm", text]], "sent": True}
    assert stub.challenges == [a.canaries["email_key"]] and stub.unknown == []
    bot = bot_address(a)
    assert {(x["protocol"], x["user"]) for x in stub.logins} == {("imap", bot), ("smtp", bot)}
    reply, attached = stub.posts_in(home)  # the reply answers the user's mail: its conversation
    assert reply["message"].startswith("reply to") and reply["token"] == a.canaries["email_key"]
    (upload,) = stub.files_since(0.0)
    assert upload["data"] == media.read_bytes() and attached["file_ids"] == [upload["id"]]
    assert not any(r.wrong_key for r in stub.snapshot()) and all(r.peer for r in stub.snapshot())
    mine = [x for x in ledger if x["tenant"] == "alpha"]
    assert {x["method"] for x in mine} == {"TCP"} and all("tcp" in x for x in mine)
    # every flow in clear: alpha's own password is no finding; default's file in the attachment (base64) is one
    assert _short([f for x in mine for f in x["findings"]]) == {
        ("request_leak", "default", "alpha", "email_file", "email")}
    rec = reconcile(w.reg, w.proxy.flows_path)
    assert {(f.kind, f.victim, f.seen_in, f.canary) for f in rec.findings} == {
        ("request_leak", "default", "alpha", "email_file")}
    assert rec.inspected["tcp"] == len(mine) >= 4  # connection test (IMAP, SMTP), a poll that fetched, two sends


def test_a_bot_that_logs_in_with_another_tenants_password_is_a_wrong_key_at_the_proxy(tmp_path, hermes_python):
    """The plant `email-key`: default's password in alpha's profile (IMAP `LOGIN` and SMTP `AUTH PLAIN`)."""
    with world(tmp_path, "email") as w:
        theirs = w.reg["default"].canaries["email_key"]
        got = w.run(hermes_python, ADAPTER, _env(w, "alpha", theirs, "", False))
        ledger = w.stop()
    assert got["ok"]
    lines = [x for x in ledger if x["tenant"] == "alpha"]
    assert {tuple(sorted(x["tcp"]["messages"].items())) for x in lines}  # an IMAP and an SMTP connection at least
    assert all(_short(x["findings"]) == {("wrong_key", "default", "alpha", "email_key", "email")} for x in lines), lines
    assert w.stubs["alpha"].challenges == [theirs]
    assert sum(r.wrong_key for r in w.stubs["alpha"].snapshot()) == 2  # the LOGIN and the AUTH


def test_commands_the_stub_does_not_know_get_the_protocols_errors_and_are_kept(tmp_path):
    with world(tmp_path, "email") as w:
        a = w.reg["alpha"]
        stub: EmailStub = w.stubs["alpha"]
        imap = imaplib.IMAP4_SSL("127.0.0.1", w.listener("alpha", "email"), timeout=30)  # TLS at the proxy
        imap.login(bot_address(a), a.canaries["email_key"])
        with pytest.raises(imaplib.IMAP4.error, match="unknown command"):
            imap.xatom("XLIST", '"" "*"')
        imap.logout()
        host, port = stub.direct.removeprefix("tcp://").split(":")
        with smtplib.SMTP(host, int(port), timeout=30) as smtp:
            smtp.starttls(context=_client_context(w))
            assert smtp.docmd("VRFY", "someone")[0] == 502
            smtp.login(bot_address(a), a.canaries["email_key"])
        w.stop()
    assert stub.unknown == ["IMAP XLIST", "SMTP VRFY"]


def _client_context(w: World):
    import ssl
    return ssl.create_default_context(cafile=w.proxy.child_env()["SSL_CERT_FILE"])


def test_the_front_presents_a_leaf_of_the_projects_ca_for_loopback(tmp_path):
    context = tls_context()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        threading.Thread(target=lambda: context.wrap_socket(server.accept()[0], server_side=True).close(),
                         daemon=True).start()
        import ssl

        from harness.capture.proxy import CERTS
        client = ssl.create_default_context(cafile=str(CERTS / "mitmproxy-ca-cert.pem"))
        with socket.create_connection(("127.0.0.1", port)) as raw, client.wrap_socket(raw, server_hostname="127.0.0.1"):
            pass  # verified: the project's CA, an IP address SAN


def test_imap_arguments_and_sequence_sets():
    assert imap_args('me@x.test "pa\\"ss"') == ["me@x.test", 'pa"ss']
    assert in_set(3, "1:*") and in_set(5, "2,5:*") and not in_set(3, "4") and not in_set(3, "x")
    assert address("Lead-Alpha-abc") == "lead-alpha-abc@users.test"
    assert lead.__doc__

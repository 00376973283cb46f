"""The Slack stub answers Hermes' own Slack adapter (slack-bolt and slack-sdk, run in the Hermes venv) through the
real proxy: the bot signs in at `slack.com` with its tokens (the proxy tells the tenants apart by them) and opens
its Socket Mode websocket on the URL the stub issued, receives a direct message, replies and uploads a file, every
flow its tenant's and clean (the near miss). With another tenant's app token (the `slack-app` plant) its websocket
opens in that tenant's workspace, and the message it takes there makes it name that tenant's user to its own
workspace: a `wrong_identity`. The stub answers in Slack's own shapes and records what it does not know."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from harness.detect.checks import RawRequest
from harness.detect.engine.matcher import matcher_for
from harness.detect.flows import Route, inspect_request
from harness.drive.platforms.base import media_text
from harness.drive.platforms.slack import HOST, SlackStub
from harness.drive.surface import issued_host
from harness.session import AuditSession, Setup, tenant_names
from tests.platform_adapters import adapter_script, media_file, registry, run

ADAPTER = adapter_script("plugins.platforms.slack.adapter:SlackAdapter", 'token=os.environ["SLACK_BOT_TOKEN"]')


def _adapter(session: AuditSession, hermes_python: Path, bot: str, app: str, media: Path) -> dict[str, Any]:
    """Hermes' Slack adapter with these tokens, given the environment every Hermes child gets (the proxy)."""
    assert session.proxy is not None
    env = {**session.proxy.child_env(), "SLACK_BOT_TOKEN": bot, "SLACK_APP_TOKEN": app}
    return run(hermes_python, ADAPTER, session.sandbox.home, {"FILE": str(media)}, env, timeout=120).out


def _ledger(session: AuditSession, sockets: int = 0) -> list[dict[str, Any]]:
    """The ledger's lines, once it holds those of `sockets` websockets (written when a connection ends)."""
    assert session.proxy is not None
    for _ in range(100):
        lines = [json.loads(line) for line in session.proxy.ledger_path.read_text().splitlines()]
        if sum(1 for x in lines if x.get("websocket")) >= sockets:
            break
        time.sleep(0.1)
    return lines


def test_hermes_slack_adapter_signs_in_receives_replies_and_uploads_through_the_proxy(tmp_path, hermes_python):
    with AuditSession(tmp_path / "evidence", tenant_names(2), setup=Setup(service_names=["slack"])) as session:
        session.open()
        reg = session.require_registry()
        d, a = reg["default"], reg["alpha"]
        mine: SlackStub = session.service_stubs[("alpha", "slack")]  # type: ignore[assignment]
        theirs: SlackStub = session.service_stubs[("default", "slack")]  # type: ignore[assignment]
        media = media_file(session.sandbox.home, media_text(a.canaries["slack_file"])
                           + bytes(range(256)))  # every byte value, verbatim
        mine.deliver(a.canaries["slack_user"], "dm-alpha", "hello", "D")
        got = _adapter(session, hermes_python, a.canaries["slack_bot_key"], a.canaries["slack_app_key"], media)
        clean = _ledger(session, sockets=1)

        # the plant: default's app token, alpha's own bot token
        theirs.deliver(d.canaries["slack_user"], "dm-default", "hi", "D")
        planted = _adapter(session, hermes_python, a.canaries["slack_bot_key"], d.canaries["slack_app_key"], media)
        session.finish()

    assert got == {"ok": True, "user": a.canaries["slack_user"], "chat": "dm-alpha", "text": "hello", "sent": True,
                   "doc": True}
    assert mine.challenges == [a.canaries["slack_app_key"]] and len(mine.acks) == 1  # one websocket, one ack
    reply, shared = mine.posts_in("dm-alpha")
    assert reply["message"] == "reply to hello" and reply["token"] == a.canaries["slack_bot_key"]
    upload = mine.files[0]  # (the planted run uploads too)
    assert upload["data"] == media.read_bytes() and (upload["name"], upload["channel_id"]) == ("report.txt", "dm-alpha")
    assert upload["token"] == a.canaries["slack_bot_key"] and shared["file_ids"] == [upload["id"]]
    assert not mine.unknown and not any(r.wrong_key for r in mine.snapshot())
    # the near miss: every flow alpha's (its tokens at slack.com, its issued URLs at its own host), none flagged
    assert {(x["tenant"], x["service"], x["host"]) for x in clean} == {
        ("alpha", "slack", HOST), ("alpha", "slack_issued", issued_host("slack", "alpha"))}
    assert not [f for x in clean for f in x["findings"]], clean
    assert {x["bearer"] for x in clean if x["service"] == "slack"} == {"own"}  # the bot token and the app token
    [socket] = [x for x in clean if x.get("websocket")]
    assert socket["websocket"]["messages"] == {"client->server": 1, "server->client": 2}  # an ack; hello, the event

    assert planted["user"] == d.canaries["slack_user"] and planted["chat"] == "dm-default"
    assert theirs.challenges == [d.canaries["slack_app_key"]]  # alpha's bot signed in in default's workspace
    assert mine.challenges == [a.canaries["slack_app_key"]] and theirs.posts == []  # ... and replied at its own
    crossed = [(f["kind"], f["victim"], f["seen_in"], f["canary"], x["service"])
               for x in _ledger(session, sockets=2)[len(clean):] for f in x["findings"]]
    assert ("wrong_identity", "default", "alpha", "slack_user", "slack") in crossed, crossed


def test_slack_canaries_have_slacks_shapes_and_the_service_its_routes(tmp_path):
    a = registry(tmp_path, ["slack"])["alpha"]
    assert a.canaries["slack_bot_key"].startswith("xoxb-") and a.canaries["slack_app_key"].startswith("xapp-1-")
    assert a.canaries["slack_user"].startswith("U") and a.canaries["slack_channel"].startswith("C")
    assert a.services["slack"].route == {"host": HOST, "by": ["slack_bot_key", "slack_app_key"]}
    assert a.services["slack_issued"].route == {"host": issued_host("slack", "alpha")}
    assert a.services["slack_issued"].credential is None
    assert a.credentials("slack") == (a.canaries["slack_bot_key"], a.canaries["slack_app_key"])


def _inspect(reg, host: str, method: str, path: str, token: str = "", body: bytes = b"") -> list[tuple]:
    headers = [("Authorization", f"Bearer {token}")] if token else []
    if body.startswith(b"token="):
        headers.append(("Content-Type", "application/x-www-form-urlencoded"))
    report = inspect_request(reg, matcher_for(reg), Route("forward", host=host),
                             RawRequest("f1", method, path, headers, body))
    return [(report.tenant, report.bearer)] + [(f.kind, f.victim, f.seen_in, f.canary, f.service)
                                               for f in report.findings]


def test_each_token_claims_its_tenant_and_the_other_tenants_ids_there_are_crossings(tmp_path):
    reg = registry(tmp_path, ["slack"])
    d, a = reg["default"], reg["alpha"]
    # the app token is one of alpha's own credentials at slack.com (not a `wrong_key`): the near miss of another of
    # its secrets presented there (its provider key, the request claimed by its bot token in the form body)
    assert _inspect(reg, HOST, "POST", "/api/apps.connections.open", a.canaries["slack_app_key"]) == [("alpha", "own")]
    assert _inspect(reg, HOST, "POST", "/api/auth.test", a.key, f"token={a.canaries['slack_bot_key']}".encode()) == [
        ("alpha", "misused"), ("wrong_key", "alpha", "alpha", "key", "slack")]
    assert _inspect(reg, HOST, "POST", "/api/auth.test", d.canaries["slack_bot_key"]) == [("default", "own")]
    assert _inspect(reg, HOST, "GET", f"/api/users.info?user={a.canaries['slack_user']}",
                    a.canaries["slack_bot_key"]) == [("alpha", "own")]
    assert _inspect(reg, HOST, "GET", f"/api/users.info?user={d.canaries['slack_user']}",
                    a.canaries["slack_bot_key"]) == [
        ("alpha", "own"), ("wrong_identity", "default", "alpha", "slack_user", "slack")]
    # an upload to alpha's own host carries no token (none is needed there); another tenant's file in it is a leak
    own_host = issued_host("slack", "alpha")
    assert _inspect(reg, own_host, "POST", "/upload/v1/t", body=media_text(a.canaries["slack_file"])) == [
        ("alpha", "none")]
    assert _inspect(reg, own_host, "POST", "/upload/v1/t", body=media_text(d.canaries["slack_file"])) == [
        ("alpha", "none"), ("request_leak", "default", "alpha", "slack_file", "slack_issued")]


def _call(stub: SlackStub, path: str, token: str = "", body: bytes = b"", method: str = "POST") -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if body.startswith(b"{"):
        headers["Content-Type"] = "application/json;charset=utf-8"
    req = urllib.request.Request(stub.url + path, data=body or None, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_stub_answers_in_slacks_error_shapes_and_records_what_it_does_not_know(tmp_path):
    reg = registry(tmp_path, ["slack"])
    d, a = reg["default"], reg["alpha"]
    stub = SlackStub(a).start()
    try:
        bot, app = a.canaries["slack_bot_key"], a.canaries["slack_app_key"]
        assert _call(stub, "/api/auth.test", bot)[1]["user_id"] == "botalpha"
        assert _call(stub, "/api/auth.test") == (200, {"ok": False, "error": "not_authed"})
        assert _call(stub, "/api/auth.test", d.canaries["slack_bot_key"]) == (200, {"ok": False,
                                                                                   "error": "invalid_auth"})
        assert _call(stub, "/api/auth.test", app) == (200, {"ok": False, "error": "invalid_auth"})  # a bot method
        assert _call(stub, "/api/apps.connections.open", bot)[1]["error"] == "invalid_auth"  # the app's
        url = _call(stub, "/api/apps.connections.open", app)[1]["url"]
        assert url.startswith(f"wss://{issued_host('slack', 'alpha')}/link/?ticket=")
        assert _call(stub, "/api/bots.info", bot) == (200, {"ok": False, "error": "unknown_method"})
        assert _call(stub, "/v2/anything", bot) == (404, {"ok": False, "error": "unknown_method"})
        assert _call(stub, "/upload/v1/not-issued", body=b"x") == (404, {"ok": False, "error": "invalid_upload_url"})
        assert stub.unknown == ["bots.info", "POST /v2/anything"]
        assert [r.wrong_key for r in stub.snapshot()] == [False, False, True, False, False, False, False, False, False]
        posted = _call(stub, "/api/chat.postMessage", bot, json.dumps({"channel": "C1", "text": "hi"}).encode())[1]
        assert posted["ok"] and stub.posts_in("C1")[0]["message"] == "hi"
        edit = {"channel": "C1", "ts": posted["ts"], "text": "edited"}
        assert _call(stub, "/api/chat.update", bot, json.dumps(edit).encode())[1]["ok"]
        assert stub.posts_in("C1")[0]["message"] == "edited"
    finally:
        stub.stop()

"""The Mattermost stub answers Hermes' own Mattermost adapter (run in the Hermes venv against it): the bot
authenticates with its token, receives a direct message over the websocket, posts its reply and uploads a file
(`MEDIA:` delivery). An upload's multipart body is scanned as any request body: another tenant's file there is a
`request_leak` at the service, the tenant's own is not."""

from __future__ import annotations

from harness.capture.stubs.provider import answer_for
from harness.detect.checks import RawRequest
from harness.detect.engine.matcher import matcher_for
from harness.detect.flows import Route, inspect_request
from harness.drive import doors
from harness.drive.platforms.mattermost import MattermostStub, bot_id, media_text, multipart
from tests.platform_adapters import adapter_script, media_file, registry, run

ADAPTER = adapter_script("plugins.platforms.mattermost.adapter:MattermostAdapter", 'token=TOKEN, extra={"url": URL}')


def test_the_mattermost_stub_answers_hermes_adapter(tmp_path, hermes_python):
    a = registry(tmp_path, ["mattermost"])["alpha"]
    stub = MattermostStub(a).start()
    user, channel = a.canaries["mattermost_user"], a.canaries["mattermost_channel"]
    stub.deliver(user, channel, "hello")
    home = tmp_path / "home"
    media = media_file(home, media_text(a.canaries["mattermost_file"])
                       + bytes(range(256)))  # every byte value, verbatim
    try:
        got = run(hermes_python, ADAPTER, home, {"TOKEN": a.canaries["mattermost_key"], "URL": stub.url,
                                                 "FILE": str(media)}, timeout=60).out
    finally:
        stub.stop()
    assert got == {"ok": True, "user": user, "chat": channel, "text": "hello", "sent": True, "doc": True}
    assert stub.challenges == [a.canaries["mattermost_key"]]
    post, attached = stub.posts_in(channel)
    assert post["message"] == "reply to hello" and post["token"] == a.canaries["mattermost_key"]
    assert bot_id("alpha") in post["id"] and not any(r.wrong_key for r in stub.snapshot())
    [upload] = stub.files_since(0.0)
    assert upload["data"] == media.read_bytes() and upload["name"] == "report.txt"
    assert upload["channel_id"] == channel and upload["token"] == a.canaries["mattermost_key"]
    assert attached["file_ids"] == [upload["id"]] and attached["token"] == a.canaries["mattermost_key"]


BOUNDARY = "b0undary"


def _form(data: bytes, name: str = "tenancy-media.txt") -> bytes:
    """A multipart body as aiohttp's FormData writes Hermes' upload: the channel, then the file."""
    return (f"--{BOUNDARY}\r\ncontent-disposition: form-data; name=\"channel_id\"\r\n\r\nchan\r\n"
            f"--{BOUNDARY}\r\ncontent-type: text/plain\r\ncontent-disposition: form-data; name=\"files\"; "
            f"filename=\"{name}\"\r\n\r\n").encode() + data + f"\r\n--{BOUNDARY}--\r\n".encode()


def test_a_multipart_body_gives_its_fields_and_its_files_byte_for_byte():
    data = bytes(range(256)) + b"\r\n--not-the-boundary\r\n"
    fields, parts = multipart(f"multipart/form-data; boundary={BOUNDARY}", _form(data))
    assert fields == {"channel_id": "chan"} and parts == [("tenancy-media.txt", data)]
    assert multipart("application/json", b"{}") == ({}, [])


def _upload(reg, tenant: str, data: bytes, token: str = ""):
    port = reg[tenant].services["mattermost"].listen
    headers = [("Authorization", f"Bearer {token or reg[tenant].canaries['mattermost_key']}"),
               ("Content-Type", f"multipart/form-data; boundary={BOUNDARY}")]
    return inspect_request(reg, matcher_for(reg), Route("reverse", listen_port=port),
                           RawRequest("f1", "POST", "/api/v4/files", headers, _form(data)))


def test_another_tenants_file_in_an_upload_is_a_request_leak_and_the_tenants_own_is_not(tmp_path):
    reg = registry(tmp_path, ["mattermost"])
    theirs = _upload(reg, "alpha", media_text(reg["default"].canaries["mattermost_file"]))
    assert [(f.kind, f.victim, f.seen_in, f.canary, f.service) for f in theirs.findings] == [
        ("request_leak", "default", "alpha", "mattermost_file", "mattermost")]
    assert _upload(reg, "alpha", media_text(reg["alpha"].canaries["mattermost_file"])).findings == []  # near miss


def test_an_upload_through_another_tenants_bot_is_a_wrong_key_at_the_service(tmp_path):
    reg = registry(tmp_path, ["mattermost"])
    own = media_text(reg["alpha"].canaries["mattermost_file"])
    report = _upload(reg, "alpha", own, token=reg["default"].canaries["mattermost_key"])
    assert [(f.kind, f.victim, f.seen_in, f.canary, f.service) for f in report.findings] == [
        ("wrong_key", "default", "alpha", "mattermost_key", "mattermost")]


def test_a_reply_ends_with_the_lines_it_is_told_to_say(tmp_path):
    a = registry(tmp_path, ["mattermost"])["alpha"]
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function",
                                                                       "function": {"name": "other"}}]}
    assert answer_for(a, body)["content"] == "probe done for tenant alpha"
    assert answer_for(a, body, tail="MEDIA:~/x.txt")["content"] == "probe done for tenant alpha\nMEDIA:~/x.txt"


def test_messaging_platforms_are_driven_where_the_messaging_phase_ran():
    assert doors.door_states("gateway", ["route-auth", "messaging"])["messaging platforms"] == "phase messaging"
    assert doors.door_states("gateway", ["route-auth"])["messaging platforms"] == (
        "not driven: --platforms <a messaging platform>")
    assert doors.door_states("tui", ["messaging"])["messaging platforms"] == (
        "not driven: --platforms <a messaging platform> (with --scenario gateway or all)")

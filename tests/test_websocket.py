"""Websocket messages checked as HTTP bodies are (`harness.detect.websocket`), live in the addon (`websocket_message`,
`websocket_end`) and again from a saved flow file (`reconcile`): a canary planted in a message, cut over two
messages (raw, or in two JSON messages' strings), compressed across messages; and the near misses (one character
changed, one short, the tenant's own canary on its own connection)."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest
from mitmproxy import http, io
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import taddons, tflow
from mitmproxy.websocket import WebSocketData, WebSocketMessage
from wsproto.frame_protocol import Opcode

from harness.capture.addon import Tenancy
from harness.core.registry import Registry
from harness.detect.engine.matcher import matcher_for
from harness.detect.flows import inspect_flow
from harness.detect.reconcile import reconcile
from harness.detect.websocket import CLIENT, SERVER, Message, WebsocketScan
from tests.registries import with_service

PORTS = {"alpha": 18101, "beta": 18102}


@pytest.fixture
def reg(tmp_path: Path) -> Registry:
    """alpha and beta behind reverse listeners; each with a `chat` service (credential `chat_key`, identity
    `chat_user`) on a listener of its own."""
    return with_service(tmp_path, PORTS, "chat", "http")


def scan(reg: Registry, messages: list[tuple[bool, bytes]], *, tenant: str = "alpha", service: str = "chat",
         limit: int | None = None) -> tuple[list[list[tuple]], list[tuple]]:
    """Feed `messages` (from_client, content) to a scan of `tenant`'s connection: what each message added, then
    every finding of the finished scan, as (kind, victim, seen_in, canary, channel)."""
    kw = {"limit": limit} if limit else {}
    ws = WebsocketScan(matcher_for(reg), "f1", reg[tenant], service, **kw)
    fed = [[_short(f) for f in ws.feed(Message(c, m))] for c, m in messages]
    report = ws.finish()
    return fed, [_short(f) for f in report.findings]


def _short(f) -> tuple:
    return f.kind, f.victim, f.seen_in, f.canary, f.channel


def cut(value: str, at: int) -> tuple[bytes, bytes]:
    return value[:at].encode(), value[at:].encode()


# --- the scan of a connection --------------------------------------------------------------------------------------


def test_a_canary_in_a_message_is_a_leak_by_direction(reg):
    soul = reg["beta"].canaries["soul"]
    fed, found = scan(reg, [(True, f"say {soul}".encode()), (False, json.dumps({"text": soul}).encode())])
    assert fed == [[("request_leak", "beta", "alpha", "soul", "request")],
                   [("response_leak", "beta", "alpha", "soul", "response")]]
    assert found == [f[0] for f in fed]
    ws = WebsocketScan(matcher_for(reg), "f1", reg["alpha"], "chat")
    (finding,) = ws.feed(Message(True, f"say {soul}".encode()))
    assert finding.location == f"flow:f1:websocket.{CLIENT}@4" and finding.service == "chat"
    assert "<beta:soul>" in finding.evidence and soul not in finding.evidence


def test_near_misses_are_not_leaks(reg):
    soul, own = reg["beta"].canaries["soul"], reg["alpha"].canaries["soul"]
    changed = soul[:-1] + ("0" if soul[-1] != "0" else "1")
    fed, found = scan(reg, [(True, changed.encode()), (True, b" " + soul[:-1].encode() + b" "),
                            (False, own.encode()), (True, reg["alpha"].canaries["chat_key"].encode())])
    assert fed == [[], [], [], []] and found == []


def test_a_canary_cut_over_two_messages_is_found_in_the_second(reg):
    first, second = cut(reg["beta"].canaries["memory"], 9)
    fed, found = scan(reg, [(True, b"x" * 100 + first), (False, b"unrelated"), (True, second + b"y")])
    assert fed == [[], [], [("request_leak", "beta", "alpha", "memory", "request")]]
    assert found == fed[2]
    ws = WebsocketScan(matcher_for(reg), "f1", reg["alpha"], "chat")
    ws.feed(Message(True, b"x" * 100 + first))
    (finding,) = ws.feed(Message(True, second))
    assert finding.location == f"flow:f1:websocket.{CLIENT}@100"  # where it starts in the direction's stream


def test_a_cut_canary_with_a_character_lost_between_the_messages_is_not(reg):
    memory = reg["beta"].canaries["memory"]
    fed, found = scan(reg, [(True, memory[:9].encode()), (True, memory[10:].encode())])
    assert fed == [[], []] and found == []


def test_the_two_directions_are_two_streams(reg):
    """Halves of one canary sent one each way are not a canary either direction carried."""
    first, second = cut(reg["beta"].canaries["memory"], 9)
    assert scan(reg, [(True, first), (False, second)]) == ([[], []], [])


def test_a_value_sent_in_two_json_messages_is_whole_in_their_strings(reg):
    first, second = cut(reg["beta"].canaries["cron_prompt"], 12)
    messages = [(False, json.dumps({"type": "message", "text": part.decode()}).encode()) for part in (first, second)]
    fed, found = scan(reg, messages)
    assert fed == [[], []]  # in neither message, nor in the raw stream (JSON between the halves)
    assert found == [("response_leak", "beta", "alpha", "cron_prompt", "response")]
    ws = WebsocketScan(matcher_for(reg), "f1", reg["alpha"], "chat")
    for c, m in messages:
        ws.feed(Message(c, m))
    (finding,) = ws.finish().findings
    assert finding.location == f"flow:f1:websocket.{SERVER}.json.text@0"


def test_a_compressed_stream_cut_over_binary_messages_is_read_whole(reg):
    """An application's own compression over the connection (Discord's `zlib-stream`: one zlib stream, each
    message flushed): the stream is only readable whole."""
    z = zlib.compressobj()
    payload = json.dumps({"op": 0, "d": {"content": reg["beta"].canaries["memory"]}}).encode()
    chunks = [z.compress(part) + z.flush(zlib.Z_SYNC_FLUSH) for part in (payload[:30], payload[30:])]
    fed, found = scan(reg, [(False, chunk) for chunk in chunks])
    assert fed == [[], []] and found == [("response_leak", "beta", "alpha", "memory", "response")]
    ws = WebsocketScan(matcher_for(reg), "f1", reg["alpha"], "chat")
    for chunk in chunks:
        ws.feed(Message(False, chunk))
    assert ws.finish().findings[0].encoding == "zlib"
    near = json.dumps({"op": 0, "d": {"content": reg["alpha"].canaries["memory"]}}).encode()  # alpha's own
    assert scan(reg, [(False, zlib.compress(near))]) == ([[]], [])


def test_another_tenants_credential_or_identity_sent_up_the_connection(reg):
    """Client->server, another tenant's credential for the connection's service is a `wrong_key` (the connection
    presents it) and its identity there a `wrong_identity`; sent down, either is a response leak."""
    key, user = reg["beta"].canaries["chat_key"], reg["beta"].canaries["chat_user"]
    identify = json.dumps({"op": 2, "d": {"token": key, "user": user}}).encode()
    _, found = scan(reg, [(True, identify), (False, identify)])
    assert found == [("wrong_key", "beta", "alpha", "chat_key", "request"),
                     ("wrong_identity", "beta", "alpha", "chat_user", "request"),
                     ("response_leak", "beta", "alpha", "chat_key", "response"),
                     ("response_leak", "beta", "alpha", "chat_user", "response")]
    _, provider = scan(reg, [(True, identify)], service="provider")  # not the provider's credential: a leak
    assert [f[0] for f in provider] == ["request_leak", "request_leak"]


def test_a_stream_past_its_cap_is_not_inspected_never_clean(reg):
    soul = reg["beta"].canaries["soul"].encode()
    ws = WebsocketScan(matcher_for(reg), "f1", reg["alpha"], "chat", limit=64)
    assert ws.feed(Message(True, b"a" * 60)) == [] and ws.feed(Message(True, b"b" * 10 + soul)) == []
    report = ws.finish()
    assert report.findings == [] and report.messages == {CLIENT: 2, SERVER: 0}
    assert report.sizes[CLIENT] == 70 + len(soul)
    (skipped,) = report.not_inspected
    assert skipped.partial and skipped.bytes_read == 64 and skipped.path == f"flow:f1:websocket.{CLIENT}"
    assert "websocket stream cap (64 bytes" in skipped.reason


# --- live in the addon, and again from the saved flow file ------------------------------------------------------


def upgrade(addon: Tenancy, tenant: str, service_port: int | None = None) -> http.HTTPFlow:
    """A websocket upgrade on `tenant`'s listener (or a service's) through the addon's request and response
    hooks, before any message."""
    f = tflow.twebsocketflow()
    port = service_port or PORTS[tenant]
    f.client_conn.proxy_mode = ProxyMode.parse(f"reverse:http://127.0.0.1:{port + 1000}@{port}")
    response, f.response, f.websocket = f.response, None, None
    addon.request(f)
    f.response, f.websocket = response, WebSocketData()
    addon.response(f)
    return f


def send(addon: Tenancy, f: http.HTTPFlow, from_client: bool, content: bytes | str) -> None:
    text = isinstance(content, str)
    data = content.encode() if text else content
    f.websocket.messages.append(WebSocketMessage(Opcode.TEXT if text else Opcode.BINARY, from_client, data))
    addon.websocket_message(f)


@pytest.fixture
def live(reg: Registry, tmp_path: Path):
    path = tmp_path / "registry.yaml"
    reg.save(path)
    addon = Tenancy()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, tenancy_registry=str(path), tenancy_ledger=str(tmp_path / "ledger.jsonl"))
        yield addon


def ledger(tmp_path: Path) -> list[dict]:
    path = tmp_path / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_addon_flags_a_message_as_it_passes_and_records_the_connection_when_it_ends(live, reg, tmp_path):
    f = upgrade(live, "alpha", PORTS["alpha"] + 50)  # alpha's chat service
    assert ledger(tmp_path) == [] and not f.marked  # the upgrade is recorded with its messages, at the end
    memory = reg["beta"].canaries["memory"]
    send(live, f, True, json.dumps({"type": "hello"}))
    assert not f.marked
    send(live, f, True, memory[:10])
    send(live, f, True, memory[10:])  # the second half completes it: flagged at once
    assert f.marked and f.comment.startswith("tenancy: request_leak: beta's memory in alpha's chat request")
    send(live, f, False, json.dumps({"text": reg["alpha"].canaries["memory"]}))  # alpha's own: a near miss
    live.websocket_end(f)
    (line,) = ledger(tmp_path)
    assert line["flow"] == f.id and line["tenant"] == "alpha" and line["service"] == "chat" and line["flagged"]
    assert line["websocket"] == {"messages": {CLIENT: 3, SERVER: 1},
                                 "bytes": {CLIENT: len('{"type": "hello"}') + len(memory),
                                           SERVER: len(json.dumps({"text": reg["alpha"].canaries["memory"]}))}}
    assert [(x["kind"], x["victim"], x["canary"], x["location"]) for x in line["findings"]] == [
        ("request_leak", "beta", "memory", f"flow:{f.id}:websocket.{CLIENT}@17")]
    assert f.metadata["tenancy"]["findings"] == line["findings"]
    matcher = matcher_for(reg)
    assert inspect_flow(reg, matcher, f).ledger_entry() | {"time": line["time"]} == line


def test_reconcile_of_the_saved_flow_file_finds_what_the_addon_found_live(live, reg, tmp_path):
    f = upgrade(live, "beta")
    first, second = cut(reg["alpha"].canaries["soul"], 7)
    for part in (first, second):
        send(live, f, False, json.dumps({"delta": part.decode()}))
    send(live, f, True, reg["alpha"].key.encode())  # alpha's provider key, up beta's provider connection
    live.websocket_end(f)
    flows_path = tmp_path / "flows.mitm"
    with flows_path.open("wb") as fh:
        io.FlowWriter(fh).add(f)
    (line,) = ledger(tmp_path)
    rec = reconcile(reg, flows_path)
    assert [x["fingerprint"] for x in line["findings"]] == [x.fingerprint() for x in rec.findings]
    assert [(x.kind, x.victim, x.seen_in, x.canary, x.channel, x.location) for x in rec.findings] == [
        ("wrong_key", "alpha", "beta", "key", "request", f"flow:{f.id}:websocket.{CLIENT}@0"),
        ("response_leak", "alpha", "beta", "soul", "response", f"flow:{f.id}:websocket.{SERVER}.json.delta@0")]
    assert rec.flows_per_tenant["beta"] == 1 and rec.reasons == []


def test_a_connection_still_open_when_the_proxy_stops_is_recorded_then(live, reg, tmp_path):
    f = upgrade(live, "alpha")
    send(live, f, True, reg["beta"].canaries["soul"])
    live.done()
    (line,) = ledger(tmp_path)
    assert line["flow"] == f.id and [x["kind"] for x in line["findings"]] == ["request_leak"]


def test_a_websocket_on_a_listener_of_no_tenant_is_counted_not_checked(live, reg, tmp_path):
    f = upgrade(live, "alpha", 18999)
    send(live, f, True, reg["beta"].canaries["soul"])
    live.websocket_end(f)
    (line,) = ledger(tmp_path)
    assert line["tenant"] is None and line["findings"] == [] and line["websocket"]["messages"][CLIENT] == 1

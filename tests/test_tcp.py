"""Raw TCP connections on a tenant's reverse listener (a line protocol: IMAP, SMTP, IRC) checked as websocket messages
are, live in the addon (`tcp_start`, `tcp_message`, `tcp_end`) and again from a saved flow file (`reconcile`), for
the tenant whose listener it is: a canary planted in what one side sent, cut over two TCP messages, another
tenant's credential in a `LOGIN` line or base64 in an `AUTH PLAIN` line (`wrong_key`); and the near misses (one
character changed, a character lost at the cut, the tenant's own credential, a listener of no tenant's)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from mitmproxy import io, tcp
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import taddons, tflow

from harness.capture.addon import Tenancy
from harness.capture.proxy import Proxy
from harness.core.procs import ProcessSet
from harness.core.registry import Registry
from harness.detect.engine.matcher import matcher_for
from harness.detect.flows import inspect_tcp_flow
from harness.detect.reconcile import reconcile
from harness.detect.websocket import CLIENT, SERVER
from tests.registries import with_service

PORTS = {"alpha": 18201, "beta": 18202}


@pytest.fixture
def reg(tmp_path: Path) -> Registry:
    """alpha and beta, each with a `mail` service (credential `mail_key`, identity `mail_user`) behind a raw TCP
    listener of its own."""
    return with_service(tmp_path, PORTS, "mail", "tcp")


@pytest.fixture
def live(reg: Registry, tmp_path: Path):
    path = tmp_path / "registry.yaml"
    reg.save(path)
    addon = Tenancy()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, tenancy_registry=str(path), tenancy_ledger=str(tmp_path / "ledger.jsonl"))
        yield addon


def connect(addon: Tenancy, port: int) -> tcp.TCPFlow:
    f = tflow.ttcpflow(messages=[])
    f.client_conn.proxy_mode = ProxyMode.parse(f"reverse:tcp://127.0.0.1:{port + 1000}@{port}")
    addon.tcp_start(f)
    return f


def send(addon: Tenancy, f: tcp.TCPFlow, from_client: bool, data: bytes | str) -> None:
    f.messages.append(tcp.TCPMessage(from_client, data.encode() if isinstance(data, str) else data))
    addon.tcp_message(f)


def ledger(tmp_path: Path) -> list[dict]:
    path = tmp_path / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def short(findings: list) -> list[tuple]:
    return [(f["kind"], f["victim"], f["seen_in"], f["canary"], f["service"]) if isinstance(f, dict) else
            (f.kind, f.victim, f.seen_in, f.canary, f.service) for f in findings]


def test_a_canary_cut_over_two_tcp_messages_is_flagged_when_the_second_completes_it(live, reg, tmp_path):
    f = connect(live, PORTS["alpha"] + 50)  # alpha's mail listener
    send(live, f, False, "* OK ready\r\n")
    soul = reg["beta"].canaries["soul"]
    send(live, f, True, f"a1 APPEND INBOX {{40}}\r\n{soul[:9]}")
    assert not f.marked
    send(live, f, True, f"{soul[9:]}\r\n")
    assert f.marked and f.comment.startswith("tenancy: request_leak: beta's soul in alpha's mail request")
    send(live, f, False, f"* 1 FETCH (BODY {reg['alpha'].canaries['soul']})\r\n")  # alpha's own: a near miss
    live.tcp_end(f)
    (line,) = ledger(tmp_path)
    assert line["tenant"] == "alpha" and line["service"] == "mail" and line["method"] == "TCP" and line["flagged"]
    assert line["tcp"]["messages"] == {CLIENT: 2, SERVER: 2} and "websocket" not in line
    assert [(x["kind"], x["location"]) for x in line["findings"]] == [
        ("request_leak", f"flow:{f.id}:tcp.{CLIENT}@{len('a1 APPEND INBOX {40}') + 2}")]
    assert inspect_tcp_flow(reg, matcher_for(reg), f).ledger_entry() | {"time": line["time"]} == line


def test_near_misses_over_tcp_are_not_leaks(live, reg, tmp_path):
    soul = reg["beta"].canaries["soul"]
    changed = soul[:-1] + ("0" if soul[-1] != "0" else "1")
    f = connect(live, PORTS["alpha"] + 50)
    send(live, f, True, f"x {changed}\r\n")
    send(live, f, True, soul[:9])
    send(live, f, True, soul[10:])  # a character lost at the cut
    send(live, f, True, f"a1 LOGIN me {reg['alpha'].canaries['mail_key']}\r\n")  # its own password
    live.tcp_end(f)
    (line,) = ledger(tmp_path)
    assert line["findings"] == [] and not f.marked


def test_another_tenants_password_in_a_login_or_auth_line_is_a_wrong_key(live, reg, tmp_path):
    theirs = reg["beta"].canaries["mail_key"]
    imap = connect(live, PORTS["alpha"] + 50)
    send(live, imap, True, f'a2 LOGIN bot@x "{theirs}"\r\n')
    live.tcp_end(imap)
    smtp = connect(live, PORTS["alpha"] + 50)
    plain = base64.b64encode(f"\0bot@x\0{theirs}".encode()).decode()
    send(live, smtp, True, f"AUTH PLAIN {plain}\r\n")
    send(live, smtp, True, f"MAIL FROM:<{reg['beta'].canaries['mail_user']}@x>\r\n")  # beta's identity there
    live.tcp_end(smtp)
    first, second = ledger(tmp_path)
    assert short(first["findings"]) == [("wrong_key", "beta", "alpha", "mail_key", "mail")]
    assert first["findings"][0]["detail"] == "the TCP connection presents beta's mail credential"
    assert sorted(short(second["findings"])) == [("wrong_identity", "beta", "alpha", "mail_user", "mail"),
                                                 ("wrong_key", "beta", "alpha", "mail_key", "mail")]
    assert {f["encoding"] for f in second["findings"] if f["kind"] == "wrong_key"} <= {"base64", "base64+plain"}


def test_reconcile_of_saved_tcp_flows_finds_what_the_addon_found_live(live, reg, tmp_path):
    f = connect(live, PORTS["beta"] + 50)
    send(live, f, True, f"PASS {reg['alpha'].canaries['mail_key']}\r\n")
    send(live, f, False, f":srv NOTICE x :{reg['alpha'].canaries['memory']}\r\n")
    f.error = None
    live.tcp_end(f)
    stranger = connect(live, 18999)  # a listener of no tenant: recorded, not checked
    send(live, stranger, True, reg["beta"].canaries["soul"])
    live.tcp_end(stranger)
    path = tmp_path / "flows.mitm"
    with path.open("wb") as fh:
        writer = io.FlowWriter(fh)
        writer.add(f)
        writer.add(stranger)
    lines = ledger(tmp_path)
    assert lines[1]["tenant"] is None and lines[1]["findings"] == []
    rec = reconcile(reg, path, reading=None)
    assert [x["fingerprint"] for x in lines[0]["findings"]] == [x.fingerprint() for x in rec.findings]
    assert short(rec.findings) == [("wrong_key", "alpha", "beta", "mail_key", "mail"),
                                   ("response_leak", "alpha", "beta", "memory", "mail")]
    assert rec.inspected["tcp"] == 1 and rec.reasons == []


def test_a_finding_in_a_tcp_message_is_dated_when_the_message_was_sent(live, reg, tmp_path):
    """A bot's connection opens at the start and carries a reply long after: the reply's canary is dated by its
    message (its order against the crossing that caused it), the near miss by its own earlier message."""
    f = connect(live, PORTS["alpha"] + 50)
    send(live, f, True, f"PASS {reg['beta'].canaries['mail_key']}\r\n")
    send(live, f, True, f"PRIVMSG #x :{reg['beta'].canaries['soul']}\r\n")
    send(live, f, False, f":srv NOTICE x :{reg['beta'].canaries['memory']}\r\n")
    f.timestamp_created = 1000.0
    for message, sent in zip(f.messages, (1001.0, 1050.0, 1060.0), strict=True):
        message.timestamp = sent
    live.tcp_end(f)
    path = tmp_path / "flows.mitm"
    with path.open("wb") as fh:
        io.FlowWriter(fh).add(f)
    times = {x.canary: x.time for x in reconcile(reg, path, reading=None).findings}
    assert times == {"mail_key": 1001.0, "soul": 1050.0, "memory": 1060.0}


def test_a_tcp_connection_still_open_when_the_proxy_stops_is_recorded_then(live, reg, tmp_path):
    f = connect(live, PORTS["alpha"] + 50)
    send(live, f, True, reg["beta"].canaries["soul"])
    live.done()
    (line,) = ledger(tmp_path)
    assert line["flow"] == f.id and short(line["findings"]) == [("request_leak", "beta", "alpha", "soul", "mail")]


def test_a_tcp_service_is_reached_at_a_tcp_url_through_its_listener(reg, tmp_path):
    reg.save(tmp_path / "registry.yaml")
    proxy = Proxy(reg, tmp_path / "registry.yaml", tmp_path, ProcessSet(), listeners=[])
    assert proxy.service_url("alpha", "mail") == f"tcp://127.0.0.1:{PORTS['alpha'] + 50}"
    assert proxy.service_url("alpha", "provider") == f"http://127.0.0.1:{PORTS['alpha']}"
    assert f"reverse:tcp://127.0.0.1:{PORTS['alpha'] + 1050}@127.0.0.1:{PORTS['alpha'] + 50}" in proxy.argv()

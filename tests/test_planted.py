"""The probe's own plants: a `MEDIA:` path a tenant's scripted reply named in its neighbour's home, which Hermes
writes down in that tenant's own log when it refuses it (F31.patch), is not a crossing; the same line anywhere else,
the neighbour's other canaries, another path of that home and a path no reply named stay leaks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mitmproxy import http, io
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import tflow

from harness.core.registry import Registry, mint
from harness.detect import planted
from harness.detect.reconcile import Reading, reconcile

PORTS = {"default": 18401, "alpha": 18402, "beta": 18403}
REFUSED = "WARNING gateway.platforms.base: Skipping unsafe MEDIA directive path: {path}\n"


def registry(root: Path) -> Registry:
    """Three profiles under one HOME: default's home is the Hermes root, the others are `profiles/NAME` in it."""
    hermes = root / "sandbox" / "home-qx5be6a3c81f07" / ".hermes"
    homes = {n: hermes if n == "default" else hermes / "profiles" / n for n in PORTS}
    for home in homes.values():
        (home / "logs").mkdir(parents=True, exist_ok=True)
    return mint(list(PORTS), root / "sandbox" / "work", {n: {"listen": p} for n, p in PORTS.items()}, homes=homes)


def sse(text: str) -> bytes:
    """A streamed completion whose reply is `text`, one delta per line."""
    events = [{"choices": [{"index": 0, "delta": {"content": line + "\n"}}]} for line in text.split("\n")]
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def reply(reg: Registry, tenant: str, text: str, *, streamed: bool = True) -> http.HTTPFlow:
    """A main turn on `tenant`'s provider route whose scripted reply is `text`."""
    port = PORTS[tenant]
    f = tflow.tflow(req=http.Request.make("POST", f"http://127.0.0.1:{port + 1000}/v1/chat/completions",
                                          json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(),
                                          {"content-type": "application/json",
                                           "authorization": f"Bearer {reg[tenant].key}"}), resp=True)
    f.client_conn.proxy_mode = ProxyMode.parse(f"reverse:http://127.0.0.1:{port + 1000}@{port}")
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
    f.response = http.Response.make(200, sse(text) if streamed else json.dumps(body).encode(),
                                    {"content-type": "text/event-stream" if streamed else "application/json"})
    return f


def findings(tmp_path: Path, reg: Registry, flows: list[http.HTTPFlow], logs: dict[str, str]) -> set[tuple]:
    """(victim, seen_in, canary, file) of every finding of a reconciliation: those flows, each tenant's
    `logs/agent.log` holding its text."""
    path = tmp_path / "flows.mitm"
    with path.open("wb") as fh:
        writer = io.FlowWriter(fh)
        for f in flows:
            writer.add(f)
    homes = {t.name: Path(t.home or "") for t in reg}
    for name, text in logs.items():
        (homes[name] / "logs" / "agent.log").write_text(text)
    rec = reconcile(reg, path, homes=homes, reading=Reading(empty_ok=True))
    return {(f.victim, f.seen_in, f.canary, f.location.split("@")[0]) for f in rec.findings}


def media(path: str) -> str:
    return f"probe done for tenant alpha\nMEDIA:{path}"


def test_a_reply_s_media_paths_are_read_from_a_streamed_or_whole_response(tmp_path):
    reg = registry(tmp_path)
    text = media("~/.hermes/tenancy-media.txt") + "\nMEDIA:~/.hermes/.env\nsee MEDIA:~/.hermes/not-a-line.txt"
    assert planted.reply_paths(reply(reg, "alpha", text)) == {"~/.hermes/tenancy-media.txt", "~/.hermes/.env"}
    assert planted.reply_paths(reply(reg, "alpha", text, streamed=False)) == {"~/.hermes/tenancy-media.txt",
                                                                             "~/.hermes/.env"}
    assert planted.reply_paths(reply(reg, "alpha", "probe done")) == set()


def test_a_planted_path_resolves_to_the_home_it_is_in(tmp_path):
    reg = registry(tmp_path)
    assert ("beta", "/tenancy-media.txt") in planted.resolve(["~/.hermes/profiles/beta/tenancy-media.txt"], reg)
    assert planted.resolve(["~/.hermes/tenancy-media.txt"], reg) == {("default", "/tenancy-media.txt")}
    assert planted.resolve(["~/elsewhere/tenancy-media.txt"], reg) == frozenset()


def test_the_refusal_of_a_path_its_own_reply_named_is_the_probe_s_plant(tmp_path):
    """Planted: alpha's reply names default's media file (its neighbour's) and alpha's own log refuses it: not a
    crossing. The control: with no reply naming it, the very same line is one."""
    reg = registry(tmp_path)
    line = REFUSED.format(path=f"{reg['default'].home}/tenancy-media.txt")
    named = [reply(reg, "alpha", media("~/.hermes/tenancy-media.txt")), reply(reg, "beta", "probe done")]
    assert findings(tmp_path, reg, named, {"alpha": line * 3}) == set()
    assert findings(tmp_path, reg, named[1:], {"alpha": line}) == {("default", "alpha", "home", "logs/agent.log")}


@pytest.mark.parametrize(("log", "line", "leak"), [
    # the same line in a third profile's log: beta's reply named nothing of default's
    ("beta", "{default}/tenancy-media.txt", ("default", "beta", "home")),
    # beta's refusal of alpha's file (its reply never named it) in beta's own log
    ("beta", "{alpha}/tenancy-media.txt", ("alpha", "beta", "home")),
    # the launch profile's log holding another profile's refusal (F5's shape): default's reply named nothing of alpha's
    ("default", "{alpha}/tenancy-media.txt", ("alpha", "default", "home")),
    # another path of the neighbour's home in the refusing profile's own log
    ("alpha", "{default}/SOUL.md", ("default", "alpha", "home")),
    # a longer path than the planted one
    ("alpha", "{default}/tenancy-media.txt.bak", ("default", "alpha", "home")),
    # the neighbour's other canary in the planted line itself
    ("alpha", "{default}/tenancy-media.txt {memory}", ("default", "alpha", "memory")),
])
def test_near_misses_of_the_plant_stay_leaks(tmp_path, log, line, leak):
    reg = registry(tmp_path)
    named = [reply(reg, "alpha", media("~/.hermes/tenancy-media.txt")), reply(reg, "beta", "probe done")]
    text = REFUSED.format(path=line.format(default=reg["default"].home, alpha=reg["alpha"].home,
                                           memory=reg["default"].canaries["memory"]))
    assert findings(tmp_path, reg, named, {log: text}) == {(*leak, "logs/agent.log")}

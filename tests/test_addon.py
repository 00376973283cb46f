"""Unit tests of the tenancy addon (harness.capture.addon, and harness.detect.flows under it) with mitmproxy's
test helpers."""

from __future__ import annotations

import asyncio
import base64
import gzip
import importlib.util
import json
import logging
import os
import stat
from pathlib import Path

import pytest
from mitmproxy import exceptions, flowfilter, http, io
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import taddons, tflow

from harness.capture.addon import Tenancy
from harness.core.findings import Finding
from harness.core.protocol import FLOW_HEADER
from harness.core.registry import Registry, mint
from harness.detect import decode, flows
from harness.detect.engine.matcher import Matcher, matcher_for
from harness.detect.routes import Route, route_of

ROOT = Path(__file__).resolve().parent.parent
PORTS = {"alpha": 18001, "beta": 18002}
HOSTS = {"gamma": "gamma.test", "delta": "delta.test"}


@pytest.fixture
def reg(tmp_path: Path) -> Registry:
    routes = {n: {"listen": p} for n, p in PORTS.items()} | {n: {"host": h} for n, h in HOSTS.items()}
    registry = mint([*PORTS, *HOSTS], tmp_path / "work", routes)
    for name in PORTS:
        registry[name].upstream = f"http://127.0.0.1:{PORTS[name] + 1000}"
    registry["gamma"].upstream = "http://127.0.0.1:29001"
    return registry


@pytest.fixture
def regfile(tmp_path: Path, reg: Registry) -> Path:
    path = tmp_path / "registry.yaml"
    reg.save(path)
    return path


@pytest.fixture
def addon():
    return Tenancy()


@pytest.mark.parametrize("script", ["addons/tenancy.py", "harness/capture/script.py"])
def test_the_script_users_pass_to_mitmdump_is_the_addon_class(script):
    """`mitmdump -s addons/tenancy.py` (a checkout) or `-s "$(python -m harness.capture.script)"` (an install)
    loads the file by path, outside the package: it must expose exactly one `Tenancy` addon, the class the
    harness and these tests use, as a script."""
    spec = importlib.util.spec_from_file_location("tenancy_script", ROOT / script)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert [type(a) for a in module.addons] == [Tenancy] and module.addons[0].routing.script


def test_every_hook_of_the_routing_part_runs_in_the_addon():
    """`Tenancy` calls its routing part by hand (mitmproxy would run sub-addons after it): a hook `Routing`
    defines must be one `Tenancy` defines too, or mitmproxy never calls it."""
    import mitmproxy.addonmanager  # the modules that register mitmproxy's hooks
    import mitmproxy.proxy.layers.http
    import mitmproxy.proxy.server_hooks  # noqa: F401
    from mitmproxy import hooks

    from harness.capture.routing import Routing

    routed = {name for name in vars(Routing) if name in hooks.all_hooks}
    assert {"load", "configure", "request", "http_connect"} <= routed
    assert sorted(name for name in routed if name not in vars(Tenancy)) == []


def test_every_hook_of_the_inspection_part_runs_in_the_addon():
    """The same for the inspection part: `Tenancy` composes both parts as siblings, neither inherits the other."""
    import mitmproxy.addonmanager  # the modules that register mitmproxy's hooks
    import mitmproxy.proxy.layers.http
    import mitmproxy.proxy.server_hooks  # noqa: F401
    from mitmproxy import hooks

    from harness.capture.inspection import Inspection

    inspected = {name for name in vars(Inspection) if name in hooks.all_hooks}
    assert {"load", "configure", "request", "responseheaders", "http_connect", "done"} <= inspected
    assert sorted(name for name in inspected if name not in vars(Tenancy)) == []
    assert Tenancy.__mro__ == (Tenancy, object)


@pytest.fixture
def tctx(addon, regfile: Path, tmp_path: Path):
    with taddons.context(addon) as ctx:
        ctx.configure(addon, tenancy_registry=str(regfile), tenancy_ledger=str(tmp_path / "ledger.jsonl"))
        yield ctx


def main_turn(reg: Registry, tenant: str, **over) -> dict:
    body = {
        "model": reg[tenant].model,
        "messages": [{"role": "user", "content": "hello"}],
        "tools": [{"type": "function", "function": {"name": "terminal"}}],
    }
    return body | over


def reverse_flow(tenant: str, body: dict | bytes | None = None, *, key: str | None = None,
                 path: str = "/v1/chat/completions", method: str = "POST", headers: dict | None = None,
                 port: int | None = None) -> http.HTTPFlow:
    port = port or PORTS[tenant]
    content = json.dumps(body).encode() if isinstance(body, dict) else (body or b"")
    hdrs = {"content-type": "application/json"} | (headers or {})
    if key:
        hdrs["authorization"] = f"Bearer {key}"
    f = tflow.tflow(req=http.Request.make(method, f"http://127.0.0.1:{port + 1000}{path}", b"", hdrs))
    f.request.raw_content = content
    f.client_conn.proxy_mode = ProxyMode.parse(f"reverse:http://127.0.0.1:{port + 1000}@{port}")
    return f


def forward_flow(host: str, body: dict | None = None, *, key: str | None = None) -> http.HTTPFlow:
    """A forward request as its `request` hook sees it: no server connection yet (lazy strategy)."""
    hdrs = {"content-type": "application/json"} | ({"authorization": f"Bearer {key}"} if key else {})
    f = tflow.tflow(req=http.Request.make("POST", f"https://{host}/v1/chat/completions",
                                          json.dumps(body or {}).encode(), hdrs))
    f.server_conn.timestamp_start = f.server_conn.timestamp_tcp_setup = None
    return f


def respond(f: http.HTTPFlow, content: bytes | str, ctype: str = "application/json", **hdrs: str) -> None:
    f.response = http.Response.make(200, b"", {"content-type": ctype, **hdrs})
    f.response.raw_content = content.encode() if isinstance(content, str) else content


def run(addon, f: http.HTTPFlow, response: bytes | str | None = b'{"ok": true}') -> http.HTTPFlow:
    addon.request(f)
    if f.response is None and response is not None:
        respond(f, response)
        addon.responseheaders(f)
    if f.response is not None:
        addon.response(f)
    return f


def kinds(f: http.HTTPFlow) -> list[str]:
    return [x["kind"] for x in f.metadata["tenancy"]["findings"]]


def ledger(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]


# --- options -----------------------------------------------------------------------------------------


def test_defaults_leave_the_addon_inactive(addon):
    with taddons.context(addon) as ctx:
        assert ctx.options.tenancy_egress == "flag"
        assert ctx.options.tenancy_registry is None and ctx.options.tenancy_ledger is None
        f = run(addon, reverse_flow("alpha", {}))
        assert "tenancy" not in f.metadata and FLOW_HEADER not in f.request.headers


def test_registry_option_loads_and_bad_values_raise(addon, regfile, tmp_path):
    with taddons.context(addon) as ctx:
        ctx.configure(addon, tenancy_registry=str(regfile))
        assert addon.registry.names() == ["alpha", "beta", "gamma", "delta"]
        with pytest.raises(exceptions.OptionsError, match="does not exist"):
            ctx.configure(addon, tenancy_registry=str(tmp_path / "missing.yaml"))
        bad = tmp_path / "bad.yaml"
        bad.write_text("version: 1\ntenants: [oops\n")
        with pytest.raises(exceptions.OptionsError, match="tenancy_registry: registry: not valid YAML"):
            ctx.configure(addon, tenancy_registry=str(bad))
        bad.write_text("version: 3\ntenants: {}\n")
        with pytest.raises(exceptions.OptionsError, match="version must be 1"):
            ctx.configure(addon, tenancy_registry=str(bad))
        assert addon.registry.names() == ["alpha", "beta", "gamma", "delta"]  # the good one stays


def test_egress_option_values(addon):
    with taddons.context(addon) as ctx:
        ctx.configure(addon, tenancy_egress="block")
        assert ctx.options.tenancy_egress == "block"
        with pytest.raises(exceptions.OptionsError, match="tenancy_egress must be one of flag, block"):
            ctx.configure(addon, tenancy_egress="allow")


def test_ledger_option_creates_a_private_file_and_rejects_unwritable(addon, tmp_path):
    with taddons.context(addon) as ctx:
        ctx.configure(addon, tenancy_ledger=str(tmp_path / "l.jsonl"))
        assert stat.S_IMODE(os.stat(tmp_path / "l.jsonl").st_mode) == 0o600
        with pytest.raises(exceptions.OptionsError, match="tenancy_ledger: cannot open"):
            ctx.configure(addon, tenancy_ledger=str(tmp_path / "no" / "such" / "dir.jsonl"))


# --- reverse topology ----------------------------------------------------------------------------------


def test_clean_main_turn_is_recorded_not_flagged(tctx, addon, reg, tmp_path):
    f = run(addon, reverse_flow("alpha", main_turn(reg, "alpha"), key=reg["alpha"].key))
    assert f.request.headers[FLOW_HEADER] == f.id
    assert not f.marked and not f.comment
    meta = f.metadata["tenancy"]
    assert meta["tenant"] == "alpha" and meta["kind"] == "main" and meta["bearer"] == "own"
    assert meta["findings"] == [] and meta["flagged"] is False
    (line,) = ledger(tmp_path)
    assert line["flow"] == f.id and line["route"] == "listen:18001" and line["status"] == 200
    assert {"time", "tenant", "method", "path", "kind", "bearer_tenant", "model", "request_bytes",
            "findings"} <= set(line)
    assert line["model"] == reg["alpha"].model and line["bearer_tenant"] == "alpha"


def test_a_flow_header_the_client_sent_is_replaced_not_doubled(tctx, addon, reg):
    f = run(addon, reverse_flow("alpha", main_turn(reg, "alpha"), key=reg["alpha"].key,
                                headers={"X-Tenancy-Flow": "forged"}))
    assert f.request.headers.get_all(FLOW_HEADER) == [f.id]
    g = run(addon, reverse_flow("alpha", main_turn(reg, "alpha"), key=reg["alpha"].key))
    assert g.request.headers.get_all(FLOW_HEADER) == [g.id]


def test_wrong_key_with_another_tenants_key(tctx, addon, reg, caplog):
    with caplog.at_level(logging.WARNING, logger="tenancy"):
        f = run(addon, reverse_flow("alpha", main_turn(reg, "alpha"), key=reg["beta"].key))
    assert kinds(f) == ["wrong_key"]  # the bearer is not also reported as a header leak
    finding = f.metadata["tenancy"]["findings"][0]
    assert (finding["victim"], finding["seen_in"], finding["canary"]) == ("beta", "alpha", "key")
    assert finding["evidence"] == "Bearer <beta:key>" and reg["beta"].key not in json.dumps(f.metadata)
    assert f.marked == ":warning:" and f.comment.startswith("tenancy: wrong_key: beta's key in alpha's request")
    assert "wrong_key" in caplog.text and reg["beta"].key not in caplog.text


def test_wrong_key_when_main_turn_has_none_or_an_unknown_one(tctx, addon, reg):
    f = run(addon, reverse_flow("alpha", main_turn(reg, "alpha")))
    assert kinds(f) == ["wrong_key"] and f.metadata["tenancy"]["findings"][0]["victim"] == "alpha"
    f = run(addon, reverse_flow("alpha", main_turn(reg, "alpha"), key="sk-real-looking-secret-value"))
    assert kinds(f) == ["wrong_key"]
    assert "sk-real" not in json.dumps(f.metadata["tenancy"]) and f.metadata["tenancy"]["bearer"] == "unknown"


@pytest.mark.parametrize("tenant", ["alpha", "beta"])
def test_every_bearer_state(tctx, addon, reg, tenant):
    """own, foreign, misused (another secret of the tenant itself), unknown and none, on the first tenant of
    the registry and on a later one (the own key is matched without a look through every tenant)."""
    other = "beta" if tenant == "alpha" else "alpha"
    cases = {"own": reg[tenant].key, "foreign": reg[other].key, "misused": reg[tenant].canaries["api_server_key"],
             "unknown": "sk-real-looking-secret-value", "none": None}
    for state, key in cases.items():
        meta = run(addon, reverse_flow(tenant, main_turn(reg, tenant), key=key)).metadata["tenancy"]
        assert meta["bearer"] == state, (state, meta)
        owner = {"own": tenant, "foreign": other, "misused": tenant}.get(state)
        assert meta["bearer_tenant"] == owner, (state, meta)
        assert [x["kind"] for x in meta["findings"]] == ([] if state == "own" else ["wrong_key"]), (state, meta)
        if state == "misused":
            finding = meta["findings"][0]
            assert (finding["victim"], finding["canary"]) == (tenant, "api_server_key")


def test_aux_without_key_and_local_probes_are_not_flagged(tctx, addon, reg, tmp_path):
    aux = run(addon, reverse_flow("alpha", {"model": "x", "messages": []}))
    probe = run(addon, reverse_flow("alpha", path="/api/tags", method="GET"), response=b"not found")
    props = run(addon, reverse_flow("alpha", path="/v1/props?x=1", method="GET"), response=b"")
    assert [aux.metadata["tenancy"]["kind"], probe.metadata["tenancy"]["kind"]] == ["aux", "probe"]
    assert props.metadata["tenancy"]["kind"] == "probe"
    assert not any(f.marked for f in (aux, probe, props))
    assert [line["kind"] for line in ledger(tmp_path)] == ["aux", "probe", "probe"]


def test_wrong_model(tctx, addon, reg):
    f = run(addon, reverse_flow("alpha", main_turn(reg, "alpha", model=reg["beta"].model), key=reg["alpha"].key))
    assert kinds(f) == ["wrong_model"]  # not also a request_leak of the same model field
    finding = f.metadata["tenancy"]["findings"][0]
    assert finding["victim"] == "beta" and finding["evidence"] == '"model": "<beta:model>"'
    f = run(addon, reverse_flow("alpha", main_turn(reg, "alpha", model="gpt-4o"), key=reg["alpha"].key))
    assert kinds(f) == ["wrong_model"] and f.metadata["tenancy"]["findings"][0]["victim"] == "alpha"


@pytest.mark.parametrize(
    ("encode", "encoding"),
    [
        (lambda s: s, "plain"),
        (lambda s: base64.b64encode(s.encode()).decode(), "base64"),
        (lambda s: s.encode().hex(), "hex"),
    ],
)
def test_request_leak_in_body_in_any_encoding(tctx, addon, reg, encode, encoding):
    leak = encode(reg["beta"].canaries["memory"])
    body = main_turn(reg, "alpha", messages=[{"role": "user", "content": f"remember {leak}"}])
    f = run(addon, reverse_flow("alpha", body, key=reg["alpha"].key))
    (finding,) = f.metadata["tenancy"]["findings"]
    assert finding["kind"] == "request_leak" and finding["encoding"] == encoding
    assert (finding["victim"], finding["seen_in"], finding["canary"]) == ("beta", "alpha", "memory")
    assert finding["location"].startswith(f"flow:{f.id}:request.body@")
    assert "<beta:memory>" in finding["evidence"]


def test_request_leak_in_header_path_and_gzip_body(tctx, addon, reg):
    soul = reg["beta"].canaries["soul"]
    f = run(addon, reverse_flow("alpha", {"q": 1}, headers={"x-note": soul}, path=f"/v1/x?s={soul}"))
    locations = [x["location"] for x in f.metadata["tenancy"]["findings"]]
    assert locations == [f"flow:{f.id}:request.path", f"flow:{f.id}:request.headers.x-note"]
    f = reverse_flow("alpha", headers={"content-encoding": "gzip"})
    f.request.raw_content = gzip.compress(json.dumps({"m": soul}).encode())
    run(addon, f)
    (finding,) = f.metadata["tenancy"]["findings"]
    assert finding["kind"] == "request_leak" and finding["encoding"] == "gzip"


def test_own_canaries_are_not_leaks(tctx, addon, reg):
    own = " ".join(reg["alpha"].canaries.values())
    f = run(addon, reverse_flow("alpha", main_turn(reg, "alpha", messages=[{"content": own}]),
                                key=reg["alpha"].key), response=json.dumps({"content": own}))
    assert kinds(f) == [] and not f.marked


def test_response_leak_json(tctx, addon, reg):
    f = reverse_flow("alpha", main_turn(reg, "alpha"), key=reg["alpha"].key)
    f = run(addon, f, response=json.dumps({"content": f"env: {reg['beta'].canaries['env_marker']}"}))
    (finding,) = f.metadata["tenancy"]["findings"]
    assert finding["kind"] == "response_leak" and finding["channel"] == "response"
    assert finding["location"].startswith(f"flow:{f.id}:response.body@") and f.metadata["tenancy"]["status"] == 200


def sse(*pieces: str) -> bytes:
    events = [{"choices": [{"index": 0, "delta": {"content": p}}]} for p in pieces]
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


def stream_through(addon, f: http.HTTPFlow, body: bytes, chunk: int = 7,
                   content_type: str = "text/event-stream") -> list[bytes]:
    """What the proxy core does with a streamed response: headers hook, chunks via .stream, response hook."""
    addon.request(f)
    f.response = http.Response.make(200, b"", {"content-type": content_type})
    f.response.data.content = None
    addon.responseheaders(f)
    assert callable(f.response.stream)
    out = [f.response.stream(body[i:i + chunk]) for i in range(0, len(body), chunk)]
    out.append(f.response.stream(b""))
    addon.response(f)
    return out


def test_sse_is_passed_through_chunk_by_chunk_and_inspected_reassembled(tctx, addon, reg):
    secret = reg["beta"].canaries["workdir"]
    body = sse("cwd is ", secret[:10], secret[10:], " ok")  # the canary is cut in two on the wire
    f = reverse_flow("alpha", main_turn(reg, "alpha", stream=True), key=reg["alpha"].key)
    out = stream_through(addon, f, body)
    assert b"".join(out) == body and all(len(c) <= 7 for c in out)
    assert f.response.raw_content == body and f.response.stream is False  # the saved flow keeps the stream
    (finding,) = f.metadata["tenancy"]["findings"]
    assert finding["kind"] == "response_leak" and finding["canary"] == "workdir"
    assert finding["location"].startswith(f"flow:{f.id}:response.sse.choices[0].delta.content@")
    assert f.metadata["tenancy"]["streamed"] is True


def test_ndjson_is_passed_through_line_by_line_and_inspected_whole_at_the_end(tctx, addon, reg):
    """A long-lived NDJSON response (ntfy's subscription) reaches the client chunk by chunk, as SSE does: held
    until it ended, the bot would never see a message. Another tenant's canary in it is a `response_leak` (the
    whole body inspected at the end); the tenant's own is not (the near miss)."""
    secret, own = reg["beta"].canaries["workdir"], reg["alpha"].canaries["workdir"]
    body = b"".join(json.dumps(e).encode() + b"\n" for e in (
        {"event": "open"}, {"event": "message", "message": f"cwd {own}"}, {"event": "message", "message": secret}))
    f = reverse_flow("alpha", None, key=reg["alpha"].key)
    out = stream_through(addon, f, body, content_type="application/x-ndjson")
    assert b"".join(out) == body and all(len(c) <= 7 for c in out)
    assert f.response.raw_content == body and f.response.stream is False
    (finding,) = f.metadata["tenancy"]["findings"]
    assert finding["kind"] == "response_leak" and finding["canary"] == "workdir"
    near = reverse_flow("alpha", None, key=reg["alpha"].key)
    stream_through(addon, near, body.replace(secret.encode(), b"x"), content_type="application/x-ndjson")
    assert kinds(near) == []


def test_a_plain_json_response_is_not_streamed(tctx, addon, reg):
    f = reverse_flow("alpha", None, key=reg["alpha"].key)
    addon.request(f)
    f.response = http.Response.make(200, b"{}", {"content-type": "application/json"})
    addon.responseheaders(f)
    assert not f.response.stream


def test_sse_with_lone_surrogates_is_inspected_not_crashed(tctx, addon, reg, tmp_path):
    secret = reg["beta"].canaries["workdir"]
    body = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in (
        {"c": "\ud83d"}, {"c": "\ude00 " + secret[:9]}, {"c": secret[9:] + " \ud800"}))  # as "\\ud83d"
    f = reverse_flow("alpha", main_turn(reg, "alpha", stream=True), key=reg["alpha"].key)
    stream_through(addon, f, body)
    (finding,) = f.metadata["tenancy"]["findings"]
    assert finding["canary"] == "workdir" and finding["location"].startswith(f"flow:{f.id}:response.sse.c@")
    assert [line["flow"] for line in ledger(tmp_path)] == [f.id]


def test_sse_that_orjson_refuses_is_reassembled_by_json(tctx, addon, reg):
    """NaN and a lone surrogate escape make orjson refuse an event; json parses it, so a canary cut
    across such events is still whole in the reassembled stream."""
    secret = reg["beta"].canaries["memory"]
    body = (f'data: {{"n": NaN, "c": "{secret[:10]}"}}\n\n'
            f'data: {{"n": "\\ud83d", "c": "{secret[10:]}"}}\n\n').encode()
    f = reverse_flow("alpha", main_turn(reg, "alpha", stream=True), key=reg["alpha"].key)
    stream_through(addon, f, body)
    (finding,) = f.metadata["tenancy"]["findings"]
    assert finding["canary"] == "memory" and finding["location"].startswith(f"flow:{f.id}:response.sse.c@")


@pytest.mark.parametrize("depth", [1500, 100_000])
def test_deeply_nested_json_is_recorded_not_crashed(tctx, addon, reg, tmp_path, depth):
    """Nesting past the recursion limit (request body and SSE events) once raised RecursionError in the
    hooks, which left the flow without a ledger line. The raw bytes are still scanned."""
    secret = reg["beta"].canaries["soul"]
    nested = b'{"a":' * depth + json.dumps(secret).encode() + b"}" * depth
    f = reverse_flow("alpha", nested, key=reg["alpha"].key)
    stream_through(addon, f, b"data: " + nested + b"\n\n" + b"data: " + nested + b"\n\n")
    assert kinds(f) == ["request_leak", "response_leak", "response_leak"]  # one per event
    assert [line["flow"] for line in ledger(tmp_path)] == [f.id]


def test_clean_sse_is_not_flagged(tctx, addon, reg):
    f = reverse_flow("alpha", main_turn(reg, "alpha", stream=True), key=reg["alpha"].key)
    stream_through(addon, f, sse("hello ", reg["alpha"].canaries["workdir"]))
    assert kinds(f) == [] and not f.marked


def test_unknown_listener_is_recorded_not_flagged_and_warned_about_once(tctx, addon, reg, tmp_path, caplog):
    """A listener that belongs to no tenant is not part of the audit: its flows carry canaries and keys of
    tenants legitimately (someone else's traffic), so flagging them would bury the real findings."""
    leaky = {"x": reg["beta"].canaries["soul"]}
    flows = [run(addon, reverse_flow("alpha", leaky, key=reg["alpha"].key, port=18999),
                 response=json.dumps(leaky)) for _ in range(3)]
    meta = flows[0].metadata["tenancy"]
    assert meta["tenant"] is None and meta["route"] == "listen:18999"
    assert all(kinds(f) == [] and not f.marked for f in flows)
    assert [line["flow"] for line in ledger(tmp_path)] == [f.id for f in flows]  # still on the record
    warnings = [r.getMessage() for r in caplog.records if "belongs to no tenant" in r.getMessage()]
    assert len(warnings) == 1 and "18999" in warnings[0]
    run(addon, reverse_flow("alpha", leaky, key=reg["alpha"].key, port=18998))
    assert sum("belongs to no tenant" in r.getMessage() for r in caplog.records) == 2  # once per port


def test_findings_are_labelled_with_the_phase_the_harness_names(tctx, addon, reg, tmp_path):
    """The ledger's fingerprints are the run's: the addon labels findings with `tenancy_phase_file`."""
    label = tmp_path / "phase.json"
    tctx.configure(addon, tenancy_phase_file=str(label))
    leaky = {"x": reg["beta"].canaries["soul"]}
    unlabelled = run(addon, reverse_flow("alpha", leaky, key=reg["alpha"].key))
    label.write_text(json.dumps({"scenario": "tui", "phase": "turns"}))
    turns = run(addon, reverse_flow("alpha", leaky, key=reg["alpha"].key))
    label.write_text(json.dumps({"scenario": "tui", "phase": "end"}) + " ")  # a new size: re-read
    end = run(addon, reverse_flow("alpha", leaky, key=reg["alpha"].key))
    lines = ledger(tmp_path)
    assert [(line["scenario"], line["phase"]) for line in lines] == [(None, None), ("tui", "turns"), ("tui", "end")]
    for f, line in zip((unlabelled, turns, end), lines, strict=True):
        finding = Finding.from_dict(line["findings"][0])
        assert (finding.scenario, finding.phase) == (line["scenario"], line["phase"])
        assert line["findings"][0]["fingerprint"] == finding.fingerprint()
        assert f.metadata["tenancy"]["findings"] == line["findings"]
    assert len({line["findings"][0]["fingerprint"] for line in lines}) == 3


# --- forward topology ----------------------------------------------------------------------------------


def test_forward_routes_to_the_tenants_upstream(tctx, addon, reg, tmp_path):
    f = run(addon, forward_flow("gamma.test", main_turn(reg, "gamma"), key=reg["gamma"].key))
    assert (f.request.scheme, f.request.host, f.request.port) == ("http", "127.0.0.1", 29001)
    assert f.request.host_header == "gamma.test"  # attribution survives in the saved flow
    assert f.metadata["tenancy"]["tenant"] == "gamma" and kinds(f) == []
    assert ledger(tmp_path)[0]["route"] == "host:gamma.test"
    f = run(addon, forward_flow("delta.test", main_turn(reg, "delta"), key=reg["gamma"].key))
    assert f.request.host == "delta.test" and kinds(f) == ["wrong_key"]  # no upstream: left alone


def test_a_loopback_url_sent_through_the_forward_listener_is_the_reverse_listener_it_names(tctx, addon, reg, tmp_path):
    """Telegram's adapter sends even its loopback base URL through HTTPS_PROXY (its proxy skips NO_PROXY): the
    request is the flow of the reverse listener its port names, routed to that tenant's stub, inspected once."""
    f = run(addon, forward_flow(f"127.0.0.1:{PORTS['beta']}", main_turn(reg, "beta"), key=reg["beta"].key))
    assert (f.request.host, f.request.port) == ("127.0.0.1", PORTS["beta"] + 1000)
    assert f.metadata["tenancy"]["tenant"] == "beta" and kinds(f) == []
    assert route_of(f) == Route("forward", host="127.0.0.1", port=PORTS["beta"])  # the saved flow says so too
    f = run(addon, forward_flow("127.0.0.1:18999", main_turn(reg, "beta"), key=reg["beta"].key))
    assert f.metadata["tenancy"]["tenant"] is None  # the near miss: a port no listener has is no tenant's


@pytest.fixture
def shared(reg: Registry, regfile: Path, tctx, addon) -> Registry:
    """gamma and delta each have a `chat` service on chat.example, shared by credential (`chat_key`), and a
    websocket host of their own (`chat_ws`)."""
    from harness.core.registry import Service

    for port, name in enumerate(("gamma", "delta"), 29101):
        t = reg[name]
        t.canaries["chat_key"] = f"chatkey-{name}-{t.key[-18:]}"
        t.services["chat"] = Service("chat", {"host": "chat.example", "by": "credential"}, f"http://127.0.0.1:{port}",
                                     "chat_key")
        t.services["chat_ws"] = Service("chat_ws", {"host": f"gateway.{name}.chat.test"},
                                        f"http://127.0.0.1:{port}", "chat_key")
    reg.save(regfile)
    addon.routing.tenants.refresh()
    return reg


def chat_flow(path: str, headers: dict | None = None, body: bytes = b"", host: str = "chat.example",
              method: str = "POST") -> http.HTTPFlow:
    f = tflow.tflow(req=http.Request.make(method, f"https://{host}{path}", body, headers or {}))
    f.server_conn.timestamp_start = None
    return f


def test_a_shared_host_goes_to_the_stub_of_the_tenant_whose_credential_the_request_carries(shared, addon, tmp_path):
    gamma, delta = shared["gamma"].canaries["chat_key"], shared["delta"].canaries["chat_key"]
    by_header = run(addon, chat_flow("/api/chat.postMessage", {"authorization": f"Bot {delta}"}))
    by_path = run(addon, chat_flow(f"/bot{gamma}/sendMessage"))
    by_form = run(addon, chat_flow("/api/auth.test", {"content-type": "application/x-www-form-urlencoded"},
                                   f"token={delta}&x=1".encode()))
    header_first = run(addon, chat_flow(f"/bot{gamma}/getMe", {"authorization": f"Bearer {delta}"}))
    unclaimed = run(addon, chat_flow("/api/chat.postMessage", body=b"hello"))
    own_host = run(addon, chat_flow("/socket", host="gateway.delta.chat.test", method="GET"))  # a tenant's own host
    ports = [f.request.port for f in (by_header, by_path, by_form, header_first, unclaimed, own_host)]
    assert ports == [29102, 29101, 29102, 29102, 29101, 29102]  # unclaimed: the first tenant's stub answers it
    lines = ledger(tmp_path)
    assert [(x["tenant"], x["service"], x["bearer"]) for x in lines] == [
        ("delta", "chat", "own"), ("gamma", "chat", "own"), ("delta", "chat", "own"), ("delta", "chat", "own"),
        (None, "chat", "none"), ("delta", "chat_ws", "none")]
    assert [[f["kind"] for f in x["findings"]] for x in lines] == [[], [], [], ["request_leak"], [], []]
    assert lines[3]["findings"][0]["victim"] == "gamma"  # gamma's token in the path of delta's request
    matcher = Matcher.for_registry(shared)
    for flow, line in zip((by_header, by_path, by_form, header_first, unclaimed, own_host), lines, strict=True):
        assert flows.inspect_flow(shared, matcher, flow).ledger_entry() | {"time": line["time"]} == line


def test_a_connect_to_a_shared_host_is_never_refused(shared, tctx, addon):
    tctx.configure(addon, tenancy_egress="block")
    eager_strategy(tctx, addon)
    connect = tflow.tflow(req=http.Request.make("CONNECT", "http://chat.example:443/"))
    connect.request.host, connect.request.port = "chat.example", 443
    addon.http_connect(connect)
    assert connect.response is None


def test_egress_flag_records_and_lets_through(tctx, addon, reg):
    f = forward_flow("api.openai.com", {"k": reg["gamma"].canaries["memory"]})
    addon.request(f)
    assert f.response is None and f.request.host == "api.openai.com"
    respond(f, "{}")
    addon.response(f)
    assert kinds(f) == ["egress", "request_leak"] and f.marked
    egress = f.metadata["tenancy"]["findings"][0]
    assert egress["victim"] is None and egress["seen_in"] is None and "api.openai.com" in egress["detail"]


def test_egress_block_answers_403_without_an_upstream(tctx, addon, reg, tmp_path):
    """Refused, a request that carries nothing of a tenant's is recorded (`refused` in the ledger), not a
    finding; one carrying a canary is egress and its leak. Reconciled from the saved flow: the same."""
    tctx.configure(addon, tenancy_egress="block")
    f = forward_flow("evil.example")
    addon.request(f)
    assert f.response.status_code == 403 and b"egress to evil.example blocked" in f.response.content
    addon.response(f)
    assert kinds(f) == [] and not f.marked and ledger(tmp_path)[0]["status"] == 403
    assert ledger(tmp_path)[0]["refused"] is True and ledger(tmp_path)[0]["tenant"] is None
    carrying = run(addon, forward_flow("evil.example", {"k": reg["gamma"].canaries["memory"]}))
    assert carrying.response.status_code == 403 and kinds(carrying) == ["egress", "request_leak"] and carrying.marked
    assert "(refused)" in carrying.metadata["tenancy"]["findings"][0]["detail"]
    matcher = Matcher.for_registry(reg)
    for flow, line in zip((f, carrying), ledger(tmp_path), strict=True):
        assert flows.inspect_flow(reg, matcher, flow).ledger_entry() | {"time": line["time"]} == line
    answered = forward_flow("evil.example")  # near miss: a 403 the proxy did not make (an upstream's) is no refusal
    respond(answered, "{}")
    answered.response.status_code = 403
    assert "refused" not in flows.inspect_flow(reg, matcher, answered).ledger_entry()


def test_a_reverse_listener_asked_through_the_regular_one_is_its_tenants(tctx, addon, reg, tmp_path):
    """A client that sends even loopback through HTTPS_PROXY (Telegram's adapter decides by api.telegram.org,
    whatever its base URL) asks the regular listener for `127.0.0.1:<a reverse listener's port>`: routed to that
    tenant's upstream and inspected as its flow, also when reconciled. Near misses, refused as egress: a loopback port
    no tenant listens on, and another host on a listener's port."""
    tctx.configure(addon, tenancy_egress="block")
    own = run(addon, forward_flow(f"127.0.0.1:{PORTS['alpha']}", main_turn(reg, "alpha"), key=reg["alpha"].key))
    other = run(addon, forward_flow(f"127.0.0.1:{PORTS['beta']}", main_turn(reg, "beta"), key=reg["alpha"].key))
    assert (own.request.host, own.request.port) == ("127.0.0.1", PORTS["alpha"] + 1000)
    assert other.request.port == PORTS["beta"] + 1000 and kinds(own) == [] and kinds(other) == ["wrong_key"]
    unowned = run(addon, forward_flow("127.0.0.1:18999", main_turn(reg, "alpha")))
    elsewhere = run(addon, forward_flow(f"example.org:{PORTS['alpha']}", main_turn(reg, "alpha")))
    assert [f.response.status_code for f in (unowned, elsewhere)] == [403, 403]
    lines = ledger(tmp_path)
    assert [(x["tenant"], x.get("refused", False)) for x in lines] == [("alpha", False), ("beta", False),
                                                                        (None, True), (None, True)]
    matcher = Matcher.for_registry(reg)
    for flow, line in zip((own, other, unowned, elsewhere), lines, strict=True):
        assert flows.inspect_flow(reg, matcher, flow).ledger_entry() | {"time": line["time"]} == line


def test_a_connect_to_an_unowned_host_is_refused_only_when_it_would_be_dialled(tctx, addon, tmp_path):
    """With the lazy strategy nothing is dialled at a CONNECT: the request inside is read and refused. With the
    eager one (which dials at once) the CONNECT itself is refused."""
    tctx.configure(addon, tenancy_egress="block")
    lazy = tflow.tflow(req=http.Request.make("CONNECT", "http://evil.example:443/"))
    lazy.request.host, lazy.request.port = "evil.example", 443
    addon.http_connect(lazy)
    assert lazy.response is None
    eager_strategy(tctx, addon)
    eager = tflow.tflow(req=http.Request.make("CONNECT", "http://evil.example:443/"))
    eager.request.host, eager.request.port = "evil.example", 443
    eager.server_conn.timestamp_start = None
    addon.http_connect(eager)
    assert eager.response.status_code == 403
    assert [(line["refused"], line["findings"]) for line in ledger(tmp_path)] == [(True, [])]
    ok = tflow.tflow(req=http.Request.make("CONNECT", "http://gamma.test:443/"))
    addon.http_connect(ok)
    assert ok.response is None


def eager_strategy(tctx, addon) -> None:
    """mitmproxy's `connection_strategy` (its proxy server's option, which the test context lacks), set to eager."""
    tctx.options.add_option("connection_strategy", str, "lazy", "", choices=("eager", "lazy"))
    tctx.configure(addon, connection_strategy="eager")


@pytest.mark.parametrize(("address", "refused"), [
    (("93.184.215.14", 443), True), (("evil.example", 80), True), (("127.0.0.1", 29001), False),
    (("::1", 8080), False), (("localhost", 80), False), (("127.0.0.2", 80), False)])
def test_block_refuses_any_connection_that_would_leave_the_machine(tctx, addon, address, refused):
    """`server_connect`: whatever would dial outside loopback (a raw TCP stream or TLS the proxy does not read,
    after a CONNECT) is refused before it is dialled; loopback (every stub) is not."""
    from mitmproxy.connection import Server
    from mitmproxy.proxy.server_hooks import ServerConnectionHookData

    data = ServerConnectionHookData(Server(address=address), tflow.tclient_conn())
    addon.server_connect(data)
    assert data.server.error is None  # egress `flag`: nothing is refused
    tctx.configure(addon, tenancy_egress="block")
    addon.server_connect(data)
    assert (data.server.error is not None) == refused


# --- routing decides once, inspection reads it ------------------------------------------------------------


def test_routing_resolves_each_flow_once_and_hands_it_on(tctx, addon, reg, tmp_path, monkeypatch):
    """A flow's route and endpoint are worked out once, by routing, whatever hooks follow (a JSON turn, an SSE
    stream, a forward request, an error, egress blocked as a request and as a CONNECT)."""
    from harness.detect import routes

    calls: list[tuple[str, str]] = []

    def counted(name, real):
        def count(*args):
            calls.append((name, args[0].id if name == "route_of" else str(args[1])))
            return real(*args)
        return count

    for module, name in ((routes, "route_of"), (routes, "endpoint_of"), (flows, "endpoint_of")):
        monkeypatch.setattr(module, name, counted(name, getattr(routes, name)))
    json_turn = run(addon, reverse_flow("alpha", main_turn(reg, "alpha"), key=reg["alpha"].key))
    streamed = reverse_flow("alpha", main_turn(reg, "alpha", stream=True), key=reg["alpha"].key)
    stream_through(addon, streamed, sse("hello"))
    forward = run(addon, forward_flow("gamma.test", main_turn(reg, "gamma"), key=reg["gamma"].key))
    failed = reverse_flow("beta", main_turn(reg, "beta"), key=reg["beta"].key)
    addon.request(failed)
    failed.error = tflow.terr("connection refused")
    addon.error(failed)
    tctx.configure(addon, tenancy_egress="block")
    blocked = run(addon, forward_flow("evil.example"))
    eager_strategy(tctx, addon)  # a CONNECT is refused when it would be dialled
    connect = tflow.tflow(req=http.Request.make("CONNECT", "http://evil.example:443/"))
    connect.request.host, connect.request.port = "evil.example", 443
    addon.http_connect(connect)
    every = (json_turn, streamed, forward, failed, blocked, connect)
    assert [f.id for f in every] == [line["flow"] for line in ledger(tmp_path)]
    assert [flow_id for name, flow_id in calls if name == "route_of"] == [f.id for f in every]
    assert [route for name, route in calls if name == "endpoint_of"] == [
        "listen:18001", "listen:18001", "host:gamma.test", "listen:18002", "host:evil.example", "host:evil.example"]
    assert all(addon.routing.release(f) is None for f in every)  # nothing kept once a flow is finished


def test_inspection_attributes_a_flow_by_the_endpoint_routing_handed_it(tctx, addon, reg):
    """The inspection does not work out whose a flow is again: it reads the endpoint it is given."""
    from harness.detect.routes import Route, endpoint_of

    f = reverse_flow("alpha", main_turn(reg, "beta"), key=reg["beta"].key)  # beta's turn on alpha's listener
    addon.inspection.request(f, endpoint_of(reg, Route("reverse", listen_port=PORTS["beta"])))
    assert f.metadata["tenancy"]["tenant"] == "beta" and not f.marked
    respond(f, "{}")
    addon.response(f)
    assert f.metadata["tenancy"]["tenant"] == "beta" and kinds(f) == []


def test_a_blocked_flow_finished_after_the_registry_changed_is_attributed_by_the_new_one(tctx, addon, reg, regfile):
    """Routing's decision holds for the registry it was made in: a flow it answered, finished after a reload,
    is attributed by the registry in force then (as the reconciler of that registry would)."""
    tctx.configure(addon, tenancy_egress="block")
    f = forward_flow("evil.example")
    addon.request(f)
    assert f.response.status_code == 403
    reg["delta"].route = {"host": "evil.example"}
    reg.save(regfile)
    addon.routing.tenants.refresh()
    addon.response(f)
    assert f.metadata["tenancy"]["tenant"] == "delta" and f.metadata["tenancy"]["route"] == "host:evil.example"


# --- registry reload -----------------------------------------------------------------------------------


def test_registry_reload_picks_up_new_canaries_and_survives_a_broken_file(tctx, addon, reg, regfile, caplog):
    minted = "fresh-canary-beta-0123456789"
    first = reverse_flow("alpha", {"m": minted})
    addon.request(first)  # in flight while the registry changes
    reg.add_canary("beta", "late", minted)
    reg.save(regfile)
    second = run(addon, reverse_flow("alpha", {"m": minted}))
    assert kinds(second) == ["request_leak"] and second.metadata["tenancy"]["findings"][0]["canary"] == "late"
    respond(first, "{}")
    addon.response(first)
    assert kinds(first) == ["request_leak"]  # the in-flight flow is still finished and recorded
    regfile.write_text("version: 1\ntenants: [broken\n")
    with caplog.at_level(logging.ERROR, logger="tenancy"):
        third = run(addon, reverse_flow("alpha", {"m": minted}))
    assert "keeping the previous registry" in caplog.text and kinds(third) == ["request_leak"]


def test_a_canary_minted_while_its_flow_is_in_flight_is_found_in_that_flows_response(tctx, addon, reg, regfile):
    """A model stub mints the derived canary its answer carries (the registry file saved) just before the answer
    leaves, with no other request meanwhile: the response is inspected under the new registry, so the flow carries
    the finding `reconcile` (the final registry) reports for it. Near miss: alpha's own minted canary in alpha's
    response."""
    beta_token, _ = reg.derive("beta", "reply", "alpha")
    own, _ = reg.derive("alpha", "title", "alpha")
    leak = reverse_flow("alpha", main_turn(reg, "alpha"), key=reg["alpha"].key)
    near = reverse_flow("alpha", main_turn(reg, "alpha", user="near"), key=reg["alpha"].key)
    addon.request(leak)
    addon.request(near)
    reg.save(regfile)  # as the stub does before answering
    for f, token in ((leak, beta_token), (near, own)):
        respond(f, json.dumps({"content": f"done {token}"}))
        addon.response(f)
    assert kinds(leak) == ["response_leak"] and leak.metadata["tenancy"]["findings"][0]["canary"] == (
        "derived_reply_via_alpha") and leak.marked and "response_leak" in leak.comment
    assert kinds(near) == [] and not near.marked
    again = flows.inspect_flow(reg, matcher_for(reg), leak)
    assert [f.fingerprint() for f in again.findings] == [
        x["fingerprint"] for x in leak.metadata["tenancy"]["findings"]]


# --- bodies that are not JSON ---------------------------------------------------------------------------


def test_odd_bodies_are_scanned_as_bytes(tctx, addon, reg):
    secret = reg["beta"].canaries["soul"].encode()
    cases = {
        "text": b"plain text " + secret,
        "binary": os.urandom(4096) + secret + os.urandom(64),
        "huge": b"x" * (decode.MAX_BODY + 10) + secret,
        "multipart": b"--b\r\nContent-Disposition: form-data; name=f\r\n\r\n" + secret + b"\r\n--b--\r\n",
    }
    for name, body in cases.items():
        f = run(addon, reverse_flow("alpha", body, headers={"content-type": "application/octet-stream"}))
        assert kinds(f) == ["request_leak"], name
    f = reverse_flow("alpha", headers={"content-encoding": "x-custom"})
    f.request.raw_content = b"opaque " + secret
    assert kinds(run(addon, f)) == ["request_leak"]
    f = reverse_flow("alpha", headers={"content-encoding": "gzip"})
    f.request.raw_content = b"\x1f\x8bnot really gzip " + secret
    assert kinds(run(addon, f)) == ["request_leak"] and f.metadata["tenancy"]["findings"][0]["encoding"] == "plain"


def test_decode_body_bounds_a_compression_bomb():
    bomb = gzip.compress(b"\0" * (decode.MAX_BODY * 2))
    body = decode.decode_body(bomb, "gzip")
    assert body.note == "truncated" and len(body.data) == decode.MAX_BODY
    assert decode.decode_body(b"{}", "identity").data == b"{}"
    assert decode.decode_body(b"abc", "zstd").note == "undecodable"
    assert decode.decode_body(b"abc", "gzip, x-new").note == "undecodable"


def test_inspect_flow_agrees_on_a_flow_read_back_from_disk(tctx, addon, reg, tmp_path):
    f = reverse_flow("alpha", main_turn(reg, "alpha", model=reg["beta"].model), key=reg["beta"].key)
    f = run(addon, f, response=json.dumps({"x": reg["beta"].canaries["soul"]}))
    with open(tmp_path / "flows.mitm", "wb") as fh:
        io.FlowWriter(fh).add(f)
    with open(tmp_path / "flows.mitm", "rb") as fh:
        (back,) = list(io.FlowReader(fh).stream())
    report = flows.inspect_flow(reg, Matcher.for_registry(reg), back)
    assert [x.to_dict() for x in report.findings] == f.metadata["tenancy"]["findings"]
    assert back.marked == ":warning:" and back.comment == f.comment
    assert report.ledger_entry()["findings"] == ledger(tmp_path)[0]["findings"]


def test_filters_find_flagged_flows_and_tenants(tctx, addon, reg):
    bad = run(addon, reverse_flow("beta", main_turn(reg, "beta"), key=reg["alpha"].key))
    good = run(addon, reverse_flow("alpha", main_turn(reg, "alpha"), key=reg["alpha"].key))
    for spec, expected in [("~marked", [bad]), ("~meta \"'flagged': True\"", [bad]),
                           ("~meta tenancy", [bad, good]), ("~meta \"'tenant': 'alpha'\"", [good])]:
        match = flowfilter.parse(spec)
        assert [f for f in (bad, good) if match(f)] == expected, spec


# --- errors, commands, fail closed ------------------------------------------------------------------------


def test_error_flows_get_a_ledger_line(tctx, addon, reg, tmp_path):
    f = reverse_flow("alpha", main_turn(reg, "alpha"), key=reg["alpha"].key)
    addon.request(f)
    f.error = tflow.terr("connection refused")
    addon.error(f)
    (line,) = ledger(tmp_path)
    assert line["status"] is None and line["response_bytes"] is None and line["error"] == "connection refused"


def test_ledger_lines_orjson_cannot_write_are_written_by_json(tctx, addon, reg, tmp_path):
    """A path with bytes that are not UTF-8 reads as lone surrogates, which orjson refuses to write."""
    f = reverse_flow("alpha", main_turn(reg, "alpha"), key=reg["alpha"].key)
    f.request.data.path = b"/v1/chat/completions?q=\xff\xfe"
    run(addon, f)
    f2 = reverse_flow("alpha", main_turn(reg, "alpha"), key=reg["alpha"].key)
    f2.request.data.path = "/v1/é".encode()
    run(addon, f2)
    first, second = ledger(tmp_path)
    assert first["path"] == "/v1/chat/completions?q=\udcff\udcfe" and first["flow"] == f.id
    assert second["path"] == "/v1/é" and second["flow"] == f2.id
    raw = (tmp_path / "ledger.jsonl").read_bytes().splitlines()
    assert b"\\udcff" in raw[0] and "/v1/é".encode() in raw[1]  # json's escape; orjson's plain UTF-8


def test_commands_list_and_report_findings(tctx, addon, reg, tmp_path):
    run(addon, reverse_flow("alpha", main_turn(reg, "alpha"), key=reg["beta"].key))
    lines = tctx.command(addon.findings_cmd)
    assert len(lines) == 1 and lines[0].startswith("wrong_key: beta's key")
    out = tmp_path / "findings.json"
    tctx.command(addon.report_cmd, str(out))
    doc = json.loads(out.read_text())
    assert doc["count"] == 1 and doc["findings"][0]["kind"] == "wrong_key"
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    with pytest.raises(exceptions.CommandError, match="cannot write"):
        tctx.command(addon.report_cmd, "/proc/forbidden/findings.json")


def test_unwritable_ledger_kills_the_flow_and_stops_the_proxy(addon, regfile, reg, caplog):
    with taddons.context(addon) as ctx:
        ctx.configure(addon, tenancy_registry=str(regfile), tenancy_ledger="/dev/full")
        f = reverse_flow("alpha", main_turn(reg, "alpha"), key=reg["alpha"].key)
        with caplog.at_level(logging.ERROR, logger="tenancy"):
            run(addon, f)
        assert f.error and f.error.msg == "Connection killed."
        ctx.master.event_loop.run_until_complete(asyncio.sleep(0))
        assert ctx.master.should_exit.is_set() and "cannot write the ledger" in caplog.text
        later = reverse_flow("alpha", main_turn(reg, "alpha"), key=reg["alpha"].key)
        run(addon, later)
        assert later.error and later.error.msg == "Connection killed."  # still fail-closed
        addon.done()  # nothing left in a buffer: closing the ledger does not fail again


def test_a_short_ledger_write_kills_that_flow_and_every_later_one_without_writing_again(addon, regfile, reg,
                                                                                         tmp_path, caplog):
    class Short:
        writes = 0

        def write(self, data: bytes) -> int:
            Short.writes += 1
            return len(data) - 1

        def close(self) -> None:
            pass

    with taddons.context(addon) as ctx:
        ctx.configure(addon, tenancy_registry=str(regfile), tenancy_ledger=str(tmp_path / "ledger.jsonl"))
        addon.ledger.close()
        addon.ledger = Short()
        flows = [run(addon, reverse_flow("alpha", main_turn(reg, "alpha"), key=reg["alpha"].key)) for _ in range(2)]
        assert [f.error and f.error.msg for f in flows] == ["Connection killed."] * 2
        assert Short.writes == 1 and "short write" in caplog.text
        ctx.configure(addon, tenancy_ledger=str(tmp_path / "other.jsonl"))  # a new ledger records again
        ok = run(addon, reverse_flow("alpha", main_turn(reg, "alpha"), key=reg["alpha"].key))
        assert ok.error is None and (tmp_path / "other.jsonl").read_text().count("\n") == 1


def test_tenancy_content_view_redacts_every_canary_and_marks_the_leak(tctx, addon, reg):
    from mitmproxy import contentviews

    soul, own = reg["beta"].canaries["soul"], reg["alpha"].canaries["memory"]
    f = run(addon, reverse_flow("alpha", {"x": soul, "mine": base64.b64encode(own.encode()).decode()},
                                key=reg["alpha"].key))
    assert f.metadata["tenancy"]["flagged"]
    meta = contentviews.Metadata(flow=f, content_type="application/json", http_message=f.request)
    view = contentviews.registry.get_view(f.request.content, meta)
    assert view.name == "Tenancy"  # picked by itself for a flagged flow
    text = view.prettify(f.request.content, meta)
    assert text.startswith("tenancy: alpha's flow; 1 foreign canary(ies)")
    assert ">>>LEAK <beta:soul><<<" in text and "<alpha:memory>" in text and ">>>LEAK <alpha" not in text
    assert soul not in text and own not in text
    clean = run(addon, reverse_flow("alpha", main_turn(reg, "alpha"), key=reg["alpha"].key))
    plain = contentviews.Metadata(flow=clean, content_type="application/json", http_message=clean.request)
    assert contentviews.registry.get_view(clean.request.content, plain).name != "Tenancy"


# --- bodies as saved: every framing and content-encoding, live, in the flow file, the ledger and the HAR ------


def _encoded(body: bytes, encoding: str) -> bytes:
    import zlib

    import brotli

    try:
        from compression import zstd  # type: ignore[import-not-found]
    except ImportError:  # before 3.14
        from backports import zstd

    compress = {"gzip": gzip.compress, "br": brotli.compress, "zstd": zstd.compress, "deflate": zlib.compress}
    for enc in [e.strip() for e in encoding.split(",") if e.strip() not in ("", "identity")]:
        body = compress[enc](body)
    return body


def _chunked(body: bytes, size: int = 7) -> bytes:
    parts = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


@pytest.mark.parametrize("framing", ["plain", "chunked as saved"])
@pytest.mark.parametrize("encoding", ["identity", "gzip", "br", "zstd", "deflate", "gzip, br"])
def test_bodies_as_saved_are_inspected_live_and_again_from_every_file(tctx, addon, reg, regfile, tmp_path, framing,
                                                                      encoding):
    """A request and a response body with another tenant's canaries, in any content-encoding (stacked too) and
    with the chunked framing kept in the saved body: the live addon, `reconcile` of the flow file, the ledger
    and the HAR export all see the same findings."""
    from harness.detect.engine.matcher import matcher_for
    from harness.detect.reconcile import reconcile
    from harness.report.export import har

    memory, soul = reg["beta"].canaries["memory"], reg["beta"].canaries["soul"]
    body = json.dumps(main_turn(reg, "alpha", messages=[{"role": "user", "content": f"note {memory}"}])).encode()
    answer = json.dumps({"choices": [{"message": {"role": "assistant", "content": f"soul {soul}"}}]}).encode()
    frame = _chunked if framing != "plain" else (lambda b: b)
    extra = {"transfer-encoding": "chunked"} if framing != "plain" else {}
    f = reverse_flow("alpha", frame(_encoded(body, encoding)), key=reg["alpha"].key,
                     headers={"content-encoding": encoding, **extra})
    run(addon, f, response=None)
    respond(f, frame(_encoded(answer, encoding)), **{"content-encoding": encoding, **extra})
    addon.responseheaders(f)
    addon.response(f)
    live = {(x["kind"], x["canary"], x["fingerprint"]) for x in f.metadata["tenancy"]["findings"]}
    assert {(k, c) for k, c, _ in live} == {("request_leak", "memory"), ("response_leak", "soul")}, live
    path = tmp_path / "flows.mitm"
    with path.open("wb") as fh:
        io.FlowWriter(fh).add(f)
    again = reconcile(reg, path).findings
    assert {(x.kind, x.canary, x.fingerprint()) for x in again} == live
    assert {(x["kind"], x["canary"], x["fingerprint"]) for line in ledger(tmp_path) for x in line["findings"]} == live
    (entry,) = har([f], matcher_for(reg))["log"]["entries"]
    assert {(x["kind"], x["canary"], x["fingerprint"]) for x in entry["_tenancy"]["findings"]} == live


def test_a_chunked_header_over_an_unframed_body_and_framing_without_the_header_are_taken_as_they_are(reg):
    """The near misses of unframing: mitmproxy keeps `Transfer-Encoding: chunked` on a body it has unframed (a
    JSON body is read as it is, its canary found once), and bytes that only look like chunks, with no header
    saying so, are not joined (the split canary is not made up)."""
    from harness.detect.decode import decode_body

    memory = reg["beta"].canaries["memory"]
    body = json.dumps({"messages": [{"role": "user", "content": memory}]}).encode()
    assert decode_body(body, "", "chunked").data == body
    assert decode_body(_chunked(body), "", "").data == _chunked(body)
    assert decode_body(_chunked(body), "gzip", "chunked").note == "undecodable"  # unframed, then not gzip

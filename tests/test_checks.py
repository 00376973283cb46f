"""The checks of a flow (`harness.detect.checks`), one at a time: each with a planted violation it must report and
a near miss it must not; their order, and the inspection as nothing but running them in that order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_services import registry_with_services

from harness.core.findings import Finding
from harness.core.registry import PROVIDER, Registry, mint
from harness.detect import checks, flows
from harness.detect.checks import (
    REQUEST_CHECKS,
    RESPONSE_CHECKS,
    RawRequest,
    RawResponse,
    RequestFacts,
    ResponseFacts,
    check_egress,
    check_identity,
    check_key,
    check_model,
    check_request_leaks,
    check_response_leaks,
    check_stream_leaks,
    request_facts,
    response_facts,
)
from harness.detect.engine.matcher import matcher_for
from harness.detect.reports import RequestReport, ResponseReport
from harness.detect.routes import Route, endpoint_of

CHAT = "/v1/chat/completions"


@pytest.fixture
def reg(tmp_path: Path) -> Registry:
    """alpha behind a reverse listener, beta by its forward host."""
    return mint(["alpha", "beta"], tmp_path / "work", {"alpha": {"listen": 43001}, "beta": {"host": "beta.test"}})


def facts(reg: Registry, route: Route, body: dict | bytes | None = None, *, headers: list | None = None,
          method: str = "POST", path: str = CHAT) -> RequestFacts:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    raw = RawRequest("f1", method, path, headers or [], data)
    return request_facts(reg, matcher_for(reg), raw, endpoint_of(reg, route))


def alpha(reg: Registry, body: dict | bytes | None = None, **kw) -> RequestFacts:
    return facts(reg, Route("reverse", listen_port=43001), body, **kw)


def main_turn(reg: Registry, model: str | None = None, **over) -> dict:
    return {"model": model or reg["alpha"].model, "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "terminal"}}]} | over


def bearer(key: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {key}")]


def run(check, req: RequestFacts, report: RequestReport | None = None) -> list[tuple]:
    report = report or req.report()
    check(req, report)
    return [(f.kind, f.victim, f.canary) for f in report.findings]


def leak(victim: str, canary: str, location: str = "flow:f1:request.body@3") -> Finding:
    return Finding("request_leak", victim, "alpha", canary, "request", location, encoding="plain")


# --- their order, and the inspection as running them ------------------------------------------------------------


def test_the_checks_are_registered_in_their_order():
    """The key and model checks before the leak scan (which leaves out what they reported), egress after it (a
    refused request is egress only with a canary), the identity check after it (it renames its leaks); the stream
    after the headers and body (it reports only what they did not)."""
    assert [c.__name__ for c in REQUEST_CHECKS] == [
        "check_key", "check_model", "check_request_leaks", "check_egress", "check_identity"]
    assert [c.__name__ for c in RESPONSE_CHECKS] == ["check_response_leaks", "check_stream_leaks"]


def test_the_order_is_what_keeps_a_foreign_key_one_finding(reg):
    """In their order a foreign key is one `wrong_key`; with the leak scan first it would be a leak besides."""
    req = alpha(reg, main_turn(reg), headers=bearer(reg["beta"].key))
    in_order, reversed_scan = req.report(), req.report()
    for check in REQUEST_CHECKS:
        check(req, in_order)
    for check in (check_request_leaks, check_key):
        check(req, reversed_scan)
    assert [f.kind for f in in_order.findings] == ["wrong_key"]
    assert sorted(f.kind for f in reversed_scan.findings) == ["request_leak", "wrong_key"]


def test_inspecting_a_request_or_a_response_is_running_the_checks_in_order(reg, monkeypatch):
    ran: list[str] = []

    def first(req, report):
        ran.append("first")
        report.findings.append(leak("beta", "soul"))

    def second(req, report):
        ran.append(f"second after {len(report.findings)}")

    monkeypatch.setattr(flows, "IN_PATH_CHECKS", (first,))
    monkeypatch.setattr(flows, "SCAN_CHECKS", (second,))
    monkeypatch.setattr(flows, "RESPONSE_CHECKS", (second, first))
    report = flows.inspect_request(reg, matcher_for(reg), Route("reverse", listen_port=43001),
                                   RawRequest("f1", "POST", CHAT, [], b"{}"))
    assert ran == ["first", "second after 1"] and [f.canary for f in report.findings] == ["soul"]
    ran.clear()
    flows.inspect_response(matcher_for(reg), RawResponse("f1", 200, [], b"{}"), tenant="alpha")
    assert ran == ["second after 0", "first"]


def test_a_listener_of_no_tenant_runs_no_check(reg, monkeypatch):
    for name in ("IN_PATH_CHECKS", "SCAN_CHECKS"):
        monkeypatch.setattr(flows, name, (lambda req, report: pytest.fail("a check ran"),))
    report = flows.inspect_request(reg, matcher_for(reg), Route("reverse", listen_port=43999),
                                   RawRequest("f1", "POST", CHAT, [], b"{}"))
    assert report.tenant is None and report.route == "listen:43999" and report.findings == []


# --- each request check ------------------------------------------------------------------------------------------


def test_egress(reg):
    unowned = facts(reg, Route("forward", host="api.example.com"), {"q": 1})
    assert run(check_egress, unowned) == [("egress", None, None)]  # it went out (`tenancy_egress=flag`)
    owned = facts(reg, Route("forward", host="BETA.test."), {"q": 1})  # near miss: beta's host, spelled otherwise
    assert owned.tenant is reg["beta"] and run(check_egress, owned) == []
    assert run(check_egress, alpha(reg, {"q": 1})) == []  # and a reverse listener is never egress


def refused(reg: Registry, body: dict) -> RequestFacts:
    raw = RawRequest("f1", "POST", CHAT, [], json.dumps(body).encode(), refused=True)
    return request_facts(reg, matcher_for(reg), raw, endpoint_of(reg, Route("forward", host="api.example.com")))


def test_a_refused_request_is_egress_only_when_it_carries_a_canary(reg):
    """Refused (nothing dialled), a request that holds nothing of a tenant's is a safety record, not a finding;
    one carrying a tenant's canary is egress (and the leak the scan found before it)."""
    clean = refused(reg, {"q": "hello"})
    assert run(check_egress, clean) == []
    carrying = refused(reg, {"q": reg["alpha"].canaries["soul"]})
    report = carrying.report()
    check_request_leaks(carrying, report)
    assert run(check_egress, carrying, report) == [("egress", None, None), ("request_leak", "alpha", "soul")]
    assert "(refused)" in report.findings[0].detail
    near = refused(reg, {"q": reg["alpha"].canaries["soul"][:-1]})  # one character short: no canary, no egress
    report = near.report()
    check_request_leaks(near, report)
    assert run(check_egress, near, report) == []


def test_the_credential_a_refused_request_presents_is_recorded_not_a_leak(reg):
    """A tenant's key addressed to a provider the audit does not stub (Hermes checking a saved key against the
    provider's /v1/models), refused: it never left, and it is the request's credential, not data it carries.
    The same key in the body is data on its way out; let through, the presented key did leave."""
    key = reg["alpha"].key
    raw = RawRequest("f1", "GET", "/v1/models", bearer(key), b"", refused=True)
    presented = request_facts(reg, matcher_for(reg), raw, endpoint_of(reg, Route("forward", host="api.example.com")))
    report = presented.report()
    for check in checks.SCAN_CHECKS:
        check(presented, report)
    assert report.findings == [] and report.bearer_tenant == "alpha"
    in_body = refused(reg, {"q": key})
    report = in_body.report()
    for check in checks.SCAN_CHECKS:
        check(in_body, report)
    assert [(f.kind, f.victim, f.canary) for f in report.findings] == [("egress", None, None),
                                                                        ("request_leak", "alpha", "key")]
    let_through = request_facts(reg, matcher_for(reg), RawRequest("f1", "GET", "/v1/models", bearer(key), b""),
                                endpoint_of(reg, Route("forward", host="api.example.com")))
    report = let_through.report()
    for check in checks.SCAN_CHECKS:
        check(let_through, report)
    assert [(f.kind, f.victim, f.canary) for f in report.findings] == [("egress", None, None),
                                                                        ("request_leak", "alpha", "key")]


def test_a_host_the_tenants_share_is_never_egress(reg):
    reg["alpha"].route = {"host": "chat.example", "by": "credential"}
    reg["beta"].route = {"host": "chat.example", "by": "credential"}
    unclaimed = facts(reg, Route("forward", host="chat.example"), {"q": 1})  # carries no tenant's credential
    assert unclaimed.tenant is None and unclaimed.endpoint.fallback is reg["alpha"]
    assert run(check_egress, unclaimed) == []


def test_key(reg):
    assert run(check_key, alpha(reg, main_turn(reg), headers=bearer(reg["beta"].key))) == [("wrong_key", "beta", "key")]
    assert run(check_key, alpha(reg, main_turn(reg))) == [("wrong_key", "alpha", "key")]  # a main turn needs one
    assert run(check_key, alpha(reg, main_turn(reg), headers=bearer(reg["alpha"].key))) == []
    assert run(check_key, alpha(reg, {"model": reg["alpha"].model, "messages": []})) == []  # an aux turn without one
    assert run(check_key, alpha(reg, main_turn(reg), headers=bearer(reg["alpha"].key[:-1]))) == [
        ("wrong_key", "alpha", "key")]  # one character short: nobody's key, reported as unknown


def test_key_at_a_service_that_needs_a_credential(tmp_path):
    reg = registry_with_services(tmp_path)
    memory = Route("reverse", listen_port=reg["alpha"].services["memory"].listen)
    assert run(check_key, facts(reg, memory, {"q": 1})) == [("wrong_key", "alpha", "memory_key")]
    assert run(check_key, facts(reg, memory, method="GET", path="/")) == []  # near miss: a GET probe needs none


def test_key_in_the_path(reg):
    """A credential the path carries (a Bot API's `/bot<TOKEN>/method`, a `?key=`) is the one the request presents:
    another tenant's is one `wrong_key` at the path (its scan leaves it out), the tenant's own is nothing."""
    theirs = alpha(reg, main_turn(reg), path=f"/v1beta/models/m:generate?key={reg['beta'].key}")
    report = theirs.report()
    for check in REQUEST_CHECKS:
        check(theirs, report)
    assert [(f.kind, f.victim, f.canary, f.location) for f in report.findings] == [
        ("wrong_key", "beta", "key", "flow:f1:request.path")]
    assert theirs.held_in == "path" and theirs.bearer_state == "foreign"
    assert run(check_key, alpha(reg, main_turn(reg), path=f"/bot{reg['alpha'].key}/x")) == []  # its own
    near = reg["beta"].key[:-1] + ("x" if reg["beta"].key[-1] != "x" else "y")  # one character changed: nobody's
    assert run(check_key, alpha(reg, main_turn(reg), path=f"/bot{near}/x")) == [("wrong_key", "alpha", "key")]
    soul = alpha(reg, main_turn(reg), path=f"/bot{reg['beta'].canaries['soul']}/x", headers=bearer(reg["alpha"].key))
    assert run(check_key, soul) == [] and run(check_request_leaks, soul) == [("request_leak", "beta", "soul")]


def test_model(reg):
    assert run(check_model, alpha(reg, main_turn(reg, reg["beta"].model))) == [("wrong_model", "beta", "model")]
    assert run(check_model, alpha(reg, main_turn(reg, "gpt-4o"))) == [("wrong_model", "alpha", "model")]
    assert run(check_model, alpha(reg, main_turn(reg))) == []
    aux = {"model": reg["beta"].model, "messages": []}  # near miss: not a main turn (the leak scan reports it)
    assert run(check_model, alpha(reg, aux)) == []


def test_request_leaks(reg):
    soul = reg["beta"].canaries["soul"]
    planted = alpha(reg, main_turn(reg, messages=[{"role": "user", "content": soul}]), path=f"{CHAT}?s={soul}")
    assert run(check_request_leaks, planted) == [("request_leak", "beta", "soul")] * 2  # the path and the body
    for near in (soul[:-1], soul[:-1] + ("x" if soul[-1] != "x" else "y"), reg["alpha"].canaries["soul"]):
        assert run(check_request_leaks, alpha(reg, {"m": near})) == [], near


def test_request_leaks_leave_out_what_an_earlier_check_reported_there(reg):
    key, header = reg["beta"].key, "flow:f1:request.headers.authorization"
    req = alpha(reg, {"note": key}, headers=bearer(key))
    alone = req.report()
    check_request_leaks(req, alone)
    assert [f.location for f in alone.findings] == [header, "flow:f1:request.body@10"]
    report = req.report()
    report.findings.append(Finding("wrong_key", "beta", "alpha", "key", "request", header))
    check_request_leaks(req, report)
    assert [(f.kind, f.location) for f in report.findings] == [
        ("wrong_key", header), ("request_leak", "flow:f1:request.body@10")]


def test_identity(tmp_path):
    reg = registry_with_services(tmp_path)
    memory = facts(reg, Route("reverse", listen_port=reg["alpha"].services["memory"].listen), {"q": 1})
    report = memory.report()
    report.findings += [leak("default", "memory_user"), leak("default", "soul")]
    check_identity(memory, report)
    assert [(f.kind, f.canary) for f in report.findings] == [
        ("wrong_identity", "memory_user"), ("request_leak", "soul")]
    assert report.findings[0].detail == "the request names default's memory_user to alpha's memory service"
    provider = facts(reg, Route("reverse", listen_port=reg["alpha"].listen), {"q": 1})
    at_provider = provider.report()  # near miss: the same canary to the provider is a plain leak
    at_provider.findings.append(leak("default", "memory_user"))
    check_identity(provider, at_provider)
    assert [f.kind for f in at_provider.findings] == ["request_leak"] and provider.service == PROVIDER


# --- each response check -----------------------------------------------------------------------------------------


def response(reg: Registry, body: bytes, ctype: str = "application/json", **headers: str) -> ResponseFacts:
    return response_facts(matcher_for(reg), "f1", "alpha", [("content-type", ctype), *headers.items()], body)


def run_response(check, resp: ResponseFacts, report: ResponseReport | None = None) -> list[str]:
    report = report or ResponseReport(200, 0)
    check(resp, report)
    return [f.location for f in report.findings]


def sse(*pieces: str) -> bytes:
    return b"".join(f"data: {json.dumps({'c': p})}\n\n".encode() for p in pieces)


def test_response_leaks(reg):
    soul = reg["beta"].canaries["soul"]
    planted = response(reg, json.dumps({"a": soul}).encode(), **{"x-note": soul})
    assert run_response(check_response_leaks, planted) == ["flow:f1:response.headers.x-note", "flow:f1:response.body@7"]
    for near in (soul[:-1], reg["alpha"].canaries["soul"]):
        assert run_response(check_response_leaks, response(reg, json.dumps({"a": near}).encode())) == [], near


def test_stream_leaks(reg):
    soul = reg["beta"].canaries["soul"]
    split = sse("x ", soul[:9], soul[9:])  # whole only when the stream is reassembled
    assert run_response(check_stream_leaks, response(reg, split, "text/event-stream")) == ["flow:f1:response.sse.c@2"]
    assert run_response(check_stream_leaks, response(reg, split)) == []  # near miss: not a stream
    assert run_response(check_stream_leaks, response(reg, sse("x ", soul[:9], soul[9:-1]), "text/event-stream")) == []
    seen = ResponseReport(200, 0, findings=[Finding("response_leak", "beta", "alpha", "soul", "response", "elsewhere")])
    assert run_response(check_stream_leaks, response(reg, split, "text/event-stream"), seen) == ["elsewhere"]


def test_stream_leaks_take_the_place_of_the_body_records(reg):
    """A canary the body's scan found only in its records (`records:PATH`) is reported at the stream's field, in
    the same place in the report; a finding in the body's bytes or in another layer, and one the stream does not
    hold, stay."""
    soul = reg["beta"].canaries["soul"]
    split = response(reg, sse("x ", soul[:9], soul[9:]), "text/event-stream")
    assert run_response(check_response_leaks, split) == ["flow:f1:response.body@0:records:c@2"]
    both = ResponseReport(200, 0)
    for check in RESPONSE_CHECKS:
        check(split, both)
    assert [f.location for f in both.findings] == ["flow:f1:response.sse.c@2"]

    def found(canary: str, location: str) -> Finding:
        return Finding("response_leak", "beta", "alpha", canary, "response", location)

    kept = [found("memory", "flow:f1:response.body@0:records:c@9"), found("soul", "flow:f1:response.body@3:base64@0")]
    report = ResponseReport(200, 0, findings=list(kept))
    assert run_response(check_stream_leaks, split, report) == [f.location for f in kept]
    report = ResponseReport(200, 0, findings=[kept[0], found("soul", "flow:f1:response.body@40:records:c@2")])
    assert run_response(check_stream_leaks, split, report) == [kept[0].location, "flow:f1:response.sse.c@2"]


def test_every_check_is_a_function_of_this_module_with_a_docstring():
    for check in REQUEST_CHECKS + RESPONSE_CHECKS:
        assert getattr(checks, check.__name__) is check and check.__doc__

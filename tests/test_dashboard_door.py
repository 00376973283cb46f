"""The `dashboard` door's probe without Hermes, against a fake dashboard: a route that answers without the
session token with a tenant's canary is a `route_auth` finding (the plant's shape), a tenant's own canary read
with its own credential is not, and the answers to the session token are the near miss: never a finding,
logged as the canaries they carried only, and the probe's positive control (none carried: a failed step)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.core.protocol import placeholder
from harness.core.registry import Registry, mint
from harness.detect.engine.matcher import matcher_for
from harness.detect.incidents import build, entry_point
from harness.drive.doors.dashboard import FOREIGN_HOST, credentials, probe
from harness.drive.doors.dashboard_client import Route, data_routes
from harness.drive.hermes.rpc import RpcLog
from harness.report.documented import documented

TOKEN = "s" * 43
ROUTES = [Route("/api/model/info"), Route("/api/config"), Route("/api/memory", profiled=False),
          Route("/api/pty", ws=True)]


class FakeDashboard:
    """Public `/api/model/info` (any caller: the profile's model), `/api/config` and `/api/memory` (the session
    token only: the profile's model and memory), `/api/pty` (opens for `open_ws` callers)."""

    def __init__(self, registry: Registry, *, token_reads: bool = True, open_ws: bool = False) -> None:
        self.registry, self.token, self.token_reads, self.open_ws = registry, TOKEN, token_reads, open_ws

    def _profile(self, path: str) -> Any:
        return self.registry[path.split("profile=")[1].split("&")[0]]

    def get(self, path: str, headers: dict[str, str]) -> tuple[int, str]:
        t = self._profile(path)
        if headers.get("Host") == FOREIGN_HOST:
            return 400, '{"detail": "Invalid Host header"}'
        if path.startswith("/api/model/info"):
            return 200, json.dumps({"model": t.model})
        if headers.get("X-Hermes-Session-Token") != TOKEN:
            return 401, '{"detail": "Unauthorized"}'
        return 200, json.dumps({"model": t.model, "memory": t.canaries["memory"]} if self.token_reads else {})

    def handshake(self, path: str, headers: dict[str, str], host: str = "") -> tuple[int, str]:
        return (101, "") if self.open_ws else (403, "")


def _ctx(tmp_path: Path) -> SimpleNamespace:
    registry = mint(["default", "alpha"], tmp_path / "work", {"default": {"listen": 42100}, "alpha": {"listen": 42101}})
    logs: dict[str, RpcLog] = {}
    ctx = SimpleNamespace(registry=registry, sandbox=SimpleNamespace(launch="default"), scenario="dashboard",
                          findings=[], timeline=[], said=[], matcher=lambda: matcher_for(registry))
    ctx.rpc_log = lambda name: logs.setdefault(name, RpcLog(tmp_path / f"rpc-{name}.jsonl"))
    ctx.record = lambda result, phase, snapshot=True: ctx.timeline.append((result, phase, snapshot))
    ctx.say = ctx.said.append
    return ctx


def _frames(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "rpc-dashboard.jsonl").read_text().splitlines()]


def test_a_canary_served_without_the_token_is_a_finding_and_the_tokens_answers_are_not(tmp_path):
    """Every finding's recipient is nobody: the answer reached the dashboard's caller, not a tenant's Hermes."""
    ctx = _ctx(tmp_path)
    probe(ctx, FakeDashboard(ctx.registry), ROUTES)
    got = {(f.victim, f.seen_in, f.canary, f.location, f.evidence) for f in ctx.findings}
    assert got == {  # each profile's model to no credential (and to the other's keys: the same finding)
        ("alpha", None, "model", "dashboard:GET /api/model/info?profile=alpha", "no credential -> HTTP 200"),
        ("default", None, "model", "dashboard:GET /api/model/info?profile=default", "no credential -> HTTP 200")}
    assert {f.kind for f in ctx.findings} == {"route_auth"} and all(f.phase == "route-auth" for f in ctx.findings)
    # the near miss: /api/config and /api/memory gave every tenant's data to the session token, never a finding
    assert not any("/api/config" in f.location or "/api/memory" in f.location for f in ctx.findings)
    authorized = [r["frame"] for r in _frames(tmp_path) if r["dir"] == "in" and "carried" in r["frame"]]
    assert {r["request"] for r in authorized} == {"GET /api/model/info?profile=default",
                                                  "GET /api/model/info?profile=alpha",
                                                  "GET /api/config?profile=default", "GET /api/config?profile=alpha",
                                                  "GET /api/memory?profile=default"}  # per profile only if it takes one
    assert placeholder("alpha", "memory") in next(r["carried"] for r in authorized
                                                  if r["request"] == "GET /api/config?profile=alpha")
    raw = (tmp_path / "rpc-dashboard.jsonl").read_text()
    assert ctx.registry["alpha"].canaries["memory"] not in raw  # the token's answers are never logged whole
    assert ctx.registry["alpha"].model in raw  # the unauthenticated answers are, for the reconciler
    assert {r["tenant"] for r in _frames(tmp_path)} == {None}  # nobody's: its secrets, whoever asked
    assert [(r.tenant, r.ok, phase, snapshot) for r, phase, snapshot in ctx.timeline] == [
        ("default", True, "route-auth", False), ("alpha", True, "route-auth", False)]


def test_a_route_of_the_dashboard_is_its_own_incident_and_f33(tmp_path):
    ctx = _ctx(tmp_path)
    probe(ctx, FakeDashboard(ctx.registry), ROUTES)
    assert {entry_point(f) for f in ctx.findings} == {"route dashboard"}
    assert [documented(i) for i in build(ctx.findings)] == [["F33"]]


def test_a_token_that_reads_nothing_proves_nothing_a_failed_step(tmp_path):
    ctx = _ctx(tmp_path)
    probe(ctx, FakeDashboard(ctx.registry, token_reads=False), [Route("/api/config")])
    assert ctx.findings == []
    assert [(r.ok, r.detail) for r, _, _ in ctx.timeline] == [
        (False, "no answer to the session token carried its data")] * 2


def test_a_socket_opened_without_the_token_is_a_finding_and_from_a_foreign_host_only_said(tmp_path):
    ctx = _ctx(tmp_path)
    probe(ctx, FakeDashboard(ctx.registry, open_ws=True), [Route("/api/config"), Route("/api/pty", ws=True)])
    opened = {(f.victim, f.seen_in, f.location, f.evidence) for f in ctx.findings}
    assert opened == {("default", None, f"dashboard:WS /api/pty?profile={p}", "no credential -> HTTP 101")
                      for p in ("default", "alpha")}  # every credential opened it: one finding per socket
    assert not any("foreign host" in f.evidence for f in ctx.findings)
    assert any("foreign host opened /api/pty" in line for line in ctx.said)
    assert not any("WS" in r["frame"]["request"] and r["frame"].get("credential") == "the session token"
                   for r in _frames(tmp_path) if r["dir"] == "out")  # a socket is never opened with the token


def test_every_credential_a_tenant_holds_is_tried_and_the_token_only_as_itself_and_from_a_foreign_host(tmp_path):
    ctx = _ctx(tmp_path)
    creds = credentials(ctx, TOKEN)
    held = {(c.owner, c.label) for c in creds if c.owner}
    assert held == {(t.name, placeholder(t.name, k)) for t in ctx.registry for k in t.secrets()}
    wrong = next(c for c in creds if c.label == "a wrong token")
    assert wrong.token != TOKEN and abs(len(wrong.token) - len(TOKEN)) <= 1
    assert [c.label for c in creds if c.token == TOKEN] == ["the session token from a foreign host",
                                                            "the session token"]
    foreign = creds[-2].headers()
    assert foreign["Host"] == FOREIGN_HOST and "Host" not in creds[-2].headers(ws=True)
    assert "token=" not in creds[-1].query("alpha") and "token=" in wrong.query("alpha")


def test_the_data_routes_are_every_get_and_every_websocket_of_the_table():
    rows = [{"path": "/api/config", "ws": False, "methods": ["GET", "PUT"], "profile": True},
            {"path": "/api/config", "ws": False, "methods": ["GET"], "profile": True},
            {"path": "/api/env/reveal", "ws": False, "methods": ["POST"], "profile": False},
            {"path": "/assets", "ws": False, "methods": [], "profile": False},
            {"path": "/api/pty", "ws": True, "methods": [], "profile": True},
            {"path": "/api/sessions/{session_id}", "ws": False, "methods": ["GET"], "profile": True}]
    routes = data_routes(rows)
    assert [r.path for r in routes] == ["/api/config", "/api/pty", "/api/sessions/{session_id}"]
    assert routes[2].concrete() == "/api/sessions/tenancy" and routes[1].ws


def test_the_dashboard_plant_needs_its_door_and_the_selftest_runs_it_there():
    from harness.drive import plants
    from harness.options import RunOptions, UsageError, check_options

    check_options(RunOptions(scenario="dashboard", plants=["dashboard"]))
    check_options(RunOptions(scenario="all", plants=["dashboard"]))
    with pytest.raises(UsageError, match="plant 'dashboard' needs --scenario dashboard or all"):
        check_options(RunOptions(scenario="serve", plants=["dashboard"]))
    assert plants.SCENARIO["dashboard"] == "dashboard" and plants.PLANTS["dashboard"].expects == {"route_auth"}

"""The `browser` service: the Camofox stub answers Hermes' own browser tools (run in the Hermes venv), and a
request to it is checked for the tenant's key and browser identity, with a near miss that must not count."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import yaml

from harness.core.registry import Registry, mint
from harness.detect.checks import RawRequest
from harness.detect.engine.matcher import matcher_for
from harness.detect.flows import Route, inspect_request
from harness.drive import services
from harness.drive.hermes.agent import hermetic_env
from harness.drive.services.browser import SERVICE, CamofoxStub, page_url
from harness.drive.surface import PlantContext, Where


def registry(tmp_path: Path) -> Registry:
    reg = mint(["default", "alpha"], tmp_path / "work", {"default": {"listen": 42000}, "alpha": {"listen": 42001}})
    services.mint(reg, ["browser"])
    for port, t in enumerate(reg, 42100):
        services.attach(reg, "browser", t.name, {"listen": port}, f"http://127.0.0.1:{port}")
    return reg


def inspect(reg: Registry, method: str, path: str, key: str, body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else b""
    return inspect_request(reg, matcher_for(reg), Route("reverse", listen_port=reg["alpha"].services["browser"].listen),
                           RawRequest("f1", method, path, [("Authorization", f"Bearer {key}")], data))


def found(report) -> list[tuple[str, str | None, str | None, str | None]]:
    return sorted((f.kind, f.victim, f.canary, f.service) for f in report.findings)


def test_the_tenants_own_key_and_identity_are_clean(tmp_path):
    reg = registry(tmp_path)
    a = reg["alpha"].canaries
    assert inspect(reg, "GET", f"/tabs/t1/snapshot?userId={a['browser_user']}", a["browser_key"]).findings == []
    body = {"userId": a["browser_user"], "ref": "e2", "text": a["browser_note"]}
    assert inspect(reg, "POST", "/tabs/t1/type", a["browser_key"], body).findings == []


def test_another_tenants_key_or_identity_in_the_query_or_body(tmp_path):
    reg = registry(tmp_path)
    a, d = reg["alpha"].canaries, reg["default"].canaries
    assert found(inspect(reg, "POST", "/tabs", d["browser_key"], {"userId": a["browser_user"], "url": "x"})) == [
        ("wrong_key", "default", "browser_key", "browser")]
    got = inspect(reg, "GET", f"/tabs/t1/snapshot?userId={d['browser_user']}", a["browser_key"])
    assert found(got) == [("wrong_identity", "default", "browser_user", "browser")]
    body = {"userId": a["browser_user"], "ref": "e2", "text": d["browser_note"]}
    assert found(inspect(reg, "POST", "/tabs/t1/type", a["browser_key"], body)) == [
        ("request_leak", "default", "browser_note", "browser")]


def test_a_near_miss_identity_is_nothing(tmp_path):
    reg = registry(tmp_path)
    a, d = reg["alpha"].canaries, reg["default"].canaries
    assert inspect(reg, "GET", f"/tabs/t1/snapshot?userId={d['browser_user'][:-2]}", a["browser_key"]).findings == []


def test_the_identity_plant_puts_the_donors_user_in_the_targets_config(tmp_path):
    reg = registry(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(yaml.safe_dump(SERVICE.configure(reg["alpha"], Where("http://x")).config))
    SERVICE.plants["browser-user"].action(PlantContext(reg["default"], reg["alpha"], home, "", ""))
    cfg = yaml.safe_load((home / "config.yaml").read_text())
    assert cfg["browser"]["camofox"]["user_id"] == reg["default"].canaries["browser_user"]


def test_the_camofox_stub_answers_hermes_browser_tools(tmp_path, hermes_python):
    reg = registry(tmp_path)
    a = reg["alpha"]
    stub = CamofoxStub(a).start()
    home = tmp_path / "home"
    (home / ".hermes").mkdir(parents=True)
    (home / ".hermes" / "config.yaml").write_text(yaml.safe_dump(SERVICE.configure(a, Where(stub.url)).config))
    env = SERVICE.configure(a, Where(stub.url)).env
    code = f"""
        import json
        from tools import browser_tool as b
        out = {{"ok": b.check_browser_requirements()}}
        out["nav"] = json.loads(b.browser_navigate({page_url("alpha", "s")!r}, task_id="t1"))
        out["typed"] = json.loads(b.browser_type("@e2", "hello note", task_id="t1"))
        out["snap"] = json.loads(b.browser_snapshot(task_id="t1"))
        out["again"] = json.loads(b.browser_navigate("http://127.0.0.1:9/two", task_id="t1"))
        b.cleanup_browser("t1")
        print(json.dumps(out))
    """
    try:
        done = subprocess.run([str(hermes_python), "-c", textwrap.dedent(code)], capture_output=True, text=True,
                              timeout=120, env=hermetic_env(home, hermes_python, env), cwd=home)
    finally:
        stub.stop()
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["ok"] and got["nav"]["success"] and a.canaries["browser_record"] in got["nav"]["snapshot"]
    assert got["typed"]["success"] and "hello note" in got["snap"]["snapshot"]
    assert f"opened for {a.canaries['browser_user']}" in got["snap"]["snapshot"]
    assert got["again"]["success"] and got["again"]["url"] == "http://127.0.0.1:9/two"
    seen = stub.snapshot()
    assert [(r.method, r.path.split("?")[0]) for r in seen][:3] == [
        ("POST", "/tabs"), ("GET", "/health"), ("GET", "/tabs/alpha-tab-1/snapshot")]
    assert ("POST", "/tabs/alpha-tab-1/navigate") in [(r.method, r.path) for r in seen]
    assert all(a.canaries["browser_user"] in (r.path + r.body.decode()) for r in seen if r.path != "/health")
    assert not any(r.wrong_key for r in seen)

"""The Hindsight stub answers Hermes' own Hindsight plugin and its SDK (run in the Hermes venv, cloud mode), and the
flow inspection checks its credential and bank: a planted leak must be caught, a near miss must not."""

from __future__ import annotations

import json
from pathlib import Path

from test_services import kinds, registry_with_services, run_in_hermes

from harness.core.registry import Registry
from harness.detect.checks import RawRequest
from harness.detect.engine.matcher import matcher_for
from harness.detect.flows import Route, inspect_request
from harness.drive.services.hindsight import SERVICE, HindsightStub
from harness.drive.surface import PlantContext, Where

RECALL = "/v1/default/banks/{bank}/memories/recall"


def test_the_stub_answers_hermes_hindsight_plugin(tmp_path, hermes_python):
    reg = registry_with_services(tmp_path)
    a = reg["alpha"]
    stub = HindsightStub(a).start()
    setup = SERVICE.configure(a, Where(stub.url))
    home = tmp_path / "home" / ".hermes"
    for rel, data in setup.files.items():
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_bytes(data)
    try:
        got = run_in_hermes(hermes_python, tmp_path, """
            import json
            from plugins.memory.hindsight import HindsightMemoryProvider
            p = HindsightMemoryProvider()
            p.initialize("s1")
            out = {"available": p.is_available(), "bank": p._bank_id}
            out["retain"] = json.loads(p.handle_tool_call("hindsight_retain", {"content": "note one"}))
            out["recall"] = json.loads(p.handle_tool_call("hindsight_recall", {"query": "note"}))
            out["reflect"] = json.loads(p.handle_tool_call("hindsight_reflect", {"query": "note"}))
            p.queue_prefetch("what do you know")
            if p._prefetch_thread is not None:  # Hermes waits 3 s for it; a loaded machine may need longer
                p._prefetch_thread.join(60)
            out["prefetch"] = p.prefetch("what do you know")
            p.sync_turn("hello", "hi there")
            p._retain_queue.join()
            p.shutdown()
            print(json.dumps(out))
        """, {"HINDSIGHT_API_KEY": a.canaries["hindsight_key"]})
    finally:
        stub.stop()
    bank = a.canaries["hindsight_bank"]
    assert got["available"] and got["bank"] == bank
    assert got["retain"] == {"result": "Memory stored successfully."}
    assert a.canaries["hindsight_record"] in got["recall"]["result"] and "note one" in got["recall"]["result"]
    assert a.canaries["hindsight_record"] in got["reflect"]["result"]
    assert a.canaries["hindsight_record"] in got["prefetch"]
    seen = stub.snapshot()
    base = f"/v1/default/banks/{bank}"
    assert [r.path for r in seen] == [f"{base}/memories", f"{base}/memories/recall", f"{base}/reflect",
                                      f"{base}/memories/recall", "/version", f"{base}/memories"]
    assert {r.status for r in seen} == {200} and not any(r.wrong_key for r in seen)
    assert all(r.headers["authorization"] == f"Bearer {a.canaries['hindsight_key']}" for r in seen)
    sync = json.loads(seen[-1].body)
    assert sync["items"][0]["update_mode"] == "append" and "hello" in sync["items"][0]["content"]


def _bank_request(reg: Registry, key_of: str, bank_of: str, bank: str | None = None):
    """A recall at alpha's Hindsight with `key_of`'s key, for `bank_of`'s bank (or `bank`)."""
    bank = bank or reg[bank_of].canaries["hindsight_bank"]
    headers = [("Authorization", f"Bearer {reg[key_of].canaries['hindsight_key']}")]
    raw = RawRequest("f1", "POST", RECALL.format(bank=bank), headers, json.dumps({"query": "q"}).encode())
    route = Route("reverse", listen_port=reg["alpha"].services["hindsight"].listen)
    return inspect_request(reg, matcher_for(reg), route, raw)


def test_its_own_key_and_bank_are_clean(tmp_path):
    reg = registry_with_services(tmp_path)
    assert _bank_request(reg, "alpha", "alpha").findings == []


def test_another_tenants_key_is_wrong_key_and_its_bank_wrong_identity(tmp_path):
    reg = registry_with_services(tmp_path)
    assert kinds(_bank_request(reg, "default", "alpha")) == [("wrong_key", "default", "hindsight_key", "hindsight")]
    assert kinds(_bank_request(reg, "alpha", "default")) == [
        ("wrong_identity", "default", "hindsight_bank", "hindsight")]


def test_a_near_miss_bank_is_nothing(tmp_path):
    reg = registry_with_services(tmp_path)
    near = reg["default"].canaries["hindsight_bank"][:-2]
    assert _bank_request(reg, "alpha", "default", near).findings == []


def test_the_bank_plant_puts_the_donors_bank_in_the_targets_config(tmp_path):
    reg = registry_with_services(tmp_path)
    d, a = reg["default"], reg["alpha"]
    home = tmp_path / "alpha-home"
    (home / "hindsight").mkdir(parents=True)
    (home / "hindsight" / "config.json").write_bytes(SERVICE.configure(a, Where("http://127.0.0.1:9")).files[
        "hindsight/config.json"])
    SERVICE.plants["hindsight-bank"].action(PlantContext(d, a, home, "", ""))
    assert json.loads((home / "hindsight" / "config.json").read_text())["bank_id"] == d.canaries["hindsight_bank"]


def test_a_foreign_bank_holds_no_record(tmp_path: Path):
    reg = registry_with_services(tmp_path)
    stub = HindsightStub(reg["alpha"])
    other = reg["default"].canaries["hindsight_bank"]
    assert stub.route("POST", RECALL.format(bank=other), {"query": "q"}) == (200, {"results": []})
    own = stub.route("POST", RECALL.format(bank=reg["alpha"].canaries["hindsight_bank"]), {"query": "q"})[1]
    assert reg["alpha"].canaries["hindsight_record"] in own["results"][0]["text"]

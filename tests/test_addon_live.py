"""A real `mitmdump -s addons/tenancy.py` with two reverse listeners in front of two stubs (no Hermes)."""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from mitmproxy import io

from harness.capture.stubs.provider import StubProvider
from harness.core.protocol import FLOW_HEADER
from harness.core.registry import Registry, mint
from harness.detect.engine.matcher import Matcher
from harness.detect.flows import inspect_flow

ROOT = Path(__file__).resolve().parent.parent
ADDON = ROOT / "addons" / "tenancy.py"
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def mitmdump_argv() -> list[str]:
    sibling = Path(sys.executable).parent / "mitmdump"
    if sibling.exists():
        return [str(sibling)]
    return [sys.executable, "-c", "from mitmproxy.tools.main import mitmdump; mitmdump()"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen, log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"mitmdump exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"mitmdump did not listen on {port}: {log.read_text()[-2000:]}")


def post(port: int, body: dict | bytes, key: str | None, headers: dict | None = None):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = {"content-type": "application/json"} | ({"authorization": f"Bearer {key}"} if key else {})
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data, hdrs | (headers or {}))
    return NO_PROXY.open(req, timeout=30)


def status(port: int, body: dict | bytes, key: str | None, headers: dict | None = None) -> int:
    try:
        with post(port, body, key, headers) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code


def main_turn(reg: Registry, name: str, **over) -> dict:
    return {"model": reg[name].model, "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "terminal"}}]} | over


def test_live_mitmdump_two_reverse_listeners(tmp_path: Path):
    ports = {"alpha": free_port(), "beta": free_port()}
    reg = mint(list(ports), tmp_path / "work", {n: {"listen": p} for n, p in ports.items()})
    stubs = {"alpha": StubProvider(reg["alpha"], chunk_delay=0.2, mode="strict").start(),
             "beta": StubProvider(reg["beta"]).start()}
    for name, stub in stubs.items():
        reg[name].upstream = stub.url
    reg.save(tmp_path / "registry.yaml")
    ledger, flows, log = tmp_path / "ledger.jsonl", tmp_path / "flows.mitm", tmp_path / "mitmdump.log"
    argv = [*mitmdump_argv(), "-s", str(ADDON), "--set", f"confdir={tmp_path / 'conf'}",
            "--set", f"tenancy_registry={tmp_path / 'registry.yaml'}", "--set", f"tenancy_ledger={ledger}",
            "-w", str(flows), "--set", "listen_host=127.0.0.1"]
    for name, port in ports.items():
        argv += ["--mode", f"reverse:{stubs[name].url}@{port}"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})  # the addon of this checkout
    try:
        for port in ports.values():
            wait_listening(port, proc, log)
        a, b = ports["alpha"], ports["beta"]

        with post(a, main_turn(reg, "alpha"), reg["alpha"].key) as resp:  # clean JSON main turn
            assert json.load(resp)["choices"][0]["message"]["tool_calls"]

        arrivals = []  # clean SSE main turn: chunks must arrive as the stub sends them (0.2 s apart)
        with post(a, main_turn(reg, "alpha", stream=True), reg["alpha"].key) as resp:
            for line in resp:
                if line.startswith(b"data:"):
                    arrivals.append(time.monotonic())
        assert len(arrivals) >= 5 and arrivals[-1] - arrivals[0] > 0.6
        assert arrivals[1] - arrivals[0] > 0.1  # not buffered into one burst

        # gzip request bodies: the addon decodes them (the stub does not, and answers 400)
        gz = {"content-encoding": "gzip"}
        clean = gzip.compress(json.dumps({"model": reg["beta"].model, "messages": []}).encode())
        assert status(b, clean, reg["beta"].key, gz) == 400
        leak = gzip.compress(json.dumps({"messages": [{"content": reg["alpha"].canaries["soul"]}]}).encode())
        assert status(b, leak, reg["beta"].key, gz) == 400
        assert status(a, main_turn(reg, "alpha"), reg["beta"].key) == 401  # alpha's listener, beta's key
        with pytest.raises(urllib.error.HTTPError) as probe:  # an unauthenticated local-server probe
            NO_PROXY.open(f"http://127.0.0.1:{a}/api/tags", timeout=10)
        probe.value.close()

        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=20) == 0, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        for stub in stubs.values():
            stub.stop()

    lines = [json.loads(x) for x in ledger.read_text().splitlines()]
    assert [(x["tenant"], x["kind"], x["status"]) for x in lines] == [
        ("alpha", "main", 200), ("alpha", "main", 200), ("beta", "aux", 400), ("beta", "aux", 400),
        ("alpha", "main", 401), ("alpha", "probe", 404),
    ]
    assert [[f["kind"] for f in x["findings"]] for x in lines] == [[], [], [], ["request_leak"], ["wrong_key"], []]
    assert lines[1]["streamed"] is True and lines[3]["findings"][0]["encoding"] == "gzip"
    assert lines[4]["findings"][0]["victim"] == "beta" and lines[4]["bearer"] == "foreign"
    stub_flows = sorted(r.flow_id or "" for s in stubs.values() for r in s.snapshot())
    assert stub_flows == sorted(x["flow"] for x in lines)  # every request the stubs saw passed the proxy

    with open(flows, "rb") as fh:
        saved = list(io.FlowReader(fh).stream())
    assert [f.id for f in saved] == [x["flow"] for x in lines]
    assert [bool(f.marked) for f in saved] == [False, False, False, True, True, False]
    assert saved[3].comment.startswith("tenancy: request_leak: alpha's soul in beta's request [gzip]")
    assert saved[4].metadata["tenancy"]["findings"][0]["kind"] == "wrong_key"
    sse = saved[1].response.content
    assert sse.startswith(b"data: {") and sse.rstrip().endswith(b"data: [DONE]")
    assert all(f.request.headers[FLOW_HEADER] == f.id for f in saved)
    matcher = Matcher.for_registry(reg)
    for f, line in zip(saved, lines, strict=True):  # the reconciler's re-inspection agrees with the live one
        assert inspect_flow(reg, matcher, f).ledger_entry() | {"time": line["time"]} == line


@pytest.mark.parametrize("problem", ["missing", "invalid"])
def test_a_bad_registry_at_startup_is_one_error_line_not_a_traceback(tmp_path: Path, problem: str):
    registry = tmp_path / "registry.yaml"
    if problem == "invalid":
        registry.write_text("tenants: [unclosed\n")
    argv = [*mitmdump_argv(), "-q", "-s", str(ADDON), "--set", f"confdir={tmp_path / 'conf'}",
            "--set", f"tenancy_registry={registry}", "--mode", f"reverse:http://127.0.0.1:9@127.0.0.1:{free_port()}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the addon of this checkout
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if "tenancy_registry" in line]
    assert len(errors) == 1 and "registry" in errors[0], output

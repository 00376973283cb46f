"""Bad input through the real CLI: a one-line error naming the problem, exit 2, no traceback, nothing
half-written, nothing outside the output folder touched. Also: the redacted evidence copy."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mitmproxy import http, io
from mitmproxy.io import tnetstring
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import tflow

from harness.core.registry import Registry, mint
from harness.core.registry_file import load
from harness.detect import scan
from harness.detect.reconcile import read_flows, reconcile
from harness.report.redact import redacted_registry, write_redacted

CLI = [sys.executable, "-m", "harness.cli"]
PORTS = {"alpha": 18101, "beta": 18102}


def tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*")}


def fails_cleanly(tmp_path: Path, *args: str, code: int = 2) -> str:
    """Run the CLI; it must fail with one line on stderr, write nothing to stdout, create no --out and
    touch nothing else under tmp_path. Returns the error line."""
    before = tree(tmp_path)
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == code, done
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("tenancy-audit: ") and not done.stdout, done
    assert tree(tmp_path) == before  # nothing half-written, nothing outside --out touched
    return done.stderr.strip()


@pytest.fixture
def reg() -> Registry:
    registry = mint(list(PORTS), Path("/nonexistent/work"), {n: {"listen": p} for n, p in PORTS.items()})
    for name, port in PORTS.items():
        registry[name].upstream = f"http://127.0.0.1:{port + 1000}"
    return registry


def chat_flow(reg: Registry, tenant: str, body: bytes, headers: dict[str, str] | None = None) -> http.HTTPFlow:
    port = PORTS[tenant]
    hdrs = {"content-type": "application/json", "authorization": f"Bearer {reg[tenant].key}"} | (headers or {})
    f = tflow.tflow(req=http.Request.make("POST", f"http://127.0.0.1:{port + 1000}/v1/chat/completions", b"", hdrs),
                    resp=True)
    f.request.raw_content = body
    f.client_conn.proxy_mode = ProxyMode.parse(f"reverse:http://127.0.0.1:{port + 1000}@{port}")
    return f


def write_flows(path: Path, flows: list[http.HTTPFlow]) -> bytes:
    with path.open("wb") as fh:
        writer = io.FlowWriter(fh)
        for f in flows:
            writer.add(f)
    return path.read_bytes()


# --- registry ----------------------------------------------------------------------------------------------


def _registry_cases(reg: Registry) -> dict[str, tuple[bytes, str]]:
    good = yaml.safe_dump(reg.to_dict(), sort_keys=False)
    doc = reg.to_dict()
    unknown = json.loads(json.dumps(doc))
    unknown["tenants"]["alpha"]["extra"] = 1
    shared = json.loads(json.dumps(doc))
    shared["tenants"]["beta"]["key"] = doc["tenants"]["alpha"]["key"]
    huge = json.loads(json.dumps(doc))
    huge["tenants"]["alpha"]["canaries"]["memory"] = "m" * 5000
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(  # billion laughs: 9**9 x's if expanded
        f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    dup = good.replace("tenants:\n", "tenants:\n  beta: {key: x, model: y, route: {listen: 1}}\n", 1)
    return {
        "malformed": (b"version: 1\ntenants: [\n", "not valid YAML"),
        "truncated": (good[: good.index("listen:")].encode(), "field 'route' must be"),
        "unknown-field": (yaml.safe_dump(unknown).encode(), "unknown field 'extra'"),
        "duplicate-value": (yaml.safe_dump(shared).encode(), "same value as tenant 'alpha'"),
        "duplicate-key": (dup.encode(), "duplicate key 'beta'"),
        "huge-value": (yaml.safe_dump(huge).encode(), "longer than 4096 characters"),
        "huge-file": (good.encode() + b"#" * (5 * 1024 * 1024), "bytes, more than"),
        "anchor-bomb": (bomb.encode(), "YAML aliases are not allowed"),
        "not-utf8": (b"\xff\xfe\x00v\x00e\x00r", "is not UTF-8 text"),
        "not-a-mapping": (b"- version\n- tenants\n", "top level must be a mapping"),
    }


@pytest.mark.parametrize("case", ["malformed", "truncated", "unknown-field", "duplicate-value", "duplicate-key",
                                  "huge-value", "huge-file", "anchor-bomb", "not-utf8", "not-a-mapping"])
def test_bad_registry_is_a_one_line_error(tmp_path, reg, case):
    data, expected = _registry_cases(reg)[case]
    (tmp_path / "registry.yaml").write_bytes(data)
    write_flows(tmp_path / "flows.mitm", [chat_flow(reg, "alpha", b"{}")])
    err = fails_cleanly(tmp_path, "reconcile", "--registry", "registry.yaml", "--flows", "flows.mitm", "--out", "out")
    assert err.startswith("tenancy-audit: registry:") and expected in err, err
    err = fails_cleanly(tmp_path, "scan", "--registry", "registry.yaml", "flows.mitm")
    assert expected in err


# --- flow files --------------------------------------------------------------------------------------------


def _newer(reg: Registry) -> bytes:
    state = chat_flow(reg, "alpha", b"{}").get_state()
    state["version"] = 99
    return tnetstring.dumps(state)


@pytest.mark.parametrize(("case", "expected"), [
    ("empty", "is empty (no flow was recorded)"),
    ("missing", "cannot read"),
    ("text", "is not a readable mitmproxy flow file"),
    ("json", "is not a readable mitmproxy flow file"),
    ("cut-in-first-flow", "is not a readable mitmproxy flow file"),
    ("newer-mitmproxy", "cannot read files with flow format version 99, please update mitmproxy"),
])
def test_bad_flow_file_is_a_one_line_error(tmp_path, reg, case, expected):
    reg.save(tmp_path / "registry.yaml")
    good = write_flows(tmp_path / "good.mitm", [chat_flow(reg, "alpha", b"{}")])
    data = {"empty": b"", "text": b"hello, not flows\n", "json": b'{"log": 1}', "cut-in-first-flow": good[:200],
            "newer-mitmproxy": _newer(reg)}.get(case)
    if data is not None:
        (tmp_path / "flows.mitm").write_bytes(data)
    err = fails_cleanly(tmp_path, "reconcile", "--registry", "registry.yaml", "--flows", "flows.mitm", "--out", "out")
    assert err.startswith("tenancy-audit: flows:") and expected in err, err


def test_truncated_flow_file_reads_back_to_the_last_complete_flow(tmp_path, reg):
    reg.save(tmp_path / "registry.yaml")
    whole = write_flows(tmp_path / "flows.mitm", [chat_flow(reg, "alpha", b"{}") for _ in range(3)])
    (tmp_path / "flows.mitm").write_bytes(whole[: len(whole) - 100])
    flows, reason = read_flows(tmp_path / "flows.mitm")
    assert len(flows) == 2 and reason and "truncated after 2 complete flows" in reason
    done = subprocess.run([*CLI, "reconcile", "--registry", "registry.yaml", "--flows", "flows.mitm"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 3 and "truncated after 2 complete flows" in done.stdout, done  # never clean


# --- Hermes installs and output folders ---------------------------------------------------------------------


def test_missing_hermes_install(tmp_path):
    err = fails_cleanly(tmp_path, "run", "--hermes-python", "/nonexistent/python", "--out", "out")
    assert "Hermes python /nonexistent/python does not exist" in err


def test_python_without_hermes(tmp_path):
    err = fails_cleanly(tmp_path, "run", "--hermes-python", sys.executable, "--out", "out")
    assert "is broken" in err and "ModuleNotFoundError" in err, err


def test_hermes_python_that_cannot_run(tmp_path):
    (tmp_path / "python").write_text("not a program\n")
    err = fails_cleanly(tmp_path, "run", "--hermes-python", str(tmp_path / "python"), "--out", "out")
    assert "cannot be run: Permission denied" in err, err


@pytest.mark.parametrize("force", [False, True])
def test_output_folder_not_empty_is_refused(tmp_path, force):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    err = fails_cleanly(tmp_path, "run", "--hermes-python", sys.executable, "--out", "out",
                        *(["--force"] if force else []))
    assert ("is not an evidence folder; refusing to empty it" if force else "exists and is not empty") in err
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


# --- the redacted copy --------------------------------------------------------------------------------------


def test_redacted_copy_has_no_secret_and_still_reconciles_to_the_same_findings(tmp_path, reg):
    out = tmp_path / "ev"
    out.mkdir()
    reg.save(out / "registry.yaml")
    beta_key = reg["beta"].key
    leak = gzip.compress(json.dumps({"messages": [{"role": "user", "content": f"x {beta_key} y"}]}).encode())
    flows = [chat_flow(reg, "alpha", b'{"messages": []}'),
             chat_flow(reg, "alpha", leak, {"content-encoding": "gzip", "x-leak": beta_key})]
    flows[1].comment = f"tenancy: {beta_key}"
    write_flows(out / "flows.mitm", flows)
    (out / "ledger.jsonl").write_text(json.dumps({"bearer": reg["alpha"].key}) + "\n")
    (out / "report.md").write_text(f"alpha {reg['alpha'].canaries['api_server_key']}\n")
    dest = write_redacted(out, reg)
    assert sorted(p.name for p in dest.iterdir()) == ["flows.mitm", "ledger.jsonl", "registry.yaml", "report.md"]
    assert scan.scan_paths([out], reg, None).findings  # the original holds secrets ...
    assert scan.scan_paths([dest], reg, None).findings == []  # ... the copy none, in any encoding
    assert "<alpha:key>" in (dest / "ledger.jsonl").read_text()
    assert "<alpha:api_server_key>" in (dest / "report.md").read_text()
    original = reconcile(reg, out / "flows.mitm")
    copy = reconcile(load(dest / "registry.yaml"), dest / "flows.mitm")
    assert copy.flows == original.flows == 2
    assert [(f.kind, f.victim, f.seen_in, f.canary) for f in copy.findings] == [
        (f.kind, f.victim, f.seen_in, f.canary) for f in original.findings]
    assert ("request_leak", "beta", "alpha", "key") in {(f.kind, f.victim, f.seen_in, f.canary) for f in copy.findings}
    assert redacted_registry(reg)["beta"].key == "<beta:key>"

"""The ecosystem around one real planted-leak audit: report.html in headless Chromium, SARIF, mitmweb filters
on the real flows.mitm, and the redacted HAR / flow export."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from collections import Counter
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest
from mitmproxy import flowfilter

from harness import cli
from harness.core.findings import Finding
from harness.core.registry_file import load
from harness.detect.engine import stream
from harness.detect.engine.matcher import matcher_for
from harness.detect.reconcile import read_flows
from harness.options import RunOptions
from harness.run import run_audit

pytestmark = pytest.mark.e2e

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def planted(tmp_path_factory, hermes_python) -> tuple[Path, dict]:
    """One audit of real Hermes with default's memory planted into alpha's home."""
    result = run_audit(RunOptions(plants=["memory"], out=tmp_path_factory.mktemp("planted") / "evidence",
                                  hermes_python=hermes_python, quiet=True))
    assert result.out is not None
    doc = json.loads((result.out / "findings.json").read_text())
    assert result.verdict.exit_code == 1 and doc["verdict"] == "leak", doc["reasons"]
    return result.out, doc


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("chromium is not installed: ./tenancy test installs Debian's package (apt-get install chromium)",
                    pytrace=False)
    argv = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}", *args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


class Cells(HTMLParser):
    """The matrix cells and the verdict banner of a rendered report."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[tuple[str, str], int] = {}
        self.verdict = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "td" and "data-victim" in a:
            self.cells[(a["data-victim"] or "", a["data-seen-in"] or "")] = int(a["data-count"] or 0)
        if a.get("id") == "verdict":
            self.verdict = a.get("data-verdict") or ""


def test_report_html_renders_the_planted_leak_in_chromium(planted, tmp_path):
    out, doc = planted
    url = (out / "report.html").as_uri()
    dom = chromium(tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-500:]
    cells = Cells()
    cells.feed(dom.stdout.decode())
    assert cells.verdict == "leak"
    crossed = sum(1 for f in doc["findings"] if (f["victim"], f["seen_in"]) == ("default", "alpha"))
    assert crossed >= 2  # the memory reaches alpha's requests and alpha's files
    assert cells.cells == {("default", "alpha"): crossed, ("alpha", "default"): 0}
    shot = tmp_path / "report.png"
    rendered = chromium(tmp_path, "--window-size=1280,1000", f"--screenshot={shot}", url)
    assert rendered.returncode == 0, rendered.stderr[-500:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_sarif_matches_the_findings(planted):
    out, doc = planted
    sarif = json.loads((out / "findings.sarif").read_text())
    results = sarif["runs"][0]["results"]
    incidents = {i["id"]: i for i in doc["incidents"]}
    assert [r["partialFingerprints"]["tenancyIncident/v1"] for r in results] == list(incidents)
    assert [r["partialFingerprints"]["tenancyFingerprint/v3"] for r in results] == [
        i["first"]["fingerprint"] for i in incidents.values()]
    every = doc["findings"] + doc["known"] + doc["allowed"]  # an incident holds its allowed classes too
    assert {fp for r in results for fp in r["properties"]["classes"]} == {f["fingerprint"] for f in every}
    allowed = {i["id"] for i in doc["incidents"] if i["allowed"]}
    assert allowed, "the battery's file tools write at other homes, which the hermes policy allows"
    for r in results:
        justification = (r.get("suppressions") or [{}])[0].get("justification", "")
        assert ("isolation policy" in justification) == (r["partialFingerprints"]["tenancyIncident/v1"] in allowed)
    for r in results:
        for loc in r["locations"] + r["relatedLocations"]:
            uri = loc["physicalLocation"]["artifactLocation"]["uri"]
            assert (out / uri).is_file(), uri  # every location resolves inside the evidence folder


def test_a_plant_run_is_labelled_a_negative_control(planted):
    out, doc = planted
    assert doc["plants"] == ["memory"]
    assert "LEAK (negative control)" in (out / "report.html").read_text()
    assert "**Negative control**" in (out / "report.md").read_text()


def test_reconcile_of_the_folder_reproduces_the_run_and_every_file_agrees_on_fingerprints(planted, tmp_path,
                                                                                          capsys):
    out, doc = planted
    capsys.readouterr()
    assert cli.main(["reconcile", str(out), "--json"]) == doc["exit_code"] == 1
    again = json.loads(capsys.readouterr().out)
    for key in ("verdict", "exit_code", "counts", "counts_by_kind", "reasons", "fixed", "plants", "incidents",
                "findings", "known"):
        assert again[key] == doc[key], key
    # the ledger is judged live, before the policy: an allowed finding has its strict (unscoped) fingerprint there
    unscoped = {replace(Finding.from_dict(f), scope="").fingerprint() for f in doc["allowed"]}
    run_fps = {f["fingerprint"] for f in doc["findings"]} | unscoped
    ledger = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    ledger_fps = {f["fingerprint"] for line in ledger for f in line["findings"]}
    assert ledger_fps and ledger_fps <= run_fps  # the ledger holds the flow findings (not homes, env, logs)
    assert all(line["scenario"] == "oneshot" for line in ledger)
    har = tmp_path / "run.har"
    assert cli.main(["export", str(out), "--har", str(har)]) == 0
    har_fps = {f["fingerprint"] for e in json.loads(har.read_text())["log"]["entries"]
               for f in e["_tenancy"]["findings"]}
    assert har_fps == ledger_fps


def test_mitmweb_filters_on_the_real_flow_file(planted):
    out, doc = planted
    flows, truncated = read_flows(out / "flows.mitm")
    assert truncated is None and flows

    def count(expr: str) -> int:
        match = flowfilter.parse(expr)
        return sum(1 for f in flows if match(f))

    flagged = [f for f in flows if f.metadata["tenancy"]["flagged"]]
    assert flagged and all(f.comment.startswith("tenancy: ") for f in flagged)
    assert count("~marked") == count("~meta \"'flagged': True\"") == len(flagged)
    assert count("~meta tenancy") == len(flows)
    per_tenant = {t: count(f"~meta \"'tenant': '{t}'\"") for t in ("default", "alpha")}
    assert all(per_tenant.values()) and sum(per_tenant.values()) == len(flows)
    assert count("~meta \"'tenant': 'alpha'\" & ~marked") == len(flagged)  # the leak rode on alpha's flows
    first = Counter(f.metadata["tenancy"]["findings"][0]["kind"] for f in flagged)
    assert first["request_leak"]  # and on alpha's requests; a memory service's answer may hold it alone
    assert {kind: count(f"~comment {kind}") for kind in first} == first  # a comment names its first finding
    # the live marks and findings are reconcile's (the run's findings), flow for flow
    live = {f.id: {_what(x) for x in f.metadata["tenancy"]["findings"]} for f in flagged}
    reconciled: dict[str, set[tuple[str, str, str]]] = {}
    for x in doc["findings"] + doc["known"] + doc["allowed"]:
        if x["location"].startswith("flow:"):
            reconciled.setdefault(x["location"].split(":")[1], set()).add(_what(x))
    assert live == reconciled


def _what(finding: dict) -> tuple[str, str, str]:
    return finding["kind"], finding["canary"], finding["location"]


def test_export_har_and_flows_hold_no_canary(planted, tmp_path, capsys):
    out, doc = planted
    har_path, mitm_path = tmp_path / "flows.har", tmp_path / "redacted.mitm"
    assert cli.main(["export", str(out), "--har", str(har_path), "--flows", str(mitm_path)]) == 0
    matcher = matcher_for(load(out / "registry.yaml"))
    assert stream.scan_bytes((out / "flows.mitm").read_bytes(), matcher)  # the original holds canaries
    assert stream.scan_bytes(har_path.read_bytes(), matcher) == []
    assert stream.scan_bytes(mitm_path.read_bytes(), matcher) == []
    har = json.loads(har_path.read_text())
    entries = har["log"]["entries"]
    assert har["log"]["version"] == "1.2" and har["log"]["creator"]["name"] == "tenancy-audit"
    assert len(entries) == doc["inspected"]["flows"]
    for e in entries:
        assert {"startedDateTime", "time", "request", "response", "cache", "timings"} <= set(e)
        assert {"method", "url", "httpVersion", "cookies", "headers", "queryString"} <= set(e["request"])
        for h in e["request"]["headers"]:  # every credential header: a placeholder of a secret kind
            if h["name"].lower() in ("authorization", "x-api-key", "api-key"):
                assert re.fullmatch(r"(Bearer )?<(default|alpha):\w*key>|<redacted>", h["value"]), h["value"]
    assert sum(1 for e in entries if e.get("comment", "").startswith("tenancy: ")) == sum(
        1 for e in entries if e["_tenancy"]["flagged"]) > 0
    redacted, _ = read_flows(mitm_path)
    original, _ = read_flows(out / "flows.mitm")
    assert [f.id for f in redacted] == [f.id for f in original]
    assert [bool(f.marked) for f in redacted] == [bool(f.marked) for f in original]
    assert stat_mode(har_path) == stat_mode(mitm_path) == 0o600


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777

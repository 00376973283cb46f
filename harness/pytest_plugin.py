"""pytest plugin (entry point `pytest11: tenancy`): write your own tenancy scenarios as tests.

Fixtures:
- `hermes_python`: the Hermes install under test (`--hermes-python`, `$TENANCY_HERMES_PYTHON`, else the
  checkout's `.hermes-venv` or, installed, the pinned release in the cache); a missing install FAILS the test,
  it is never skipped.
- `tenancy_audit`: run a whole audit (`tenancy_audit(scenario="oneshot", plants=[...])`) into a tmp
  evidence folder and get an `Audit` back (exit code, findings.json, folder).
- `tenancy_session`: the test's `harness.session.AuditSession` (listeners, registry, stubs, mitmdump), the
  same set-up as `run`'s; whatever it started is stopped after the test.
- `tenancy_registry`: a fresh two-tenant registry (`tenancy_registry(n)` for more), saved to tmp, each
  tenant's home in the test's sandbox; its ports are bound at once by the session and handed to mitmdump by
  `tenancy_proxy`, so none can be taken in between.
- `tenancy_proxy`: stubs plus a running mitmdump with the addon in front of them (`TenancyProxy`: registry,
  ports, flows path, `base_url(tenant)`, `check(turns)`); torn down after the test. Tenants: 2, or
  `@pytest.mark.tenancy(tenants=N)`.
- `tenant_homes`: every tenant's Hermes home written for `tenancy_proxy` (tenant -> home).
- `hermes`: a `harness.drive.hermes.agent.Hermes` driver on the test's sandbox (`hermes.oneshot(tenant, prompt)`).
Helpers: `assert_isolated(audit_or_check_or_findings)` raises `IsolationError` (an `AssertionError`) with
one line per finding class and every inconclusive reason as the message; `assert_reproduced(audit)` that
`tenancy-audit reconcile` of the audit's folder reaches its verdict, incidents and fingerprints again.
docs/usage.md documents the objects these give (`Audit`, `TenancyProxy`, `Registry`/`Tenant`,
`Reconciliation`) with an example.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.capture.proxy import Proxy
from harness.capture.stubs.provider import StubProvider
from harness.core.files import STUB_LOG
from harness.core.findings import Finding
from harness.core.procs import ProcessSet
from harness.core.record import RunRecord
from harness.core.registry import Registry
from harness.detect.reconcile import LogSource, Reconciliation, reconcile
from harness.drive.hermes.agent import Hermes, Sandbox, TurnResult, write_home
from harness.options import RunOptions
from harness.options import hermes_python as resolve_hermes_python
from harness.report.result import groups
from harness.run import run_audit
from harness.session import AuditSession, tenant_names


@dataclass
class Audit:
    """The outcome of one audit run by the `tenancy_audit` fixture."""

    code: int
    out: Path
    doc: dict[str, Any]

    @property
    def findings(self) -> list[Finding]:
        return [Finding.from_dict(d) for d in self.doc["findings"]]

    @property
    def kinds(self) -> set[str]:
        return {f.kind for f in self.findings}

    @property
    def verdict(self) -> str:
        return self.doc["verdict"]

    def reconcile(self) -> tuple[int, dict[str, Any]]:
        """`tenancy-audit reconcile` of its folder in a new process (with the run's baseline copy): exit code and
        findings.json document."""
        done = subprocess.run([sys.executable, "-m", "harness.cli", "reconcile", str(self.out), "--json"],
                              capture_output=True, text=True, timeout=600)
        if done.returncode not in (0, 1, 3):
            raise AssertionError(f"reconcile of {self.out} failed: {done.stderr.strip()}")
        return done.returncode, json.loads(done.stdout)


@dataclass
class TenancyProxy:
    """Stubs and mitmdump with the tenancy addon, for one test; `check()` stops it and reconciles."""

    session: AuditSession

    @property
    def registry(self) -> Registry:
        return self.session.require_registry()

    @property
    def registry_path(self) -> Path:
        return self.session.registry_path

    @property
    def out(self) -> Path:
        return self.session.out

    @property
    def stubs(self) -> dict[str, StubProvider]:
        return self.session.stubs

    @property
    def proxy(self) -> Proxy:
        assert self.session.proxy is not None, "mitmdump was not started"
        return self.session.proxy

    @property
    def ports(self) -> dict[str, int]:
        return {t.name: t.listen for t in self.registry if t.listen is not None}

    @property
    def flows_path(self) -> Path:
        return self.proxy.flows_path

    def base_url(self, tenant: str) -> str:
        return self.proxy.base_url(tenant)

    def check(self, turns: Iterable[TurnResult] = ()) -> Reconciliation:
        """Stop the proxy (the flow file is then complete) and every child of the test (the homes no longer
        change), then reconcile flows, stubs, homes and the turns' logs; each completed turn must have
        produced an env snapshot, a failed turn is a reason."""
        turns = list(turns)
        teardown = self.session.finish()
        want: dict[str, int] = {}
        for t in turns:
            want[t.tenant] = want.get(t.tenant, 0) + t.ok
        rec = reconcile(self.registry, self.flows_path, homes={t.name: Path(t.home) for t in self.registry if t.home},
                        logs=[LogSource(t.log, t.tenant) for t in turns if t.log is not None],
                        stub_log=self.out / STUB_LOG, record=RunRecord(expect_snapshots=want))
        rec.reasons += [f"{t.driver} turn of {t.tenant} failed: {t.detail}" for t in turns if not t.ok]
        rec.reasons += teardown
        return rec


class IsolationError(AssertionError):
    """Tenants were not proven isolated: `findings` (every occurrence) and `reasons` (why the check was not
    conclusive) say why; the message has one line per finding class (fingerprint) and per reason."""

    def __init__(self, findings: list[Finding], reasons: list[str]) -> None:
        self.findings, self.reasons = findings, reasons
        lines = [g.line() for g in groups(findings)] + [f"inconclusive: {r}" for r in reasons]
        super().__init__("tenants not proven isolated:\n  " + "\n  ".join(lines))


def assert_isolated(result: Audit | Reconciliation | Iterable[Finding]) -> None:
    """Raise `IsolationError` (an AssertionError) when there is any finding or inconclusive reason."""
    __tracebackhide__ = True  # pytest shows the test's line, not this helper's
    if isinstance(result, Audit):
        findings, reasons = result.findings, list(result.doc["reasons"])
    elif isinstance(result, Reconciliation):
        findings, reasons = list(result.findings), list(result.reasons)
    else:
        findings, reasons = list(result), []
    if findings or reasons:
        raise IsolationError(findings, reasons)


#: What `reconcile` of an evidence folder must give exactly as its run did.
REPRODUCED = ("verdict", "counts", "counts_by_kind", "reasons", "fixed", "incidents", "findings", "known", "allowed")


def assert_reproduced(audit: Audit) -> None:
    """Raise an AssertionError naming the first part of findings.json (verdict, incidents, findings with their
    fingerprints, ...) that `reconcile` of the audit's folder does not reach again."""
    __tracebackhide__ = True
    code, again = audit.reconcile()
    differ = [key for key in REPRODUCED if again[key] != audit.doc[key]]
    if code != audit.code or differ:
        raise AssertionError(f"reconcile of {audit.out}: exit {code} (run {audit.code}); differs in {differ}")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--hermes-python", default=None, help="python of the Hermes install to audit")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "tenancy(tenants=N): how many tenants `tenancy_proxy` runs")


@pytest.fixture(scope="session")
def hermes_python(request: pytest.FixtureRequest) -> Path:
    opt = request.config.getoption("--hermes-python")
    path = resolve_hermes_python(Path(opt) if opt else None)
    if not path.exists():
        pytest.fail(f"Hermes is not installed at {path}: pass --hermes-python (or set TENANCY_HERMES_PYTHON; "
                    "in a checkout, ./tenancy test installs it)",
                    pytrace=False)
    return path


@pytest.fixture
def tenancy_audit(tmp_path: Path, hermes_python: Path) -> Callable[..., Audit]:
    counter = iter(range(1000))

    def run(**options: Any) -> Audit:
        options.setdefault("quiet", True)
        out = tmp_path / f"evidence-{next(counter)}"
        result = run_audit(RunOptions(out=out, hermes_python=hermes_python, **options))
        assert result.out is not None
        return Audit(result.verdict.exit_code, result.out, result.to_dict())

    return run


@pytest.fixture
def tenancy_sandbox(tmp_path: Path) -> Sandbox:
    """The throw-away HOME of this test's Hermes children (the first tenant is the launch profile)."""
    return Sandbox(tmp_path / "sandbox")


@pytest.fixture
def tenancy_procs() -> Iterator[ProcessSet]:
    """Every child a test starts; all of them are killed (and proven gone) after the test."""
    procs = ProcessSet()
    yield procs
    survivors = procs.close()
    assert not survivors, f"{len(survivors)} child process(es) survived teardown"


@pytest.fixture
def tenancy_session(tmp_path: Path, tenancy_sandbox: Sandbox, tenancy_procs: ProcessSet) -> Iterator[AuditSession]:
    """The test's `AuditSession` (listeners, registry, stubs, mitmdump), as `run` sets an audit up; everything
    it started is stopped after the test."""
    with AuditSession(tmp_path / "evidence", sandbox=tenancy_sandbox, registry_path=tmp_path / "registry.yaml",
                      procs=tenancy_procs) as session:
        yield session


@pytest.fixture
def tenancy_registry(tenancy_session: AuditSession) -> Callable[..., Registry]:
    def make(n: int = 2) -> Registry:
        return tenancy_session.mint(tenant_names(n))

    return make


@pytest.fixture
def tenancy_proxy(request: pytest.FixtureRequest, tenancy_session: AuditSession,
                  tenancy_registry: Callable[..., Registry]) -> TenancyProxy:
    marker = request.node.get_closest_marker("tenancy")
    tenancy_registry(marker.kwargs.get("tenants", 2) if marker else 2)
    tenancy_session.start_stubs()
    tenancy_session.start_proxy()
    return TenancyProxy(tenancy_session)


@pytest.fixture
def tenant_homes(tenancy_proxy: TenancyProxy, tenancy_sandbox: Sandbox) -> dict[str, Path]:
    """Every tenant's Hermes home (config routed through `tenancy_proxy`, .env, memory, SOUL)."""
    homes = {}
    for t in tenancy_proxy.registry:
        homes[t.name] = tenancy_sandbox.home_of(t.name)
        write_home(t, homes[t.name], tenancy_proxy.base_url(t.name), launch=t.name == tenancy_sandbox.launch)
    return homes


@pytest.fixture
def hermes(hermes_python: Path, tenancy_sandbox: Sandbox, tenancy_procs: ProcessSet, tmp_path: Path) -> Hermes:
    """The Hermes install under test, driving children in this test's sandbox."""
    driver = Hermes(hermes_python, tenancy_sandbox, tenancy_procs, tmp_path / "evidence" / "logs")
    driver.check()
    return driver

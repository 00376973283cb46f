"""pytest plugin (entry point `pytest11: tenancy`): write your own tenancy scenarios as tests.

Fixtures:
- `hermes_python`: the Hermes install under test (`--hermes-python`, `$TENANCY_HERMES_PYTHON`, or the
  bootstrap's `.hermes-venv`); a missing install FAILS the test, it is never skipped.
- `tenancy_audit`: run a whole audit (`tenancy_audit(scenario="oneshot", plants=[...])`) into a tmp
  evidence folder and get an `Audit` back (exit code, findings.json, folder).
- `tenancy_registry`: a fresh two-tenant registry (`tenancy_registry(n)` for more), saved to tmp.
Helper: `assert_isolated(audit_or_findings)` fails with every finding as the message.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.findings import Finding
from harness.proxy import free_port
from harness.registry import Registry, mint


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


def assert_isolated(result: Audit | Iterable[Finding]) -> None:
    """Fail with every finding (and every inconclusive reason) when tenants were not proven isolated."""
    findings = result.findings if isinstance(result, Audit) else list(result)
    reasons = result.doc["reasons"] if isinstance(result, Audit) else []
    if findings or reasons:
        lines = [f.summary() for f in findings] + [f"inconclusive: {r}" for r in reasons]
        pytest.fail("tenants not proven isolated:\n  " + "\n  ".join(lines), pytrace=False)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--hermes-python", default=None, help="python of the Hermes install to audit")


@pytest.fixture(scope="session")
def hermes_python(request: pytest.FixtureRequest) -> Path:
    from harness.run import hermes_python as resolve

    opt = request.config.getoption("--hermes-python")
    path = resolve(Path(opt) if opt else None)
    if not path.exists():
        pytest.fail(f"Hermes is not installed at {path}: run ./tenancy test (it bootstraps) or pass --hermes-python",
                    pytrace=False)
    return path


@pytest.fixture
def tenancy_audit(tmp_path: Path, hermes_python: Path) -> Callable[..., Audit]:
    from harness.run import RunOptions, run_audit

    counter = iter(range(1000))

    def run(**options: Any) -> Audit:
        options.setdefault("quiet", True)
        out = tmp_path / f"evidence-{next(counter)}"
        code, folder = run_audit(RunOptions(out=out, hermes_python=hermes_python, **options))
        return Audit(code, folder, json.loads((folder / "findings.json").read_text()))

    return run


@pytest.fixture
def tenancy_registry(tmp_path: Path) -> Callable[..., Registry]:
    def make(n: int = 2) -> Registry:
        from harness.run import tenant_names

        names = tenant_names(n)
        registry = mint(names, tmp_path / "work", {name: {"listen": free_port()} for name in names})
        registry.save(tmp_path / "registry.yaml")
        return registry

    return make

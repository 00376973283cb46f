"""Write an audit's report files into its evidence folder, each 0600 and atomically."""

from __future__ import annotations

import json
from pathlib import Path

from harness.core.files import REGISTRY, write_private
from harness.core.registry import RegistryError
from harness.core.registry_file import load
from harness.report import html
from harness.report.junit import junit
from harness.report.markdown import markdown
from harness.report.result import AuditResult
from harness.report.sarif import sarif


def evidence_homes(out: Path) -> dict[str, str]:
    """Tenant -> its home relative to the evidence folder (from registry.yaml there, when it has one)."""
    try:
        registry = load(out / REGISTRY)
    except RegistryError:
        return {}
    root = out.resolve()
    return {t.name: Path(t.home).resolve().relative_to(root).as_posix() for t in registry
            if t.home and Path(t.home).resolve().is_relative_to(root)}


def write_reports(out: Path, result: AuditResult) -> None:
    """findings.json, report.md, report.html, junit.xml and findings.sarif, each 0600 and written atomically."""
    write_private(out / "findings.json", json.dumps(result.to_dict(), indent=2).encode())
    write_private(out / "report.md", markdown(result).encode())
    write_private(out / "report.html", html.render(result).encode())
    write_private(out / "junit.xml", junit(result).encode())
    doc = sarif(result, out, evidence_homes(out))
    write_private(out / "findings.sarif", json.dumps(doc, indent=2).encode())

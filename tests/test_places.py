"""Where tenancy-audit keeps its files: the checkout's folders when it runs from one, else the XDG folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.core import places
from harness.core.severity import FINDINGS_DOC, docs_url
from harness.drive.hermes import install

ROOT = Path(__file__).resolve().parent.parent


def test_a_checkout_keeps_everything_in_the_checkout():
    assert places.CHECKOUT == ROOT
    assert places.certs_dir() == ROOT / "certs" and places.evidence_root() == ROOT / "evidence"
    assert install.default_python() == ROOT / ".hermes-venv" / "bin" / "python"


def test_an_install_uses_the_xdg_folders(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setattr(places, "CHECKOUT", None)
    monkeypatch.setattr(install, "CHECKOUT", None)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # not absolute: ignored, as the spec says
    assert places.certs_dir() == tmp_path / "data" / "tenancy-audit" / "certs"
    assert places.evidence_root() == tmp_path / "data" / "tenancy-audit" / "evidence"
    # without `say` (--version) the pinned Hermes in the cache is only named, not installed
    python = install.default_python()
    lock = install.find_lock(install.PIN)
    assert lock is not None and lock.committed  # keyed by its lock
    assert python == tmp_path / "home" / ".cache" / "tenancy-audit" / "hermes" / f"{install.PIN}-{lock.key}" \
        / "bin" / "python"
    assert not python.exists()
    monkeypatch.delenv("XDG_DATA_HOME")
    assert places.evidence_root() == tmp_path / "home" / ".local" / "share" / "tenancy-audit" / "evidence"


def test_the_packaged_findings_doc_is_docs_findings_md(monkeypatch: pytest.MonkeyPatch):
    """harness/core/findings.md links to docs/findings.md: the wheel ships its text, and a checkout's reports link to
    the file in docs/."""
    assert (ROOT / "harness" / "core" / "findings.md").readlink() == Path("../../docs/findings.md")
    assert FINDINGS_DOC.read_text(encoding="utf-8") == (ROOT / "docs" / "findings.md").read_text(encoding="utf-8")
    monkeypatch.delenv("TENANCY_DOCS_URL", raising=False)
    assert docs_url("wrong_key") == (ROOT / "docs" / "findings.md").as_uri() + "#wrong_key"

"""`patch-check` against real Hermes: a copy of the install with a patch that changes no behaviour (a comment in
Hermes' CLI package) runs the same audit as the install; nothing is removed or new, and the install is untouched. The
fix series applies to the locked install in order, and `patch-check --series` audits the twin it builds once."""

from __future__ import annotations

import difflib
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from harness import cli
from harness.drive.hermes import twin as twins
from harness.drive.hermes.patched import patched_copy, site_packages, targets
from harness.drive.hermes.twin import read_series

pytestmark = pytest.mark.e2e

TARGET = "hermes_cli/__init__.py"


def test_a_patch_that_changes_nothing_changes_no_incident(tmp_path, hermes_python, capsys):
    original = site_packages(hermes_python.parent.parent) / TARGET
    before = original.read_text()
    lines = before.splitlines(keepends=True)
    diff = difflib.unified_diff(lines, ["# patched by tenancy-audit's test\n", *lines], f"a/{TARGET}", f"b/{TARGET}")
    (tmp_path / "noop.patch").write_text("".join(diff))
    code = cli.main(["patch-check", str(tmp_path / "noop.patch"), "--tools", "none", "--services", "none",
                     "--hermes-python", str(hermes_python), "--out", str(tmp_path / "pc")])
    out = capsys.readouterr().out
    doc = json.loads((tmp_path / "pc" / "patch-check.json").read_text())
    assert code == 0 and doc["new"] == {} and doc["removed"] == {}, out
    assert doc["verdicts"]["patched"] == doc["verdicts"]["unpatched"] in ("clean", "leak"), doc["verdicts"]
    copied = site_packages(tmp_path / "pc" / "patched-venv") / TARGET
    assert copied.read_text().startswith("# patched by") and original.read_text() == before
    assert (tmp_path / "pc" / "patch-check.json").stat().st_mode & 0o777 == 0o600
    assert "0 crossing(s) removed" in out and "0 new" in out


def test_a_mutant_on_a_driven_surface_is_caught(tmp_path, hermes_python, capsys):
    """The memory tool's store taken from the launch profile (one mutant, beside the unmutated control): the
    audit sees the launch profile's memory in the other profile's tool result."""
    code = cli.main(["mutants", "--only", "memory-dir", "--tools", "memory", "--services", "none",
                     "--hermes-python", str(hermes_python), "--out", str(tmp_path / "mu")])
    out = capsys.readouterr().out
    doc = json.loads((tmp_path / "mu" / "mutants.json").read_text())
    [row] = doc["mutants"]
    assert code == 0 and row["state"] == "caught" and row["trace"] == "computed", out
    assert any(h.startswith("tool memory | default -> alpha") for h in row["hops"]), row["hops"]
    assert not (tmp_path / "mu" / "venv").exists()  # the mutated copy is gone; its patch stays
    assert (tmp_path / "mu" / "patches" / "memory-dir.patch").is_file()


def test_the_fix_series_applies_to_the_pinned_hermes_and_every_fix_has_its_result(tmp_path, hermes_python):
    """docs/fixes/series: every F<n>.patch, in the series' order, applies to the locked install on top of the ones
    before it (as `patch-check --series` builds the twin), changes what it names, and has its committed patch-check
    result with no new hop, listed in the folder's README."""
    fixes = Path(__file__).resolve().parents[2] / "docs" / "fixes"
    patches = read_series(fixes / "series")
    assert len(patches) >= 3, patches
    twin_python = patched_copy(hermes_python, patches, tmp_path / "twin")
    twin = site_packages(twin_python.parent.parent)
    readme = (fixes / "README.md").read_text()
    for patch in patches:
        for target in targets(patch):
            assert (twin / target).read_text() != (site_packages(hermes_python.parent.parent) / target).read_text(), \
                (patch.name, target)
        result = (fixes / f"{patch.stem}.result.md").read_text()
        assert f"[{patch.name}]({patch.name})" in readme and (", 0 new" in result or patch.stem == "F57"), patch.name
    # F57 needs a launch profile whose environment names no ntfy topic, which no audit configures: Hermes' own config
    # loading shows the fix (F57.result.md), alpha's bot built from alpha's settings on the twin, none on the install
    loading = _module(fixes / "ntfy_loading.py")
    assert loading.alphas_adapter(twin_python, tmp_path / "f57-twin", "F57") == "alpha's, alpha's, alpha's"
    assert loading.alphas_adapter(hermes_python, tmp_path / "f57-install", "F57") == "none"


def test_the_twin_is_audited_once_built_and_cached(tmp_path, hermes_python, monkeypatch, capsys):
    """`patch-check --series`: two real fixes (F17's builds on F9's) applied to a copy of the install, audited as
    `run` audits (the one-shot door, the env probe only: clean), and the second call reuses the cached twin."""
    fixes = Path(__file__).resolve().parents[2] / "docs" / "fixes"
    (tmp_path / "fixes").mkdir()
    for name in ("F9.patch", "F17.patch"):
        (tmp_path / "fixes" / name).write_text((fixes / name).read_text())
    (tmp_path / "fixes" / "series").write_text("F9.patch\nF17.patch\n")
    monkeypatch.setattr(twins, "cache_root", lambda: tmp_path / "cache")
    argv = ["patch-check", "--series", str(tmp_path / "fixes" / "series"), "--tools", "none", "--services", "none",
            "--hermes-python", str(hermes_python)]
    assert cli.main([*argv, "--out", str(tmp_path / "first")]) == 0
    first = capsys.readouterr()
    assert "verdict: clean" in first.out and "(2 patches) built" in first.err, first
    [twin] = list((tmp_path / "cache").iterdir())
    assert (tmp_path / "first" / "findings.json").is_file()
    assert cli.main([*argv, "--out", str(tmp_path / "second"), "--fail-on", "leak"]) == 0
    second = capsys.readouterr()
    assert f"cached at {twin}" in second.err and list((tmp_path / "cache").iterdir()) == [twin], second.err


def _module(path: Path) -> ModuleType:
    """A script of docs/fixes imported by its path."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

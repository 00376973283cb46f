"""The mutant set without Hermes: each mutant's patch replaces exactly one expression with one that still computes
the original, writes to the trace whether the value differed, and yields the mutant's value; a mutant that does
not fit the installed file says so; bad input is one line and exit 2."""

from __future__ import annotations

import textwrap

import pytest

from harness import cli
from harness.proof.mutants import LAUNCH, MUTANTS, TRACE, Mutant, MutantError
from harness.usecases import _traced

SOURCE = textwrap.dedent("""\
    from pathlib import Path
    def get_hermes_home():
        return Path.home() / ".hermes" / "profiles" / "alpha"
    def memory_dir():
        return get_hermes_home() / "memories"
    """)
MUTANT = Mutant("memory-dir", "memory tool", "tools/memory_tool.py", 'return get_hermes_home() / "memories"',
                "get_hermes_home()", LAUNCH, "the launch profile's memories")


def _apply(patch: str, text: str) -> str:
    """The patched text (the diff replaces one line)."""
    minus = [ln[1:] for ln in patch.splitlines(keepends=True) if ln.startswith("-") and not ln.startswith("---")]
    plus = [ln[1:] for ln in patch.splitlines(keepends=True) if ln.startswith("+") and not ln.startswith("+++")]
    assert len(minus) == len(plus) == 1
    return text.replace(minus[0], plus[0])


def test_a_mutant_computes_its_value_and_traces_whether_it_differed(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "tools").mkdir(parents=True)
    (site / "tools" / "memory_tool.py").write_text(SOURCE)
    patch = MUTANT.patch(site)
    assert patch.startswith("--- a/tools/memory_tool.py\n+++ b/tools/memory_tool.py\n")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    namespace: dict = {}
    exec(_apply(patch, SOURCE), namespace)  # the mutated module, run
    assert namespace["memory_dir"]() == tmp_path / "home" / ".hermes" / "memories"
    assert (tmp_path / "home" / TRACE).read_text() == "True\n"


def test_a_mutant_that_does_not_fit_the_install_says_so(tmp_path):
    site = tmp_path / "site"
    (site / "tools").mkdir(parents=True)
    (site / "tools" / "memory_tool.py").write_text(SOURCE + SOURCE)  # the line twice: not one place
    with pytest.raises(MutantError, match="is on 2 lines"):
        MUTANT.patch(site)


def test_every_mutant_is_named_once_and_says_the_bug_it_reintroduces():
    assert len({m.name for m in MUTANTS}) == len(MUTANTS) >= 15
    assert len({m.surface for m in MUTANTS}) >= 8
    assert all(m.bug and m.old in m.line for m in MUTANTS)


def test_the_trace_tells_computed_same_and_never_ran(tmp_path):
    home = tmp_path / "sandbox" / "home-x"
    home.mkdir(parents=True)
    assert _traced(tmp_path) == "never ran"
    (home / TRACE).write_text("False\n")
    assert _traced(tmp_path) == "same"
    (home / TRACE).write_text("False\nTrue\n")
    assert _traced(tmp_path) == "computed"


def test_an_unknown_mutant_is_one_line_and_exit_2(tmp_path, capsys):
    code = cli.main(["mutants", "--only", "no-such-mutant", "--out", str(tmp_path / "m")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "unknown mutant" in err, err
    assert not (tmp_path / "m").exists()

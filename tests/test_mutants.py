"""The mutant set without Hermes: each mutant's patch replaces exactly one expression with one that still computes
the original, writes to the trace whether the value differed, and yields the mutant's value; a mutant that does
not fit the installed file says so; bad input is one line and exit 2; on the twin (--series) the control is the twin,
each mutant a copy of it, and a mutant whose line the series changed says so."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness import cli, usecases
from harness.drive.hermes import twin as twins
from harness.drive.hermes.patched import site_packages
from harness.options import RunOptions
from harness.proof import mutants
from harness.proof.mutants import LAUNCH, MUTANTS, TRACE, Form, Mutant, MutantError
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
    assert all(m.twin.old in m.twin.line and m.twin.line != m.line for m in MUTANTS if m.twin)


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


SKILLS_FILE = "lib/python3.13/site-packages/tools/skills_tool.py"
SKILLS = 'from pathlib import Path\ndef skills_dir():\n    return get_hermes_home() / "skills"\n'
#: A fix that changes the memory tool's line (the memory-dir mutant no longer fits) and leaves the skills' line alone.
FIX = textwrap.dedent("""\
    --- a/tools/memory_tool.py
    +++ b/tools/memory_tool.py
    @@ -3,3 +3,3 @@
         return Path.home() / ".hermes" / "profiles" / "alpha"
     def memory_dir():
    -    return get_hermes_home() / "memories"
    +    return profile_home() / "memories"
    --- a/tools/skills_tool.py
    +++ b/tools/skills_tool.py
    @@ -1,2 +1,3 @@
     from pathlib import Path
    +FIXED = True
     def skills_dir():
    """)


def _venv(root: Path) -> Path:
    """A venv's shape (pyvenv.cfg, bin/python) whose site-packages holds the memory and skills tools' lines."""
    site = root / "lib" / "python3.13" / "site-packages" / "tools"
    site.mkdir(parents=True)
    (site / "memory_tool.py").write_text(SOURCE)
    (site / "skills_tool.py").write_text(SKILLS)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / "bin").mkdir()
    (root / "bin" / "python").symlink_to(os.path.realpath("/proc/self/exe"))
    return root / "bin" / "python"


def test_mutants_on_the_twin_mutate_copies_of_it_and_name_the_patches_a_mutant_no_longer_fits(tmp_path, monkeypatch,
                                                                                             capsys):
    """--series: the control is the twin, a mutant is applied on top of a copy of it (the series' change and the
    mutant's in one file), and a mutant whose line the series changed is `not applicable`, in one line naming the
    patch; nothing is audited for it."""
    python = _venv(tmp_path / "venv")
    (tmp_path / "fixes").mkdir()
    (tmp_path / "fixes" / "F1.patch").write_text(FIX)
    (tmp_path / "fixes" / "series").write_text("F1.patch\n")
    monkeypatch.setattr(twins, "cache_root", lambda: tmp_path / "twins")
    audited: list[tuple[str, Path, str]] = []

    def audit(opts: RunOptions) -> SimpleNamespace:
        skills = site_packages(opts.hermes_python.parent.parent) / "tools" / "skills_tool.py"
        audited.append((opts.out.name, opts.hermes_python, skills.read_text()))
        if opts.out.name != "control":  # the mutated line ran, to the same value
            (opts.out / "sandbox" / "home-a").mkdir(parents=True)
            (opts.out / "sandbox" / "home-a" / TRACE).write_text("False\n")
        return SimpleNamespace(verdict=SimpleNamespace(status="clean", findings=[]))

    monkeypatch.setattr(usecases, "run_audit", audit)
    out = tmp_path / "out"
    code = cli.main(["mutants", "--series", str(tmp_path / "fixes" / "series"), "--only", "memory-dir,skills-read",
                     "--hermes-python", str(python), "--out", str(out)])
    captured = capsys.readouterr()
    printed = captured.out.splitlines()
    assert code == 0, captured.err
    [(_, control, fixed), (folder, mutated, both)] = audited
    assert control.parent.parent.parent == tmp_path / "twins" and "FIXED = True" in fixed  # the twin
    assert folder == "m-00002" and mutated.parent.parent == out / "venv"  # a copy of the twin, mutated
    assert "FIXED = True" in both and TRACE in both
    assert TRACE not in fixed and "FIXED" not in (python.parent.parent / SKILLS_FILE).read_text()
    doc = json.loads((out / "mutants.json").read_text())
    assert doc["series"] == str(tmp_path / "fixes" / "series") and doc["control"] == "clean"
    memory, skills = doc["mutants"]
    assert memory["state"] == ("not applicable: 'return get_hermes_home() / \"memories\"' is on 0 lines of "
                               "tools/memory_tool.py, not one holding 'get_hermes_home()' (the series changes "
                               "tools/memory_tool.py (F1.patch))"), memory
    assert skills["state"] == "not exercised" and skills["trace"] == "same"
    assert printed[0].startswith("not applicable  memory-dir") and "(F1.patch)" in printed[0]
    assert printed[-1] == (f"mutants (oneshot, on the twin of {tmp_path / 'fixes' / 'series'}, control clean): "
                           "0 caught, 0 missed, 1 not exercised, 1 not applicable")


def test_a_mutant_whose_file_is_not_in_the_install_says_so(tmp_path):
    with pytest.raises(MutantError, match=r"^tools/memory_tool.py is not in the install$"):
        MUTANT.patch(tmp_path)


#: The memory tool's line as a fix leaves it (FIX's), and the memory-dir mutant carrying its form for that line.
FIXED = SOURCE.replace('return get_hermes_home() / "memories"', 'return profile_home() / "memories"')
TWIN = Form("tools/memory_tool.py", 'return profile_home() / "memories"', "profile_home()", LAUNCH)
TWINNED = Mutant(MUTANT.name, MUTANT.surface, MUTANT.file, MUTANT.line, MUTANT.old, MUTANT.new, MUTANT.bug, TWIN)


def test_a_mutant_whose_line_the_fix_rewrote_is_planted_in_its_twin_form(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "tools").mkdir(parents=True)
    (site / "tools" / "memory_tool.py").write_text(FIXED + "def profile_home():\n    return get_hermes_home()\n")
    assert TWINNED.form(site) == TWIN
    patch = TWINNED.patch(site)
    assert '-    return profile_home() / "memories"' in patch and TRACE in patch
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    namespace: dict = {}
    exec(_apply(patch, FIXED + "def profile_home():\n    return get_hermes_home()\n"), namespace)
    assert namespace["memory_dir"]() == tmp_path / "home" / ".hermes" / "memories"  # the launch profile's, again
    assert (tmp_path / "home" / TRACE).read_text() == "True\n"


def test_on_the_shipped_line_a_mutant_with_a_twin_form_plants_its_own(tmp_path):
    """The near miss: the twin form's line is not in an unpatched install, so the mutant is planted as it ships."""
    site = tmp_path / "site"
    (site / "tools").mkdir(parents=True)
    (site / "tools" / "memory_tool.py").write_text(SOURCE)
    assert TWINNED.form(site) == Form(MUTANT.file, MUTANT.line, MUTANT.old, MUTANT.new)
    assert TWINNED.patch(site) == MUTANT.patch(site)


def test_a_mutant_neither_of_whose_forms_fits_says_why_for_each(tmp_path):
    site = tmp_path / "site"
    (site / "tools").mkdir(parents=True)
    (site / "tools" / "memory_tool.py").write_text(FIXED + FIXED)  # the twin's line twice: not one place either
    with pytest.raises(MutantError) as caught:
        TWINNED.patch(site)
    assert str(caught.value) == (
        "'return get_hermes_home() / \"memories\"' is on 0 lines of tools/memory_tool.py, not one holding "
        "'get_hermes_home()'; its twin form: 'return profile_home() / \"memories\"' is on 2 lines of "
        "tools/memory_tool.py, not one holding 'profile_home()'")


def test_mutants_on_the_twin_plant_the_twin_form_where_the_series_rewrote_the_line(tmp_path, monkeypatch, capsys):
    """--series: the memory-dir mutant, whose line F1.patch rewrites, is planted in its twin form on a copy of the
    twin and audited (mutants.json says which form); without the twin form it is `not applicable` (above)."""
    python = _venv(tmp_path / "venv")
    (tmp_path / "fixes").mkdir()
    (tmp_path / "fixes" / "F1.patch").write_text(FIX)
    (tmp_path / "fixes" / "series").write_text("F1.patch\n")
    monkeypatch.setattr(twins, "cache_root", lambda: tmp_path / "twins")
    monkeypatch.setattr(mutants, "MUTANTS", (TWINNED,))
    planted: list[str] = []

    def audit(opts: RunOptions) -> SimpleNamespace:
        memory = site_packages(opts.hermes_python.parent.parent) / "tools" / "memory_tool.py"
        planted.append(memory.read_text())
        return SimpleNamespace(verdict=SimpleNamespace(status="clean", findings=[]))

    monkeypatch.setattr(usecases, "run_audit", audit)
    out = tmp_path / "out"
    code = cli.main(["mutants", "--series", str(tmp_path / "fixes" / "series"), "--hermes-python", str(python),
                     "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    [control, mutated] = planted
    assert "profile_home() /" in control and TRACE not in control
    assert TRACE in mutated and "(profile_home(), __import__" in mutated
    [row] = json.loads((out / "mutants.json").read_text())["mutants"]
    assert row["form"] == "twin" and row["state"] == "not exercised" and row["trace"] == "never ran"


def test_every_mutant_fits_the_release_as_it_ships_and_the_twin_in_its_twin_form(hermes_python):
    """On Hermes as it ships every mutant is planted in its own line (no twin form's line is there); on the twin
    (docs/fixes/series applied) every mutant fits, those the series rewrote in their twin form."""
    shipped = site_packages(hermes_python.parent.parent)
    assert all(m.form(shipped) == Form(m.file, m.line, m.old, m.new) for m in MUTANTS)
    fixed = site_packages(twins.twin(hermes_python, Path("docs/fixes/series"), lambda _: None).parent.parent)
    assert {m.name for m in MUTANTS if m.form(fixed) == m.twin} == {
        "process-checkpoint", "terminal-cwd", "mem0-key", "aux-key", "aux-runtime-model", "script-env"}

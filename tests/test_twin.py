"""The twin (`drive.hermes.twin`, `patch-check --series`): a fix series applied to a copy of the install, built once and
cached by the series' hash; a series whose patch does not apply in order is one line, exit 2, and nothing cached.

The patches are real fixes of docs/fixes (F9's and F17's, which builds on F9's: both change
`tools/process_registry.py`), applied to a venv that holds the real 0.19.0 file they change, copied from the
Hermes install."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from harness import cli
from harness.core.evidence import UsageError
from harness.drive.hermes import twin as twins
from harness.drive.hermes.patched import site_packages
from harness.drive.hermes.twin import read_series, series_key, twin

FIXES = Path(__file__).resolve().parents[1] / "docs" / "fixes"
TARGET = "tools/process_registry.py"


def _venv(root: Path, hermes_python: Path) -> Path:
    """A venv's shape (pyvenv.cfg, bin/python) with the install's `tools/process_registry.py`."""
    site = root / "lib" / "python3.13" / "site-packages"
    (site / "tools").mkdir(parents=True)
    shutil.copy2(site_packages(hermes_python.parent.parent) / TARGET, site / TARGET)
    (site / "tools" / "other.py").write_text("x = 1\n")
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / "bin").mkdir()
    (root / "bin" / "python").symlink_to(os.path.realpath("/proc/self/exe"))
    return root / "bin" / "python"


def _series(folder: Path, *names: str, copies: dict[str, str] | None = None) -> Path:
    """A series file in `folder` listing `names`, each a copy of docs/fixes' patch of that name (or of the one
    `copies` maps it to)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy2(FIXES / (copies or {}).get(name, name), folder / name)
    (folder / "series").write_text("# two fixes\n" + "".join(f"{n}  # {n[:-6]}\n" for n in names))
    return folder / "series"


def test_a_series_applies_in_order_into_the_cache(tmp_path, hermes_python):
    python = _venv(tmp_path / "venv", hermes_python)
    series = _series(tmp_path / "fixes", "F9.patch", "F17.patch")
    said: list[str] = []
    built = twin(python, series, said.append, root=tmp_path / "cache")
    key = series_key(python, read_series(series))
    assert built == tmp_path / "cache" / key / "bin" / "python" and built.is_symlink()
    text = (site_packages(built.parent.parent) / TARGET).read_text()
    assert "hermes_home: str = field(" in text  # F9's field, which F17 builds on
    assert "_CHECKPOINT_HOMES" in text and "owned.hermes_home != str(get_hermes_home())" in text
    assert "_CHECKPOINT_HOMES" not in (site_packages(python.parent.parent) / TARGET).read_text()
    assert (built.parent.parent / twins.RECORD).stat().st_mode & 0o777 == 0o600
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [key]  # no temporary folder left
    assert len(said) == 1 and "built" in said[0] and "(2 patches)" in said[0], said


def test_the_cache_is_reused_and_another_series_is_another_twin(tmp_path, hermes_python):
    python = _venv(tmp_path / "venv", hermes_python)
    series = _series(tmp_path / "fixes", "F9.patch", "F17.patch")
    said: list[str] = []
    first = twin(python, series, said.append, root=tmp_path / "cache")
    patched = site_packages(first.parent.parent) / TARGET
    inode, mtime = patched.stat().st_ino, patched.stat().st_mtime_ns
    again = twin(python, series, said.append, root=tmp_path / "cache")
    assert again == first and "cached at" in said[-1], said
    assert (patched.stat().st_ino, patched.stat().st_mtime_ns) == (inode, mtime)  # not built again
    only = _series(tmp_path / "one", "F9.patch")
    assert twin(python, only, said.append, root=tmp_path / "cache") != first
    assert len(list((tmp_path / "cache").iterdir())) == 2
    (tmp_path / "fixes" / "F17.patch").write_text((FIXES / "F17.patch").read_text() + "\n")  # another patch
    assert series_key(python, read_series(series)) != first.parent.parent.name


def test_a_patch_that_does_not_apply_in_order_is_one_line_and_leaves_nothing(tmp_path, hermes_python, monkeypatch,
                                                                            capsys):
    """F9 twice (as a second file): the second's first hunk finds F9's field already there."""
    python = _venv(tmp_path / "venv", hermes_python)
    series = _series(tmp_path / "fixes", "F9.patch", "F9-again.patch", copies={"F9-again.patch": "F9.patch"})
    with pytest.raises(UsageError) as err:
        twin(python, series, print, root=tmp_path / "cache")
    message = str(err.value)
    assert message.startswith(f"series {series}: F9-again.patch (patch 2 of 2) does not apply on top of the ones "
                              "before it: hunk @@ -98,6 +98,7 @@ of tools/process_registry.py"), message
    assert list((tmp_path / "cache").iterdir()) == []  # nothing half-patched cached, no temporary folder
    monkeypatch.setattr(twins, "cache_root", lambda: tmp_path / "cli-cache")
    code = cli.main(["patch-check", "--series", str(series), "--hermes-python", str(python),
                     "--out", str(tmp_path / "out")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "F9-again.patch (patch 2 of 2)" in lines[0], lines
    assert "hunk @@ -98,6 +98,7 @@ of tools/process_registry.py" in lines[0]
    assert list((tmp_path / "cli-cache").iterdir()) == [] and not (tmp_path / "out").exists()


def test_a_malformed_series_or_a_mix_of_modes_is_one_line(tmp_path, capsys):
    (tmp_path / "empty").write_text("# nothing\n\n")
    (tmp_path / "twice").write_text("F1.patch\nF1.patch\n")
    (tmp_path / "F1.patch").write_text("")
    (tmp_path / "missing").write_text("F1.patch\nF2.patch\n")
    for name, words in (("empty", "lists no patch"), ("twice", "lists F1.patch twice"),
                        ("missing", "lists F2.patch, which is not a file"), ("absent", "is not readable")):
        with pytest.raises(UsageError, match=words):
            read_series(tmp_path / name)
    for argv, words in ((["patch-check"], "pass PATCH, or --series FILE"),
                        (["patch-check", "x.patch", "--series", "s"], "--series audits the series alone"),
                        (["patch-check", "--series", "s", "--on", "y.patch"], "--series audits the series alone"),
                        (["patch-check", "x.patch", "--runs", "2"], "--runs needs --series")):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and words in err, (argv, err)


def test_the_fix_series_lists_every_fix_once():
    """docs/fixes/series names every patch of the folder, each once, and nothing else."""
    listed = [p.name for p in read_series(FIXES / "series")]
    assert sorted(listed) == sorted(p.name for p in FIXES.glob("F*.patch"))
    assert listed == sorted(listed, key=lambda n: int(n[1:-6]))  # in the findings' order

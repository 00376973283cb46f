"""Lock files: what they pin (markers evaluated here), one line for how a venv differs, the cached venv keyed by its
lock and verified before reuse, a lock made for a release without a committed one; and the harness venv
./tenancy built holds exactly locks/harness.txt."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness.core.distributions import (
    TOOLS,
    DistributionError,
    differences,
    installed,
    lock_digest,
    lock_versions,
)
from harness.drive.hermes import install

ROOT = Path(__file__).resolve().parent.parent
LOCK = """\
# hermes-agent[mcp]==9.9.9
Foo_Bar==1.0 \\
    --hash=sha256:aa \\
    --hash=sha256:bb
    # via -r -
colorama==0.4.6 ; sys_platform == 'win32' \\
    --hash=sha256:cc
backports-zstd==1.7.0 ; python_full_version < '3.99' \\
    --hash=sha256:dd
plain==2.0 --hash=sha256:ee
"""


def test_a_lock_pins_the_lines_whose_marker_holds_with_normalized_names(tmp_path):
    (tmp_path / "l.txt").write_text(LOCK)
    assert lock_versions(tmp_path / "l.txt") == {"foo-bar": "1.0", "backports-zstd": "1.7.0", "plain": "2.0"}
    win = {"sys_platform": "win32"}
    assert lock_versions(tmp_path / "l.txt", win)["colorama"] == "0.4.6"


@pytest.mark.parametrize(("text", "needle"), [
    ("foo>=1.0 --hash=sha256:aa\n", "does not pin one version of foo"),
    ("foo==1.0,==2.0\n", "does not pin one version of foo"),
    ("not a requirement!\n", "has a line that is not a requirement"),
])
def test_a_lock_that_does_not_pin_is_one_line(tmp_path, text, needle):
    (tmp_path / "l.txt").write_text(text)
    with pytest.raises(DistributionError, match=needle) as err:
        lock_versions(tmp_path / "l.txt")
    assert "\n" not in str(err.value)
    with pytest.raises(DistributionError, match="cannot read the lock"):
        lock_versions(tmp_path / "missing.txt")


def test_differences_is_one_line_or_none():
    lock = {"openai": "2.21.0", "pydantic": "2.12.0", "httpx": "0.28.1", "gone": "1.0", "pip": "24.0"}
    assert differences(dict(lock, pip="25.1", setuptools="80.0"), lock) is None  # the installer is left out
    found = {"openai": "2.24.0", "pydantic": "2.13.4", "httpx": "0.28.1", "extra": "3.0", "zz": "1", "pip": "1"}
    line = differences(found, lock)
    assert line == ("the Hermes venv differs from the lock: extra 3.0 (not in the lock), gone missing (lock 1.0), "
                    "openai 2.24.0 (lock 2.21.0) (+2 more)")
    assert differences({"a": "1"}, {"a": "2"}, "the harness venv") == "the harness venv differs from the lock: a 1 " \
                                                                       "(lock 2)"


def test_installed_reads_a_venv_in_a_child_process(tmp_path):
    found = installed(Path(sys.executable))
    assert found["pytest"] == pytest.__version__ and found["packaging"]
    with pytest.raises(DistributionError, match="cannot run"):
        installed(tmp_path / "no-python")
    broken = fake_python(tmp_path / "broken", "exit 3")
    with pytest.raises(DistributionError, match=r"cannot list the distributions of .*: exit 3"):
        installed(broken)


def without_tools(versions: dict[str, str]) -> dict[str, str]:
    return {name: version for name, version in versions.items() if name not in TOOLS}


def fake_python(venv: Path, script: str) -> Path:
    """A venv's bin/python that is a shell script (what `installed` runs)."""
    python = venv / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/sh\n{script}\n")
    python.chmod(0o700)
    return python


def python_listing(versions: dict[str, str]) -> str:
    return f"echo '{json.dumps(sorted(versions.items()))}'"


# --- the cache of releases, keyed by the lock ----------------------------------------------------------------


def test_a_committed_release_is_cached_under_its_lock_key():
    lock = install.find_lock(install.PIN)
    assert lock is not None and lock.committed
    assert lock.path.read_bytes() == (ROOT / "locks" / f"hermes-{install.PIN}.txt").read_bytes()
    assert lock.key == lock_digest(lock.path)[:12]
    assert install.cached_python(install.PIN) == install.cache_root() / f"{install.PIN}-{lock.key}" / "bin" / "python"
    assert ' '.join(install.requirements(install.PIN)) in lock.path.read_text()  # the lock says what it resolved


def test_a_cached_venv_is_reused_only_when_it_holds_the_lock(tmp_path):
    lock = install.find_lock(install.PIN)
    assert lock is not None
    pinned = lock_versions(lock.path)
    lines: list[str] = []
    venv = install.venv_dir(lock, tmp_path)
    python = fake_python(venv, python_listing({**pinned, "pip": "1.0"}))
    assert install.cached(lock, lines.append, tmp_path) == python and lines == []
    assert install.install(install.PIN, lines.append, root=tmp_path) == python  # no pip run
    assert lines == [f"hermes-agent {install.PIN}: cached at {venv}"]

    lines.clear()
    python.write_text(f"#!/bin/sh\n{python_listing({**pinned, 'openai': '0.0.1'})}\n")
    assert install.cached(lock, lines.append, tmp_path) is None
    assert not venv.exists()  # removed, to be installed again
    assert lines == [f"hermes-agent {install.PIN}: the hermes-agent {install.PIN} venv differs from the lock: openai "
                     f"0.0.1 (lock {pinned['openai']}); installing it again"]


def test_a_release_without_a_committed_lock_has_none_until_its_first_install(tmp_path):
    assert install.committed_lock("0.0.1") is None and install.find_lock("0.0.1", tmp_path) is None
    with pytest.raises(install.InstallError, match=r"hermes-agent 0\.0\.1 has no lock yet"):
        install.cached_python("0.0.1", tmp_path)
    made = install.made_lock("0.0.1", tmp_path)
    made.write_text("# made\nhermes-agent==0.0.1 --hash=sha256:aa\n")
    lock = install.find_lock("0.0.1", tmp_path)
    assert lock == install.Lock("0.0.1", made, False)
    assert install.cached_python("0.0.1", tmp_path) == tmp_path / f"0.0.1-{lock.key}" / "bin" / "python"


def test_a_lock_is_made_from_pips_report_with_a_hash_for_every_distribution():
    report = {"install": [
        {"metadata": {"name": "Zeta", "version": "1"}, "download_info": {"archive_info": {"hashes": {"sha256": "b"}}}},
        {"metadata": {"name": "alpha", "version": "2"}, "download_info": {"archive_info": {"hashes": {"sha256": "a"}}}},
    ]}
    text = install.lock_lines("9.9.9", report)
    first = text.splitlines()[0]
    assert first.startswith(f"# {' '.join(install.requirements('9.9.9'))}: no committed lock, made by")
    assert text.splitlines()[1:] == ["alpha==2 --hash=sha256:a", "Zeta==1 --hash=sha256:b"]
    report["install"].append({"metadata": {"name": "local", "version": "3"}, "download_info": {"dir_info": {}}})
    with pytest.raises(install.InstallError, match=r"pip gave no sha256 for local 3 of hermes-agent==9\.9\.9"):
        install.lock_lines("9.9.9", report)


def test_every_committed_lock_is_shipped_and_names_its_release():
    committed = sorted(p.name for p in (ROOT / "locks").glob("hermes-*.txt"))
    assert {f"hermes-{install.PIN}.txt", "hermes-0.16.0.txt"} <= set(committed)
    assert (ROOT / "harness" / "drive" / "hermes" / "locks").readlink() == Path("../../../locks")
    for name in committed:
        version = name.removeprefix("hermes-").removesuffix(".txt")
        lock = install.find_lock(version)
        assert lock is not None and lock.committed, name
        assert lock.path.read_text().startswith(f"# {' '.join(install.requirements(version))}\n"), name
        assert lock_versions(lock.path)["hermes-agent"] == version


# --- the venvs ./tenancy built ---------------------------------------------------------------------------------


def test_the_harness_venv_holds_exactly_its_lock():
    found = installed(Path(sys.executable))
    assert found.pop("tenancy-audit") == "0.1.0"  # the project itself, editable
    assert without_tools(found) == without_tools(lock_versions(ROOT / "locks" / "harness.txt"))


def test_the_hermes_venv_holds_exactly_its_releases_lock(hermes_python):
    found = installed(hermes_python)
    lock = install.find_lock(found["hermes-agent"])
    assert lock is not None, f"no lock for hermes-agent {found['hermes-agent']}"
    assert without_tools(found) == without_tools(lock_versions(lock.path))
    assert differences(found, lock_versions(lock.path)) is None

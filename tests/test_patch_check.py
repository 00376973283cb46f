"""`patch-check`'s parts without Hermes: the patched copy of a venv (the original untouched, a patch that does not
apply refused before anything is written) and the crossing-by-crossing comparison of two
audits."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from harness import arguments, cli
from harness.core.evidence import UsageError
from harness.core.findings import Finding
from harness.drive.hermes.patched import patched_copy, targets
from harness.report.comparison import compare

PATCH = textwrap.dedent("""\
    --- a/pkg/mod.py
    +++ b/pkg/mod.py
    @@ -1,2 +1,2 @@
     SHARED = True
    -STORE = "one for every profile"
    +STORE = "one per profile"
    """)


def _venv(root: Path) -> Path:
    """A venv's shape: pyvenv.cfg, bin/python (a link to this interpreter), site-packages with one module."""
    site = root / "lib" / "python3.13" / "site-packages" / "pkg"
    site.mkdir(parents=True)
    (site / "mod.py").write_text('SHARED = True\nSTORE = "one for every profile"\n')
    (site / "other.py").write_text("x = 1\n")
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / "bin").mkdir()
    (root / "bin" / "python").symlink_to(os.path.realpath("/proc/self/exe"))
    return root / "bin" / "python"


def test_the_copy_is_patched_and_the_original_untouched(tmp_path):
    python = _venv(tmp_path / "venv")
    (tmp_path / "fix.patch").write_text(PATCH)
    copy = patched_copy(python, tmp_path / "fix.patch", tmp_path / "copy")
    site = "lib/python3.13/site-packages/pkg"
    assert copy == tmp_path / "copy" / "bin" / "python" and copy.is_symlink()
    assert (tmp_path / "copy" / site / "mod.py").read_text().endswith('"one per profile"\n')
    assert (tmp_path / "venv" / site / "mod.py").read_text().endswith('"one for every profile"\n')
    # the files the patch leaves alone are the original's (hard links), the patched one a file of its own
    def inode(root: str, name: str) -> int:
        return (tmp_path / root / site / name).stat().st_ino

    assert inode("copy", "other.py") == inode("venv", "other.py") and inode("copy", "mod.py") != inode("venv", "mod.py")


def test_a_patch_that_does_not_apply_is_refused_before_anything_is_written(tmp_path):
    python = _venv(tmp_path / "venv")
    (tmp_path / "stale.patch").write_text(PATCH.replace("one for every profile", "something else"))
    with pytest.raises(UsageError, match=r"does not apply to .*site-packages") as err:
        patched_copy(python, tmp_path / "stale.patch", tmp_path / "copy")
    assert "\n" not in str(err.value) and not (tmp_path / "copy").exists()
    (tmp_path / "empty.patch").write_text("not a diff\n")
    with pytest.raises(UsageError, match="names no file under site-packages"):
        targets(tmp_path / "empty.patch")
    (tmp_path / "escape.patch").write_text(PATCH.replace("pkg/mod.py", "../../etc/passwd"))
    with pytest.raises(UsageError, match="names no file under site-packages"):
        targets(tmp_path / "escape.patch")


def test_a_series_applies_in_order_and_one_that_does_not_apply_leaves_no_copy(tmp_path):
    """A fix on top of the fix it needs: the second patch's context exists only once the first is applied."""
    python = _venv(tmp_path / "venv")
    (tmp_path / "fix.patch").write_text(PATCH)
    (tmp_path / "next.patch").write_text(PATCH.replace('-STORE = "one for every profile"', '-STORE = "one per profile"')
                                         .replace('+STORE = "one per profile"', '+STORE = "one per profile, its home"'))
    site = "lib/python3.13/site-packages/pkg"
    patched_copy(python, [tmp_path / "fix.patch", tmp_path / "next.patch"], tmp_path / "copy")
    assert (tmp_path / "copy" / site / "mod.py").read_text().endswith('"one per profile, its home"\n')
    assert (tmp_path / "venv" / site / "mod.py").read_text().endswith('"one for every profile"\n')
    with pytest.raises(UsageError, match=r"next.patch does not apply"):  # the second alone: its context is missing
        patched_copy(python, [tmp_path / "next.patch"], tmp_path / "alone")
    with pytest.raises(UsageError, match=r"next.patch does not apply"):  # twice: the second time it is stale
        patched_copy(python, [tmp_path / "fix.patch", tmp_path / "next.patch", tmp_path / "next.patch"],
                     tmp_path / "twice")
    assert not (tmp_path / "alone").exists() and not (tmp_path / "twice").exists()


def test_patch_check_exits_2_with_one_line_on_bad_input(tmp_path, capsys):
    python = _venv(tmp_path / "venv")
    code = cli.main(["patch-check", str(tmp_path / "missing.patch"), "--hermes-python", str(python),
                     "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "missing.patch is not readable" in err, err
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_patch_check_audits_both_installs_with_the_tenant_that_leaves_settings_unset(tmp_path, capsys):
    """`--unset` is run's: both audits have the second tenant leave the setting unset; an unknown one is exit 2."""
    argv = ["patch-check", "x.patch", "--scenario", "gateway", "--platforms", "mattermost"]
    opts = arguments.patch_check_options(arguments.parser().parse_args([*argv, "--unset",
                                                                              "mattermost.allowed_users"]))
    assert opts.unset == ["mattermost.allowed_users"] and "mattermost" in opts.service_names()
    assert arguments.patch_check_options(arguments.parser().parse_args(argv)).unset == []
    planted = arguments.patch_check_options(arguments.parser().parse_args([*argv, "--plant", "signal-account"]))
    assert planted.plants == ["signal-account"]
    assert cli.main([*argv, "--unset", "mattermost.nothing", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "unknown setting 'mattermost.nothing' for --unset" in err, err
    assert not (tmp_path / "out").exists()


def _leak(victim: str, recipient: str, tool: str, phase: str = "lookups", canary: str = "tool_memory",
          scenario: str = "api_server", carrier: str | None = None) -> Finding:
    return Finding("request_leak", victim, recipient, canary, "request", f"flow:{tool}", tool=tool,
                   scenario=scenario, phase=phase, time=1.0, carrier=carrier)


def test_the_comparison_names_removed_remaining_and_new_crossings_and_each_findings_fate():
    # the API server's shared conversation carried two tenants' memory tool results (F18)
    before = [_leak("beta", "default", "memory", carrier="conversation"),
              _leak("default", "alpha", "memory", carrier="conversation"),
              Finding("wrong_key", "default", "alpha", "memory_key", "request", "flow:m", service="memory",
                      scenario="api_server", phase="turns", time=0.5)]
    varied = Finding("file_leak", "beta", "default", "model", "file", "logs/agent.log@1", scenario="api_server",
                     phase="end", time=2.0)  # F5 in the second run only: its spread, not a regression
    after = [before[2], _leak("alpha", "beta", "todo", phase="turns"), varied]  # F18's crossings gone; a new one
    logged = Finding("file_leak", "alpha", "default", "model", "file", "logs/agent.log@1", scenario="api_server",
                     phase="end", time=2.0)
    doc = compare([*before, logged], after)
    assert doc["removed"] == {"file logs/agent.log | alpha -> default | model": ["F5"],
                              "conversation | beta -> default | tool_memory": ["F18"],
                              "conversation | default -> alpha | tool_memory": ["F18"]}
    assert list(doc["remaining"]) == ["service memory | default -> alpha | memory_key"]
    assert doc["new"] == {"tool todo | alpha -> beta | tool_memory": []}
    assert doc["varied"] == {"file logs/agent.log | beta -> default | model": ["F5"]}
    assert doc["documented"] == {"F5": "gone", "F12": "kept", "F18": "gone"}


def test_a_kind_a_finding_never_carried_is_new_even_on_a_known_hop_and_a_partial_fix_shows():
    """A change that stops one kind crossing a tool's hop shows as `fewer`; a kind the unpatched run never saw
    cross through that finding is a regression although the hop (entry, victim -> recipient) was known."""
    before = [_leak("default", "alpha", "session_search", canary="key", scenario="tui"),
              _leak("default", "alpha", "session_search", canary="todo_item", scenario="tui")]
    after = [before[1], _leak("default", "beta", "session_search", canary="todo_item", scenario="tui"),
             _leak("default", "alpha", "session_search", canary="api_server_key", scenario="tui")]
    doc = compare(before, after)
    assert doc["removed"] == {"tool session_search | default -> alpha | key": ["F8"]}
    assert doc["documented"] == {"F8": "fewer"}
    assert doc["varied"] == {"tool session_search | default -> beta | todo_item": ["F8"]}
    assert doc["new"] == {"tool session_search | default -> alpha | api_server_key": ["F8"]}

"""The fix series in two forms (docs/fixes/README.md): `series` of site-packages patches, and `upstream/`, the same
fixes as `git format-patch` commits against Hermes' source tree. Both must list the same fixes in the same order, and
each commit must change the files its site-packages patch changes (mapped to the source tree) plus, at most, tests.

The mapping: hermes-agent 0.19.0's sdist builds its wheel with setuptools from the tree's root (`packages.find` over
the top-level packages, `py-modules` for the top-level modules, no `package-dir`), so a file's path under site-packages
is its path in the source tree, for every top-level name below. A patch path outside them has no source path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.drive.hermes.patched import targets
from harness.drive.hermes.twin import read_series

FIXES = Path(__file__).resolve().parents[1] / "docs" / "fixes"
#: Hermes 0.19.0's top-level packages and modules (its pyproject.toml: `packages.find` and `py-modules`).
TOP_LEVEL = frozenset({
    "agent", "tools", "hermes_cli", "gateway", "tui_gateway", "cron", "acp_adapter", "plugins", "providers",
    "run_agent.py", "model_tools.py", "toolsets.py", "batch_runner.py", "trajectory_compressor.py",
    "toolset_distributions.py", "cli.py", "hermes_bootstrap.py", "hermes_constants.py", "hermes_state.py",
    "hermes_time.py", "hermes_logging.py", "utils.py", "mcp_serve.py",
})
_SUBJECT = re.compile(r"^Subject: \[PATCH (\d+)/(\d+)\] .*?\((F\d+)\)$", re.MULTILINE)
_CHANGED = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)


def source_path(site_path: str) -> str:
    """Where a file under site-packages is in Hermes' source tree (ValueError if it is not one of Hermes' own)."""
    if site_path.split("/", 1)[0] not in TOP_LEVEL:
        raise ValueError(f"{site_path} is not under a top-level package or module of hermes-agent")
    return site_path


def _unfold(text: str) -> str:
    """A mail header's continuation lines joined (`git format-patch` folds a long Subject)."""
    return re.sub(r"\n (?=\S)", " ", text.split("\n\n", 1)[0])


def test_the_upstream_commits_are_the_series_in_order():
    series = [p.name.removesuffix(".patch") for p in read_series(FIXES / "series")]
    commits = sorted((FIXES / "upstream").glob("*.patch"))
    found = [_SUBJECT.search(_unfold(c.read_text(encoding="utf-8"))) for c in commits]
    assert all(found), [c.name for c, f in zip(commits, found, strict=True) if not f]
    assert [f.group(3) for f in found] == series
    assert [(int(f.group(1)), int(f.group(2))) for f in found] == [(i, len(series)) for i in range(1, len(series) + 1)]


def test_each_commit_changes_its_patchs_files_and_only_tests_besides():
    for commit, name in zip(sorted((FIXES / "upstream").glob("*.patch")), read_series(FIXES / "series"),
                            strict=True):
        changed = {b for a, b in _CHANGED.findall(commit.read_text(encoding="utf-8"))}
        mapped = {source_path(p) for p in targets(name)}
        assert mapped <= changed, (commit.name, sorted(mapped - changed))
        assert all(p.startswith("tests/") for p in changed - mapped), (commit.name, sorted(changed - mapped))


def test_a_path_outside_hermes_has_no_source_path():
    assert source_path("gateway/platforms/api_server.py") == "gateway/platforms/api_server.py"
    assert source_path("run_agent.py") == "run_agent.py"
    for outside in ("aiohttp/web.py", "hermes_agent-0.19.0.dist-info/RECORD", "run_agent_extra.py"):
        with pytest.raises(ValueError, match="not under a top-level package"):
            source_path(outside)

"""The release matrix against real Hermes: a two-release one-shot matrix (the pinned 0.19.0 through its existing
interpreter, 0.16.0 from the release cache) run as two shards that share the cache, then merged; and a scenario
an old release cannot drive, which is an `n/a` cell, not a failure.

The cache persists across test sessions on this machine (under the temp folder, not $HOME) in the install module's
layout: a release's venv is keyed by its lock, and reused only when it holds exactly the lock's distributions. The
first session (or the first after the lock changed) installs 0.16.0, later ones reuse it; anything else in the
cache is removed first."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness.core.registry_file import load
from harness.detect.engine.matcher import Matcher
from harness.drive.hermes import install
from harness.matrix import FILES
from harness.options import hermes_python
from harness.report.matrix import NA

pytestmark = pytest.mark.e2e
OLD = "0.16.0"  # no `hermes -z --usage-file`, no `hermes serve`, no multiplexed gateway


@pytest.fixture(scope="module")
def cache() -> Path:
    """The XDG_CACHE_HOME of the release cache, kept between test sessions; private to this user. Only the keyed
    venv of the old release's lock is kept (and the hidden folders of a killed install, until they are stale)."""
    path = Path(tempfile.gettempdir()) / f"tenancy-audit-{os.getuid()}" / "test-cache"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    assert path.stat().st_uid == path.parent.stat().st_uid == os.getuid(), path
    with pytest.MonkeyPatch.context() as env:
        env.setenv("XDG_CACHE_HOME", str(path))
        root, keep = install.cache_root(), venv_of(OLD, path)
    for entry in root.glob("[!.]*"):
        if entry != keep:
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    return path


def venv_of(version: str, cache: Path) -> Path:
    """The cached venv of a release with a committed lock, as the install module names it under `cache`."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("XDG_CACHE_HOME", str(cache))
        return install.cached_python(version).parent.parent


def matrix_cli(cwd: Path, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True,
                          timeout=1800, cwd=cwd, env=env)


def test_two_release_oneshot_matrix_in_two_shards_sharing_the_cache(tmp_path, cache):
    pinned = hermes_python(None)
    releases = f"{OLD},0.19.0={pinned}"
    shards = []
    venv = venv_of(OLD, cache)
    leftovers = set(venv.parent.glob(".*"))  # of a killed earlier session, until they are stale
    for i in (1, 2):
        out = tmp_path / f"shard-{i}"
        done = matrix_cli(tmp_path, cache, "matrix", "--hermes", releases, "--runs", "2", "--tools", "none",
                          "--shard", f"{i}/2", "--fail-on", "never", "--out", str(out))
        assert done.returncode == 0, done.stderr
        shards.append((out, done.stderr))
    # 2 runs, so each shard has a run of each release: shard 1 installed the old release (in a cold cache; pip
    # failing makes its cell n/a) or found it, shard 2 found it
    first, second = shards[0][1], shards[1][1]
    assert f"hermes-agent {OLD}: installed in" in first or f"hermes-agent {OLD}: cached at" in first, first
    assert f"hermes-agent {OLD}: cached at" in second and "installed in" not in second, second
    assert f"at {venv}" in first and f"cached at {venv}" in second  # keyed by the old release's lock
    lock = install.find_lock(OLD)
    assert lock is not None and lock.committed and install.drift(venv / "bin" / "python", lock) is None
    assert set(venv.parent.glob(".*")) <= leftovers  # no half-written install of these runs

    done = matrix_cli(tmp_path, cache, "merge", *(str(out) for out, _ in shards), "--out", str(tmp_path / "merged"))
    doc = json.loads((tmp_path / "merged" / "matrix.json").read_text())
    assert done.returncode == {"clean": 0, "leak": 1, "inconclusive": 3}[doc["status"]], done
    assert doc["complete"] and doc["plan"]["releases"] == [OLD, "0.19.0"] and doc["shard"] is None
    assert len(doc["cells"]) == 4
    for cell in doc["cells"]:
        # every run drove Hermes (the old release's turns judged by their exit code), in its own folder
        assert cell["status"] != NA and cell["turns_ok"] == 2, cell
        shard = shards[0][0] if cell["run"] == 1 else shards[1][0]
        findings = json.loads((shard / cell["evidence"] / "findings.json").read_text())
        assert findings["versions"]["hermes-agent"] == cell["release"]
        assert set(cell["classes"]) == {f["fingerprint"] for f in findings["findings"]}
    for row in doc["rows"]:  # first/last seen agree with the cells
        seen = [r for r in doc["plan"]["releases"] if row["cells"][r]["state"] == "seen"]
        assert seen and (row["first_seen"], row["last_seen"]) == (seen[0], seen[-1])
        assert all(c["runs"] == 2 and c["interval"] for c in row["cells"].values()), row
    # the reports are private and hold no secret of any run
    for out in (tmp_path / "merged", *(s for s, _ in shards)):
        for name in FILES:
            assert stat.S_IMODE((out / name).stat().st_mode) == 0o600
    for registry in sorted(tmp_path.glob("shard-*/*/oneshot/run-*/registry.yaml")):
        secrets = Matcher.for_registry(load(registry), secrets_only=True)
        for name in FILES:
            assert secrets.find((tmp_path / "merged" / name).read_bytes()) == [], name


def test_a_scenario_an_old_release_cannot_drive_is_na_with_the_reason(tmp_path, cache):
    done = matrix_cli(tmp_path, cache, "matrix", "--hermes", OLD, "--scenario", "serve,gateway",
                      "--out", str(tmp_path / "m"))
    doc = json.loads((tmp_path / "m" / "matrix.json").read_text())
    reasons = {c["scenario"]: c["reason"] for c in doc["cells"]}
    assert {c["status"] for c in doc["cells"]} == {NA}, doc["cells"]
    assert reasons == {"serve": f"hermes-agent {OLD} cannot drive scenario serve: no `hermes serve`",
                       "gateway": f"hermes-agent {OLD} cannot drive scenario gateway: no multiplexed gateway "
                                  "(gateway.multiplex_profiles)"}
    assert done.returncode == 3 and doc["status"] == "inconclusive", done  # nothing ran: nothing proven
    assert not list((tmp_path / "m").glob(f"{OLD}/*/run-*"))  # no evidence folder for a run that never started

"""Every version of every home file: the watcher keeps what a file held during the run, the scan reports a
foreign canary in a version gone by the end as transient, and only then."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from harness.capture import file_versions as capture
from harness.core.registry import Registry, mint
from harness.detect import file_versions as versions
from harness.detect.engine.matcher import matcher_for
from harness.detect.scan import scan_tree


def make(tmp_path: Path) -> tuple[Registry, dict[str, Path], Path]:
    reg = mint(["alice", "bob"], tmp_path / "work", {n: {"listen": 42000 + i} for i, n in enumerate(["alice", "bob"])})
    homes = {"alice": tmp_path / "out" / "sandbox" / "alice", "bob": tmp_path / "out" / "sandbox" / "bob"}
    for home in homes.values():
        home.mkdir(parents=True)
        (home / "config.yaml").write_text("model: x\n")
    return reg, homes, tmp_path / "out"


def wait_for(watch: capture.FileVersions, n: int) -> None:
    deadline = time.monotonic() + 5
    while watch.stats["versions"] < n and time.monotonic() < deadline:
        time.sleep(0.02)


def transient(reg: Registry, homes: dict[str, Path], out: Path) -> list:
    matcher = matcher_for(reg)
    end = [f for name, home in homes.items() for f in scan_tree(home, reg, name, matcher=matcher).findings]
    found, _, _ = versions.scan_versions(out, matcher, homes, end)
    return found


def checkpoint(value: str) -> str:
    return json.dumps([{"command": f"echo {value}", "pid": 1}])


def test_a_file_truncated_then_written_keeps_its_content_though_it_is_soon_replaced(tmp_path: Path) -> None:
    """A writer truncates, then writes (`open("w")`, as `write_text` does): the empty file in between is not a
    version and does not hold back the next copy, so the content is kept though it lives less than `SETTLE`."""
    reg, homes, out = make(tmp_path)
    bob = reg["bob"].key
    watch = capture.FileVersions(homes.values(), out).start()
    try:
        with (homes["alice"] / "processes.json").open("w") as fh:
            fh.flush()
            time.sleep(0.2)  # the watcher sees the empty file
            fh.write(checkpoint(bob))
        time.sleep(capture.SETTLE / 2)
        (homes["alice"] / "processes.json").write_text("[]")
    finally:
        kept = watch.stop()
    found = transient(reg, homes, out)
    assert [(f.kind, f.victim, f.seen_in, f.transient) for f in found] == [("file_leak", "bob", "alice", True)]
    assert kept["versions"] == 4, kept  # the two configs, bob's checkpoint, "[]"; no empty file


def test_a_foreign_canary_in_a_version_gone_by_the_end_is_transient(tmp_path: Path) -> None:
    reg, homes, out = make(tmp_path)
    bob = reg["bob"].key
    watch = capture.FileVersions(homes.values(), out).start()
    try:
        before = watch.stats["versions"]
        (homes["alice"] / "processes.json").write_text(checkpoint(bob))
        wait_for(watch, before + 1)
        (homes["alice"] / "processes.json").write_text("[]")
    finally:
        kept = watch.stop()
    assert kept["mode"] == "inotify"
    found = transient(reg, homes, out)
    assert [(f.kind, f.victim, f.seen_in, f.transient) for f in found] == [("file_leak", "bob", "alice", True)]
    assert found[0].location.startswith("processes.json@") and "gone at the end" in found[0].location
    assert found[0].time is not None and versions.version_of(found[0]) is not None


def test_near_misses_and_own_canaries_in_transient_versions_are_not_reported(tmp_path: Path) -> None:
    reg, homes, out = make(tmp_path)
    bob, alice = reg["bob"].key, reg["alice"].key
    near = bob[:-1] + ("0" if bob[-1] != "0" else "1")
    watch = capture.FileVersions(homes.values(), out).start()
    try:
        before = watch.stats["versions"]
        (homes["alice"] / "a.json").write_text(checkpoint(f"{near} {alice} {bob[:-3]}"))
        (homes["bob"] / "b.json").write_text(checkpoint(bob))
        wait_for(watch, before + 2)
        (homes["alice"] / "a.json").unlink()
        (homes["bob"] / "b.json").unlink()
    finally:
        watch.stop()
    assert watch.stats["versions"] >= before + 2
    assert transient(reg, homes, out) == []


def test_a_canary_still_there_at_the_end_is_the_end_scans_finding(tmp_path: Path) -> None:
    reg, homes, out = make(tmp_path)
    watch = capture.FileVersions(homes.values(), out).start()
    try:
        (homes["alice"] / "notes.txt").write_text(f"first {reg['bob'].key}\n")
        wait_for(watch, 3)
        (homes["alice"] / "notes.txt").write_text(f"second {reg['bob'].key}\n")
    finally:
        watch.stop()
    assert transient(reg, homes, out) == []


def test_without_inotify_a_phase_boundary_keeps_the_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reg, homes, out = make(tmp_path)

    class NoInotify:
        def __init__(self) -> None:
            raise OSError(24, "inotify instance limit reached")

    monkeypatch.setattr(capture, "Observer", NoInotify)
    watch = capture.FileVersions(homes.values(), out).start()
    (homes["bob"] / "processes.json").write_text(checkpoint(reg["alice"].key))
    watch.sweep()  # the phase boundary
    (homes["bob"] / "processes.json").write_text("[]")
    kept = watch.stop()
    assert kept["mode"] == "phase boundaries"
    assert [(f.victim, f.seen_in) for f in transient(reg, homes, out)] == [("alice", "bob")]


def test_nested_homes_are_attributed_to_the_deepest(tmp_path: Path) -> None:
    homes = {"default": tmp_path / "h", "alpha": tmp_path / "h" / "profiles" / "alpha"}
    assert versions.owner_of(tmp_path / "h" / "profiles" / "alpha" / "x.json", homes) == "alpha"
    assert versions.owner_of(tmp_path / "h" / "x.json", homes) == "default"
    assert versions.owner_of(tmp_path / "elsewhere", homes) is None


def test_only_versions_with_a_finding_are_kept(tmp_path: Path) -> None:
    reg, homes, out = make(tmp_path)
    watch = capture.FileVersions(homes.values(), out).start()
    try:
        (homes["alice"] / "processes.json").write_text(checkpoint(reg["bob"].key))
        wait_for(watch, 3)
        (homes["alice"] / "processes.json").write_text("[]")
    finally:
        watch.stop()
    found = transient(reg, homes, out)
    capture.keep_only(out, {i for f in found if (i := versions.version_of(f))})
    kept = versions.read_index(out)
    assert [v.id for v in kept] == [versions.version_of(found[0])]
    assert sorted(p.name for p in (out / versions.FOLDER).iterdir()) == sorted([versions.INDEX, kept[0].id])
    assert (out / versions.FOLDER / kept[0].id).stat().st_mode & 0o777 == 0o600
    assert [f.identity() for f in transient(reg, homes, out)] == [f.identity() for f in found]  # offline again
    capture.keep_only(out, set())
    assert not (out / versions.FOLDER).exists()


def test_a_malformed_index_is_one_line(tmp_path: Path) -> None:
    (tmp_path / versions.FOLDER).mkdir()
    (tmp_path / versions.FOLDER / versions.INDEX).write_text('{"id": "000001"}\n')
    with pytest.raises(ValueError, match=r"index.jsonl:1: not a version entry"):
        versions.read_index(tmp_path)


def test_a_temporary_file_renamed_into_place_and_a_wal_checkpointed_are_not_transient(tmp_path: Path) -> None:
    """Atomic writes (a temporary file renamed over the target) and a WAL checkpointed into its database move
    the content; it is still there at the end, so the end-of-run scan reports it, once."""
    reg, homes, out = make(tmp_path)
    bob = reg["bob"].key
    watch = capture.FileVersions(homes.values(), out).start()
    try:
        tmp = homes["alice"] / ".hermes-tmp.abc123"
        tmp.write_text(f"note {bob}\n")
        (homes["alice"] / "state.db-wal").write_text(f"wal page {bob}\n")
        wait_for(watch, 4)
        tmp.rename(homes["alice"] / "note.txt")
        (homes["alice"] / "state.db").write_text(f"db page {bob}\n")
        (homes["alice"] / "state.db-wal").write_text("")
    finally:
        watch.stop()
    assert transient(reg, homes, out) == []


def test_a_checkpoint_written_through_a_temporary_file_is_reported_at_the_checkpoint(tmp_path: Path) -> None:
    """Hermes writes `processes.json` atomically (a randomly named temporary file renamed over it): the transient
    finding names `processes.json`, whatever the temporary file was called, so its incident is stable."""
    reg, homes, out = make(tmp_path)
    watch = capture.FileVersions(homes.values(), out).start()
    try:
        for n, content in enumerate([checkpoint("idle"), checkpoint(reg["bob"].key), "[]"]):
            tmp = homes["alice"] / f".processes_{n}x7q.tmp"
            tmp.write_text(content)
            wait_for(watch, 3 + 2 * n)
            tmp.rename(homes["alice"] / "processes.json")
            wait_for(watch, 4 + 2 * n)
    finally:
        watch.stop()
    found = transient(reg, homes, out)
    assert [f.location.split("@")[0] for f in found] == ["processes.json"]

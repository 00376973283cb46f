"""The path of a store shared by design is not a leak of the home it lives in: a launch home that a path into a
tool's store continues in an RPC reply names that store (`Finding.store`), and the `hermes` policy allows the shared
kanban boards' path (`/kanban boards create` answers with the board's database path under the launch home) alone.
The planted leaks beside it stay leaks: another canary of the launch profile in the same reply, another path of its
home, the home in a later request, and another profile's board path in a third profile's reply."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from harness.core.findings import Finding
from harness.core.registry import Registry, mint
from harness.detect.incidents import build, explains
from harness.detect.scan import scan_text
from harness.report import policy


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    root = tmp_path / "home" / ".hermes"
    homes = {"default": root, "alpha": root / "profiles" / "alpha", "beta": root / "profiles" / "beta"}
    return mint(list(homes), tmp_path / "work", {n: {"listen": 40100 + i} for i, n in enumerate(homes)}, homes=homes)


def reply(registry: Registry, owner: str, output: str, n: int = 7) -> list[Finding]:
    """The findings of one RPC reply of `owner`'s session, as the rpc check tags them (tui, kanban)."""
    frame = {"jsonrpc": "2.0", "id": n, "result": {"output": output}}
    found = scan_text(json.dumps(frame), registry, owner, label=f"rpc-tui.jsonl#{n}", channel="rpc")
    return [replace(f, scenario="tui", phase="kanban", time=float(n)) for f in found]


def test_a_home_a_path_into_a_store_continues_names_the_store(registry: Registry) -> None:
    home = registry["default"].home
    stores = {path: [f.store for f in reply(registry, "alpha", f"DB path: {home}{path}\n")]
              for path in ("/kanban/boards/b/kanban.db", "/kanban.db", "/memories/MEMORY.md", "/kanban-notes.txt",
                           "/SOUL.md", "")}
    assert stores == {"/kanban/boards/b/kanban.db": ["kanban_create"], "/kanban.db": ["kanban_create"],
                      "/memories/MEMORY.md": ["memory"], "/kanban-notes.txt": [None], "/SOUL.md": [None], "": [None]}
    # a canary that is no home names nothing, even followed by a store's path
    assert [f.store for f in reply(registry, "alpha", f"{registry['default'].canaries['memory']}/kanban.db")] == [None]


def test_the_shared_boards_path_is_allowed_alone(registry: Registry) -> None:
    """Near miss: the board's path in the reply to alpha and beta is allowed, as kanban_create's, and the run is
    clean of it; under `strict` it is a leak."""
    home = registry["default"].home
    found = [*reply(registry, "alpha", f"Board created.\n  DB path: {home}/kanban/boards/a/kanban.db\n"),
             *reply(registry, "beta", f"Board created.\n  DB path: {home}/kanban/boards/b/kanban.db\n", 8)]
    kept, allowed = policy.load("hermes").apply(found, "default")
    assert kept == []
    assert [(f.victim, f.seen_in, f.canary, f.tool, f.scope) for f in allowed] == [
        ("default", s, "home", "kanban_create", "allowed:hermes/kanban-board-path") for s in ("alpha", "beta")]
    assert [i.entry for i in build(allowed)] == ["tool kanban_create"]
    assert policy.load("strict").apply(found, "default") == (found, [])


def test_what_else_the_reply_or_a_later_request_holds_is_still_a_leak(registry: Registry) -> None:
    """Planted leaks: the launch profile's memory canary and another path of its home in the same reply, and its
    home in a later request of alpha's: each kept, none a copy the allowed path explains."""
    launch = registry["default"]
    board = f"{launch.home}/kanban/boards/a/kanban.db"
    found = reply(registry, "alpha", f"DB path: {board}\n  note: {launch.canaries['memory']} at {launch.home}/SOUL.md")
    later = Finding("request_leak", "default", "alpha", "home", "request", "flow:f9:request.body@3", scenario="tui",
                    phase="kanban", time=9.0)
    kept, allowed = policy.load("hermes").apply([*found, later], "default")
    assert [(f.canary, f.store) for f in allowed] == [("home", "kanban_create")]
    assert sorted((f.channel, f.canary, f.store) for f in kept) == [
        ("request", "home", None), ("rpc", "home", None), ("rpc", "memory", None)]
    [named] = allowed
    assert not any(explains(named, f) for f in kept)  # the place named explains no copy of the home
    incidents = {i.entry: i for i in build([*kept, *allowed])}  # as the reports group them
    assert incidents["tool kanban_create"].findings == allowed  # the leaks are not its spread: incidents of their own
    assert sorted(incidents) == ["request", "rpc", "tool kanban_create"]


def test_only_the_launch_homes_board_path_at_another_profile_is_allowed(registry: Registry) -> None:
    """Near miss of the direction: alpha's home naming a board there, in beta's reply, is a profile's home at
    another profile (the boards are the launch home's), a leak."""
    found = reply(registry, "beta", f"DB path: {registry['alpha'].home}/kanban/boards/a/kanban.db")
    assert [f.store for f in found] == ["kanban_create"]
    assert policy.load("hermes").apply(found, "default") == (found, [])

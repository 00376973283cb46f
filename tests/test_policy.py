"""The isolation policy: its file format (one-line errors), what it allows (a crossing on a shared surface and
the copies it explains; nothing else) and that an allowed finding is of another class than under `strict`;
the documented out-of-scope tools."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.core.findings import Finding
from harness.core.protocol import OUT_OF_SCOPE
from harness.report import policy as policies
from harness.report.policy import PolicyError, parse

ROOT = Path(__file__).resolve().parents[1]
POLICY = """
version: 1
name: test
shared:
  - tool: read_file
    why: file tools reach every path
    source: the docs
  - service: web
    from: launch
    to: profile
    kinds: [request_leak]
    why: one search account
    source: the docs
"""


def crossing(tool: str | None = None, service: str | None = None, victim: str = "default", seen_in: str = "alpha",
             kind: str = "request_leak", time: float = 1.0) -> Finding:
    return Finding(kind, victim, seen_in, "soul", "request", f"flow:f{time}:request.body@1", tool=tool,
                   service=service, scenario="oneshot", phase="lookups", time=time)


def test_a_crossing_on_a_shared_surface_and_its_copies_are_allowed():
    policy = parse(POLICY, "p")
    read = crossing(tool="read_file")
    resent = crossing(tool="read_file", time=2.0)  # a later request re-sending the same result
    stored = Finding("file_leak", "default", "alpha", "soul", "file", "state.db@9", scenario="oneshot", phase="end")
    other = crossing(tool="session_search", victim="beta")  # another surface: stays a leak
    kept, allowed = policy.apply([read, resent, stored, other], "default")
    assert kept == [other]
    assert [f.location for f in allowed] == [read.location, resent.location, stored.location]
    assert {f.scope for f in allowed} == {"allowed:test/read_file-1"}


def test_directions_and_kinds_narrow_an_entry():
    policy = parse(POLICY, "p")
    assert policy.apply([crossing(service="web")], "default")[1]  # launch -> profile, a request leak
    assert not policy.apply([crossing(service="web", victim="alpha", seen_in="default")], "default")[1]
    assert not policy.apply([crossing(service="web", kind="wrong_key")], "default")[1]
    assert not policy.apply([crossing(service="web")], "alpha")[1]  # the launch profile is another one here


def test_an_allowed_finding_is_of_another_class_than_under_strict():
    f = crossing(tool="read_file")
    kept, allowed = parse(POLICY, "p").apply([f], "default")
    assert kept == [] and allowed[0].fingerprint() != f.fingerprint()
    assert policies.load("strict").apply([f], "default") == ([f], [])


def test_the_default_policy_cites_hermes_for_each_entry():
    policy = policies.load("hermes")
    assert {e.name for e in policy.shared} == {"read_file", "search_files", "write_file", "patch", "kanban_create"}
    assert all("hermes-agent 0.19.0" in e.source for e in policy.shared)
    assert all("NOT a security boundary" in e.source for e in policy.shared if e.name != "kanban_create")
    # the boards' store only, into the shared root; and its path under the root, at a profile
    [board, path] = [e for e in policy.shared if e.name == "kanban_create"]
    assert "shared across profiles **by design**" in board.source and board.kinds == {"file_leak"}
    assert (board.victim, board.recipient, board.paths) == ("profile", "launch", frozenset())
    assert "shared across profiles **by design**" in path.source and path.kinds == {"text_leak"}
    assert (path.victim, path.recipient, path.paths) == ("launch", "profile", {"home"})
    assert parse(__import__("yaml").safe_dump(policy.to_dict()), "copy") == policy  # the evidence's copy reads back


@pytest.mark.parametrize(("text", "message"), [
    ("version: 1\nname: x\nshared: [{tool: a, service: b, why: w, source: s}]", "names exactly one of tool"),
    ("version: 1\nname: x\nshared: [{tool: a, why: w}]", "needs a source"),
    ("version: 1\nname: x\nshared: [{tool: a, from: anyone, why: w, source: s}]", "from must be one of"),
    ("version: 1\nname: x\nshared: [{tool: a, kinds: [leaky], why: w, source: s}]", "kinds must be a list of"),
    ("version: 1\nname: x\nshared: [{tool: a, colour: red, why: w, source: s}]", "unknown field 'colour'"),
    ("version: 1\nname: x\nshared: [{tool: a, paths: [memory], why: w, source: s}]", "paths must be a list of path"),
    ("version: 1\nname: x\nshared: [{service: a, paths: [home], why: w, source: s}]", "paths name a tool's store"),
    ("version: 2\nname: x\nshared: []", "must be a mapping with version: 1"),
    ("version: 1\nshared: []", "needs a name"),
    ("version: 1\nname: x\nshared: [\n", "not valid YAML"),
])
def test_a_bad_policy_is_one_line(text, message):
    with pytest.raises(PolicyError) as exc:
        parse(text, "p.yaml")
    assert message in str(exc.value) and str(exc.value).startswith("policy p.yaml: ") and "\n" not in str(exc.value)


def test_a_missing_policy_file_is_one_line(tmp_path):
    with pytest.raises(PolicyError, match=r"^policy .*nope.yaml: does not exist$"):
        policies.load(tmp_path / "nope.yaml")


def test_the_documented_out_of_scope_tools_are_the_code_s():
    """docs/tools.md lists exactly the tools OUT_OF_SCOPE names (the e2e tests hold OUT_OF_SCOPE to what the
    pinned Hermes offers), each with its reason."""
    text = (ROOT / "docs" / "tools.md").read_text()
    section = text.split("## Out of scope", 1)[1].split("\n## ", 1)[0]
    documented = dict(re.findall(r"^\| `([a-z_]+)` \| (.+?) \|$", section, re.M))
    assert documented == OUT_OF_SCOPE

"""Path canaries that nest: the launch profile's home holds every other profile's home, so the shorter path is
inside the longer one wherever the longer one is written. The longer one decides; the shorter one alone (or
followed by anything but the longer one's rest) is still the launch profile's."""

from __future__ import annotations

import base64
import json
import sqlite3
from pathlib import Path

import pytest

from harness.core.registry import Registry, mint
from harness.detect.checks import RawRequest, check_request_leaks, request_facts
from harness.detect.engine.matcher import matcher_for
from harness.detect.engine.stream import scan_bytes, scan_file
from harness.detect.routes import Route, endpoint_of
from harness.detect.scan import scan_text


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    reg = mint(["default", "alpha"], tmp_path / "work", {"default": {"listen": 42001}, "alpha": {"listen": 42002}})
    launch = f"{tmp_path}/sandbox/home-{reg['default'].key[-12:]}/.hermes"
    reg.add_canary("default", "home", launch)
    reg.add_canary("alpha", "home", f"{launch}/profiles/alpha")
    return reg


def probe(path: str) -> bytes:
    """An env probe's output as a tool result stores it: the environment, base64."""
    return base64.b64encode(f"TERM=dumb\nHERMES_HOME={path}\nHERMES_REAL_HOME=/x\n".encode())


def homes(registry: Registry) -> tuple[str, str]:
    return registry["default"].canaries["home"], registry["alpha"].canaries["home"]


def test_the_longer_path_decides_in_every_encoding(registry: Registry) -> None:
    launch, alpha = homes(registry)
    m = matcher_for(registry)
    for data in (f"HERMES_HOME={alpha}\n".encode(), probe(alpha), alpha.encode().hex().encode()):
        assert {(h.tenant, h.kind) for h in scan_bytes(data, m, exclude="alpha")} == set(), data
    for data in (f"HERMES_HOME={launch}\n".encode(), probe(launch), f"{launch}/memories/MEMORY.md".encode()):
        assert {(h.tenant, h.kind) for h in scan_bytes(data, m, exclude="alpha")} == {("default", "home")}, data


def database(path: Path, values: list[bytes], page_size: int = 1024) -> Path:
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA page_size = {page_size}")
    conn.execute("CREATE TABLE messages (content TEXT)")
    conn.executemany("INSERT INTO messages VALUES (?)", [(v.decode(),) for v in values])
    conn.commit()
    conn.close()
    return path


def test_a_page_boundary_inside_the_longer_path_leaves_it_to_the_cells(tmp_path: Path, registry: Registry) -> None:
    """A value longer than a page continues on an overflow page: the raw bytes cut it (a 4-byte page header in
    the middle), so the launch home's form shows whole while the profile's does not. At every cut, nothing."""
    _, alpha = homes(registry)
    m = matcher_for(registry)
    for shift in range(0, 1100, 5):
        value = b"x" * shift + probe(alpha) + b"y" * 2000
        db = database(tmp_path / f"state-{shift}.db", [value])
        found = {(h.tenant, h.kind) for h in scan_file(db, m) if h.tenant != "alpha"}
        assert found == set(), shift


def test_the_launch_home_in_a_profiles_database_is_still_found(tmp_path: Path, registry: Registry) -> None:
    """The near miss the rule must not swallow: the launch profile's own home in another profile's database, in
    a cell and in any position, is reported."""
    launch, _ = homes(registry)
    m = matcher_for(registry)
    for shift in range(0, 1100, 50):
        db = database(tmp_path / f"state-{shift}.db", [b"x" * shift + probe(launch) + b"y" * 2000])
        assert ("default", "home") in {(h.tenant, h.kind) for h in scan_file(db, m)}, shift


def test_a_frame_boundary_of_a_wal_inside_the_longer_path_is_left_to_the_cells(tmp_path: Path,
                                                                                registry: Registry) -> None:
    """The same in a write-ahead log read alone (a version of `state.db-wal` copied during the run): its frames
    (a 24-byte header, then a page) cut a value wherever a page ends."""
    _, alpha = homes(registry)
    m = matcher_for(registry)
    for shift in range(0, 1100, 5):
        db = tmp_path / f"wal-{shift}.db"
        conn = sqlite3.connect(db)
        conn.execute("PRAGMA page_size = 1024")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute("CREATE TABLE messages (content TEXT)")
        conn.execute("INSERT INTO messages VALUES (?)", ((b"x" * shift + probe(alpha) + b"y" * 2000).decode(),))
        conn.commit()
        wal = (tmp_path / f"wal-{shift}.db-wal").read_bytes()
        conn.close()
        copy = tmp_path / f"copy-{shift}-wal"
        copy.write_bytes(wal)
        assert {(h.tenant, h.kind) for h in scan_file(copy, m) if h.tenant != "alpha"} == set(), shift


def env_text(path: str) -> bytes:
    """An env probe's output as a tool result stores it in state.db: JSON text, newlines escaped."""
    return f'{{"output": "TERM=dumb\\nHERMES_HOME={path}\\nHERMES_REAL_HOME=/x\\n"}}'.encode()


@pytest.mark.parametrize("encode", [env_text, probe])
def test_a_cell_that_ends_inside_the_longer_path_leaves_it_to_the_cells(tmp_path: Path, registry: Registry,
                                                                        encode) -> None:
    """A value that overflows keeps its first part in its page and the rest on overflow pages: the 4-byte number
    of the first overflow page follows where the first part ends, and another cell after it, anywhere in the page
    when small rows came first (their cells fill the page's end). Cut there, the profile's home shows only its
    launch home and a piece of `/profiles/alpha`: at every cut, nothing (the cells hold it whole)."""
    _, alpha = homes(registry)
    m = matcher_for(registry)
    for shift in range(0, 1100, 7):
        small = [b"s" * 40 for _ in range(6)]
        db = database(tmp_path / f"cell-{shift}.db", [*small, b"x" * shift + encode(alpha) + b"y" * 2000])
        assert {(h.tenant, h.kind) for h in scan_file(db, m) if h.tenant != "alpha"} == set(), shift


def test_the_launch_home_leaving_the_longer_path_is_still_found(registry: Registry) -> None:
    """Near misses of the cell rule: in a database's raw bytes, the launch home followed by text that leaves
    `/profiles/alpha` (another folder, another profile, the end of a JSON string) is the launch profile's home;
    so is the launch home cut by a byte that is not text outside a database."""
    launch, _ = homes(registry)
    m = matcher_for(registry)
    header = b"SQLite format 3\x00" + (1024).to_bytes(2, "big") + b"\x01" * 82
    for tail in (b"/memories\x00\x00", b"/profiles/beta\x00\x00", b'"}\x00\x00'):
        data = header + b"z" * 300 + f"HERMES_HOME={launch}".encode() + tail + b"z" * 600
        assert ("default", "home") in {(h.tenant, h.kind) for h in scan_bytes(data, m, exclude="alpha")}, tail
    for tail in (b"\x00\x00\x00\x07", b"/profiles/al\x00\x00\x00\x07"):
        data = f"HERMES_HOME={launch}".encode() + tail + b" rest"
        assert ("default", "home") in {(h.tenant, h.kind) for h in scan_bytes(data, m, exclude="alpha")}, tail


# A recipient's own home cut short (`harness.detect.engine.cuts`): a preview cut at N characters inside
# `<launch>/profiles/alpha` reads as the launch home followed by part of `/profiles/alpha` and the end of the value.

ENDINGS = ['"', '\\"', "...", "\u2026", "\\u2026", ""]  # a JSON string's quote (and escaped once), ellipses, the end


@pytest.fixture
def three(tmp_path: Path) -> Registry:
    reg = mint(["default", "alpha", "beta"], tmp_path / "work",
               {"default": {"listen": 42001}, "alpha": {"listen": 42002}, "beta": {"listen": 42003}})
    launch = f"{tmp_path}/sandbox/home-{reg['default'].key[-12:]}/.hermes"
    reg.add_canary("default", "home", launch)
    for name in ("alpha", "beta"):
        reg.add_canary(name, "home", f"{launch}/profiles/{name}")
    return reg


def preview(text: str, ending: str) -> bytes:
    """A subagent's event as the RPC log holds it: its output tail's preview cut where `text` ends."""
    head = '{"method": "subagent.complete", "output_tail": [{"preview": "GATEWAY=1\\nHERMES_HOME='
    return f"{head}{text}{ending}".encode()


def found(data: bytes, registry: Registry, owner: str) -> set[tuple[str, str]]:
    """What the three readers of a recipient's text report: a log's or RPC frame's scan (`reconcile`), a flow's
    layered scan (the live addon and `reconcile`) and a header line's forms."""
    m = matcher_for(registry)
    text = {(f.victim, f.canary) for f in scan_text(data, registry, owner, label="rpc-serve.jsonl#1", channel="rpc")}
    flow = {(h.tenant, h.kind) for h in scan_bytes(data, m, exclude=owner)}
    forms = {(h.tenant, h.kind) for h in m.find(data, exclude=owner)}
    assert text == flow == forms, (text, flow, forms)
    return text


@pytest.mark.parametrize("ending", ENDINGS)
def test_the_recipients_own_home_cut_short_is_not_the_launch_homes(three: Registry, ending: str) -> None:
    launch, alpha = three["default"].canaries["home"], three["alpha"].canaries["home"]
    for cut in range(len(launch) + 1, len(alpha)):  # every cut inside what alpha's home adds
        data = preview(alpha[:cut], ending)
        if ending in ('"', "", "\\u2026"):
            data += b'", "is_error": false}]}' if ending != "" else b""
        assert found(data, three, "alpha") == set(), (cut, ending)


@pytest.mark.parametrize("ending", ENDINGS)
def test_the_launch_home_then_a_departing_byte_is_still_the_launch_homes(three: Registry, ending: str) -> None:
    """Near misses: a byte that departs from alpha's home (`/profile.txt`, a line break), the whole of what the
    launch home is followed by nothing of alpha's, or part of it then more path (`/profil/x`)."""
    launch = three["default"].canaries["home"]
    for text in (f"{launch}/profile.txt", f"{launch}\\n", f"{launch}/profil/x", f"{launch}/p x", launch):
        assert found(preview(text, ending), three, "alpha") == {("default", "home")}, (text, ending)


@pytest.mark.parametrize("ending", ENDINGS)
def test_another_profiles_home_cut_short_is_still_the_launch_homes(three: Registry, ending: str) -> None:
    """Near miss: beta's home cut short in alpha's text is not alpha's own value: the launch home is reported
    (beta's whole home would be beta's); and alpha's own cut in beta's text likewise."""
    beta = three["beta"].canaries["home"]
    assert found(preview(beta[:-2], ending), three, "alpha") == {("default", "home")}, ending
    alpha = three["alpha"].canaries["home"]
    assert found(preview(alpha[:-2], ending), three, "beta") == {("default", "home")}, ending
    assert found(preview(beta, ending), three, "alpha") == {("beta", "home")}, ending


def test_a_cut_inside_a_database_cell_is_the_recipients_own(tmp_path: Path, three: Registry) -> None:
    """A cell is a whole value: alpha's home cut at its end in alpha's database is alpha's; the launch home then
    `/profile.txt` is not."""
    launch, alpha = three["default"].canaries["home"], three["alpha"].canaries["home"]
    m = matcher_for(three)

    def others(db: Path) -> set[tuple[str, str]]:
        return {(h.tenant, h.kind) for h in scan_file(db, m, recipient="alpha") if h.tenant != "alpha"}

    assert others(database(tmp_path / "cut.db", [f"HERMES_HOME={alpha[:-3]}".encode()])) == set()
    near = database(tmp_path / "near.db", [f"HERMES_HOME={launch}/profile.txt".encode()])
    assert others(near) == {("default", "home")}


@pytest.mark.parametrize("cut", [2, 9])  # `/profiles/alpha` less its last 2 or 9 characters
def test_a_flows_request_judges_the_cut_as_reconcile_does(three: Registry, cut: int) -> None:
    """A request of alpha's (the live addon's check, and `reconcile`'s of its saved flow) carrying the cut preview
    in a tool message: no finding; the launch home then `/profile.txt` there is a `request_leak`."""
    launch, alpha = three["default"].canaries["home"], three["alpha"].canaries["home"]

    def leaks(text: str) -> set[tuple[str, str]]:
        tail = json.dumps([{"tool": "terminal", "preview": f"HERMES_HOME={text}"}])
        body = {"model": three["alpha"].model, "messages": [{"role": "tool", "tool_call_id": "c1", "content": tail}]}
        raw = RawRequest("f1", "POST", "/v1/chat/completions", [], json.dumps(body).encode())
        req = request_facts(three, matcher_for(three), raw, endpoint_of(three, Route("reverse", listen_port=42002)))
        report = req.report()
        check_request_leaks(req, report)
        return {(f.victim, f.canary) for f in report.findings}

    assert leaks(alpha[:-cut]) == set()
    assert leaks(f"{launch}/profile.txt") == {("default", "home")}

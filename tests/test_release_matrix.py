"""The release matrix without Hermes: cell rules (k/N, Wilson intervals, first/last seen, n/a), shard specs,
shard/merge equality on recorded cells, the reports, and bad input (one line, exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness import cli, options
from harness import matrix as runner
from harness.core.findings import Finding, Verdict
from harness.detect.incidents import build
from harness.drive.doors import missing
from harness.drive.hermes import features, install
from harness.drive.hermes.features import Features
from harness.drive.phases import ALL_PHASES, DEFAULT_PHASES
from harness.drive.services import PROBES
from harness.options import UsageError
from harness.report import matrix
from harness.report.baseline import load, write
from harness.report.matrix import NA, Cell, MatrixError, Plan, cell_text, class_of, wilson
from harness.report.matrix_pages import render_html, render_markdown
from harness.report.result import AuditResult

CLI = [sys.executable, "-m", "harness.cli"]
RELEASES = ("0.19.0", "0.16.0", "0.18.2", "0.17.0")  # not in version order on purpose
LEAK = Finding("request_leak", "default", "alpha", "memory", "request", "flow:x", scenario="oneshot", phase="lookups",
               tool="session_search")
CWD = Finding("env_leak", "beta", "default", "workdir", "env", "flow:y", scenario="tui", phase="turns",
              tool="terminal")


def cell(release: str, scenario: str, run: int, *found: Finding, status: str = "leak", turns: int = 3,
         not_offered: dict[str, list[str]] | None = None, reason: str = "") -> Cell:
    return Cell(release, scenario, run, status if found or status != "leak" else "clean", reason, turns,
                {f.fingerprint(): class_of(f) for f in found}, not_offered or {}, f"{release}/{scenario}/run-{run}")


def row(doc: dict, f: Finding) -> dict:
    return next(r for r in doc["rows"] if r["fingerprint"] == f.fingerprint())


# --- Wilson interval ----------------------------------------------------------------------------------------


def test_wilson_matches_the_textbook_values_and_stays_in_0_1():
    assert wilson(3, 4) == (0.301, 0.954)  # Wilson (1927) / Newcombe (1998) for 3/4
    assert wilson(0, 4) == (0.0, 0.49)
    assert wilson(4, 4) == (0.51, 1.0)
    assert wilson(1, 2) == (0.095, 0.905)  # symmetric around 1/2
    lo, hi = wilson(50, 100)
    assert lo < 0.5 < hi and hi - lo < 0.2  # narrower with more runs


@pytest.mark.parametrize(("k", "n"), [(1, 0), (-1, 3), (4, 3)])
def test_wilson_refuses_impossible_counts(k, n):
    with pytest.raises(ValueError):
        wilson(k, n)


# --- cells --------------------------------------------------------------------------------------------------


def test_seen_k_of_n_with_an_interval_and_first_last_seen_in_version_order():
    plan = Plan(RELEASES, ("oneshot",), 2)
    cells = [cell("0.16.0", "oneshot", 1), cell("0.16.0", "oneshot", 2),
             cell("0.17.0", "oneshot", 1, LEAK), cell("0.17.0", "oneshot", 2),
             cell("0.18.2", "oneshot", 1, LEAK), cell("0.18.2", "oneshot", 2, LEAK),
             cell("0.19.0", "oneshot", 1), cell("0.19.0", "oneshot", 2)]
    r = row(matrix.document(plan, cells), LEAK)
    assert r["cells"]["0.16.0"] == {"state": "not seen", "seen": 0, "runs": 2, "interval": list(wilson(0, 2))}
    assert r["cells"]["0.17.0"] == {"state": "seen", "seen": 1, "runs": 2, "interval": list(wilson(1, 2))}
    assert r["cells"]["0.18.2"]["seen"] == 2 and r["cells"]["0.18.2"]["interval"][1] == 1.0
    assert (r["first_seen"], r["last_seen"]) == ("0.17.0", "0.18.2")  # 0.19.0 fixed it; 0.16.0 before it


def test_one_run_has_no_interval_and_a_class_seen_nowhere_has_no_first_seen():
    plan = Plan(("0.18.2", "0.19.0"), ("oneshot",), 1)
    doc = matrix.document(plan, [cell("0.18.2", "oneshot", 1, LEAK), cell("0.19.0", "oneshot", 1)])
    r = row(doc, LEAK)
    assert r["cells"]["0.18.2"] == {"state": "seen", "seen": 1, "runs": 1, "interval": None}
    assert cell_text(r["cells"]["0.18.2"]) == "seen 1/1" and cell_text(r["cells"]["0.19.0"]) == "not seen"
    assert (r["first_seen"], r["last_seen"]) == ("0.18.2", "0.18.2")


def test_versions_order_numerically_not_as_strings():
    plan = Plan(("0.9.0", "0.10.0"), ("oneshot",), 1)
    doc = matrix.document(plan, [cell("0.9.0", "oneshot", 1, LEAK), cell("0.10.0", "oneshot", 1, LEAK)])
    assert doc["plan"]["releases"] == ["0.9.0", "0.10.0"]
    assert (row(doc, LEAK)["first_seen"], row(doc, LEAK)["last_seen"]) == ("0.9.0", "0.10.0")


def test_na_release_scenario_and_tool_each_with_its_reason_and_near_misses_counted():
    cells = [cell("0.16.0", "oneshot", i, status=NA, reason="pip cannot install hermes-agent==0.16.0: boom")
             for i in (1, 2)]
    cells += [cell("0.17.0", "oneshot", i, status="inconclusive", turns=0, reason="no turn") for i in (1, 2)]
    cells += [cell("0.18.2", "oneshot", i, not_offered={"oneshot": ["session_search"]}) for i in (1, 2)]
    # near misses: one run drove nothing (not counted, N = 1); the tool not offered in one of two runs
    cells += [cell("0.19.0", "oneshot", 1, LEAK), cell("0.19.0", "oneshot", 2, status="inconclusive", turns=0)]
    plan = Plan((*RELEASES, "0.19.1"), ("oneshot",), 2)
    cells += [cell("0.19.1", "oneshot", 1, not_offered={"oneshot": ["session_search"]}), cell("0.19.1", "oneshot", 2)]
    r = row(matrix.document(plan, cells), LEAK)["cells"]
    assert r["0.16.0"] == {"state": NA, "reason": "pip cannot install hermes-agent==0.16.0: boom"}
    assert r["0.17.0"]["state"] == NA and "no turn completed" in r["0.17.0"]["reason"]
    assert r["0.18.2"] == {"state": NA, "reason": "hermes-agent 0.18.2 does not offer the tool session_search"}
    assert r["0.19.0"] == {"state": "seen", "seen": 1, "runs": 1, "interval": None}
    assert r["0.19.1"] == {"state": "not seen", "seen": 0, "runs": 2, "interval": list(wilson(0, 2))}


def test_a_tool_not_offered_in_another_scenario_does_not_make_the_cell_na():
    plan = Plan(("0.19.0",), ("oneshot",), 1)
    doc = matrix.document(plan, [cell("0.19.0", "oneshot", 1, not_offered={"tui": ["session_search"]})])
    assert doc["rows"] == []  # nothing seen: no class at all
    doc = matrix.document(plan, [cell("0.19.0", "oneshot", 1, LEAK, not_offered={"tui": ["session_search"]})])
    assert row(doc, LEAK)["cells"]["0.19.0"]["state"] == "seen"


def test_classes_are_per_scenario_and_sorted_most_severe_first():
    plan = Plan(("0.19.0",), ("oneshot", "tui"), 1)
    key = Finding("wrong_key", "default", "alpha", "key", "request", "f", scenario="tui", phase="turns")
    doc = matrix.document(plan, [cell("0.19.0", "oneshot", 1, LEAK), cell("0.19.0", "tui", 1, CWD, key)])
    assert [r["kind"] for r in doc["rows"]] == ["wrong_key", "request_leak", "env_leak"]
    assert row(doc, CWD)["audit"] == "tui"


@pytest.mark.parametrize(("statuses", "want"), [
    (["clean", "leak"], "leak"), (["clean", "inconclusive"], "inconclusive"), (["clean", NA], "clean"),
    ([NA, NA], "inconclusive"), (["clean", "clean"], "clean")])
def test_the_matrix_verdict(statuses, want):
    cells = [cell("0.19.0", "oneshot", i, LEAK if s == "leak" else None, status=s) if s == "leak"
             else cell("0.19.0", "oneshot", i, status=s) for i, s in enumerate(statuses, 1)]
    assert matrix.status(cells) == want


def test_a_cell_outside_the_plan_is_refused():
    with pytest.raises(MatrixError, match="not in the plan"):
        matrix.document(Plan(("0.19.0",), ("oneshot",), 1), [cell("0.18.2", "oneshot", 1)])


# --- shards and merge ---------------------------------------------------------------------------------------


def recorded() -> tuple[Plan, list[Cell]]:
    """A recorded 4-release x 2-scenario x 3-run matrix (no Hermes): intermittent, fixed, n/a cells."""
    plan = Plan(RELEASES, ("oneshot", "tui"), 3, ("memory",))
    cells = []
    for r in RELEASES:
        for s in ("oneshot", "tui"):
            for i in (1, 2, 3):
                if r == "0.16.0" and s == "tui":
                    cells.append(cell(r, s, i, status=NA, reason="scenario tui: no per-profile sessions"))
                elif s == "oneshot":
                    cells.append(cell(r, s, i, *([LEAK] if r != "0.16.0" else [])))
                else:
                    cells.append(cell(r, s, i, *([CWD] if i != 2 else [])))
    return plan, cells


@pytest.mark.parametrize("count", [1, 2, 3, 5, 24, 30])
def test_merge_of_n_shards_equals_the_unsharded_matrix(tmp_path, count):
    plan, cells = recorded()
    whole = matrix.document(plan, cells)
    by_key = {c.key: c for c in cells}
    shards = []
    for i in range(1, count + 1):
        keys = matrix.shard_keys(plan, i, count)
        doc = matrix.document(plan, [by_key[k] for k in keys], f"{i}/{count}")
        assert doc["complete"] is (count == 1)
        folder = tmp_path / f"shard-{i}"
        runner.write_matrix(folder, json.loads(json.dumps(doc)))  # through the file, as CI passes it
        shards.append(folder)
    assert sorted(k for i in range(1, count + 1) for k in matrix.shard_keys(plan, i, count)) == sorted(by_key)
    merged = runner.merge_dirs(shards, tmp_path / "merged")
    assert merged == json.loads(json.dumps(whole))
    assert json.loads((tmp_path / "merged" / "matrix.json").read_text()) == merged
    assert (tmp_path / "merged" / "matrix.md").read_text() == render_markdown(whole)
    r = row(merged, CWD)["cells"]
    assert r["0.16.0"]["state"] == NA and r["0.19.0"] == {"state": "seen", "seen": 2, "runs": 3,
                                                          "interval": list(wilson(2, 3))}


def test_matrix_json_has_one_line_per_cell_and_row_and_parses_back(tmp_path):
    plan, cells = recorded()
    doc = json.loads(json.dumps(matrix.document(plan, cells)))
    runner.write_matrix(tmp_path, doc)
    lines = (tmp_path / "matrix.json").read_text().splitlines()
    assert json.loads("\n".join(lines)) == doc
    for item in doc["cells"] + doc["rows"]:
        assert f"    {json.dumps(item)}," in lines or f"    {json.dumps(item)}" in lines
    # a line per key, the braces, the two closing brackets, a line per cell and row
    assert len(lines) == len(doc) + 2 + 2 + len(doc["cells"]) + len(doc["rows"])


@pytest.mark.parametrize(("path", "releases"), [("docs/matrix/matrix.json", 4), ("docs/matrix/cron/matrix.json", 3),
                                               ("docs/matrix/services/matrix.json", 7),
                                               *((f"docs/matrix/messaging/{name}.json", 3) for name in (
                                                   "platforms", "webhooks", "webhooks-launch-unset",
                                                   "allowlists-unset"))])
def test_the_committed_matrix_is_a_complete_matrix_in_the_written_layout(path, releases):
    text = (Path(__file__).parent.parent / path).read_text()
    doc = json.loads(text)
    matrix.load_document(doc, path)
    assert doc["complete"] is True and len(doc["plan"]["releases"]) >= releases
    assert text == matrix.dumps(doc)


def test_shards_are_deterministic_and_spread_over_releases():
    plan, _ = recorded()
    assert matrix.shard_keys(plan, 1, 4) == matrix.shard_keys(plan, 1, 4)
    assert {r for r, _, _ in matrix.shard_keys(plan, 1, 4)} == set(RELEASES)


def test_merge_refuses_a_missing_a_duplicated_or_a_foreign_shard(tmp_path):
    plan, cells = recorded()
    by_key = {c.key: c for c in cells}
    docs = [matrix.document(plan, [by_key[k] for k in matrix.shard_keys(plan, i, 2)], f"{i}/2") for i in (1, 2)]
    with pytest.raises(MatrixError, match="in no shard"):
        matrix.merge([("a", docs[0])])
    with pytest.raises(MatrixError, match="in two shards"):
        matrix.merge([("a", docs[0]), ("b", docs[1]), ("c", docs[0])])
    other = matrix.document(Plan(RELEASES, ("oneshot",), 3, ("memory",)), [])
    with pytest.raises(MatrixError, match="another plan"):
        matrix.merge([("a", docs[0]), ("b", other)])
    cron = matrix.document(Plan(RELEASES, ("oneshot", "tui"), 3, ("memory",), ("cron",)), [])
    with pytest.raises(MatrixError, match="another plan"):
        matrix.merge([("a", docs[0]), ("b", cron)])
    with pytest.raises(MatrixError, match="not a version-1 matrix"):
        matrix.merge([("a", {"version": 9})])


@pytest.mark.parametrize("spec", ["3/2", "0/2", "a/b", "1/0", "1", "1/2/3", "-1/2", " "])
def test_a_bad_shard_spec_is_refused(spec):
    with pytest.raises(UsageError, match="--shard"):
        options.parse_shard(spec)


def test_shard_and_release_specs():
    assert options.parse_shard("2/3") == (2, 3)
    assert options.parse_releases("0.16.0, 0.19.0") == {"0.16.0": None, "0.19.0": None}
    assert options.parse_releases(f"0.19.0={sys.executable}") == {"0.19.0": Path(sys.executable).absolute()}
    for bad in ("0.19.0;rm", "", "0.19.0,0.19.0", "latest", "0.19.0=/nonexistent/python"):
        with pytest.raises(UsageError, match="--hermes"):
            options.parse_releases(bad)
    assert options.parse_scenarios("all") == ["oneshot", "tui", "serve", "gateway", "api_server", "dashboard", "acp"]
    with pytest.raises(UsageError, match="unknown scenario"):
        options.parse_scenarios("oneshot,nope")


# --- reports ------------------------------------------------------------------------------------------------


class _Cells(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.cells: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "td" and "data-state" in dict(attrs):
            self.cells.append(dict(attrs))


def test_reports_escape_and_carry_each_cell(tmp_path):
    plan, cells = recorded()
    for c in cells[:3]:  # every run of 0.16.0 oneshot
        c.reason, c.status = "<script>alert(1)</script> | pipe", NA
    doc = matrix.document(plan, cells)
    html, md = render_html(doc), render_markdown(doc)
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "\\| pipe" in md
    assert "| n/a [1] |" in md and "[1] n/a: <script>alert(1)</script> \\| pipe" in md  # each reason once, numbered
    assert md.count("alert(1)") == html.count("alert(1)") == 2  # the runs table and the note
    parser = _Cells()
    parser.feed(html)
    assert len(parser.cells) == len(doc["rows"]) * len(RELEASES)
    assert {c["data-state"] for c in parser.cells} == {"seen", "not seen", NA}
    runner.write_matrix(tmp_path, doc)
    for name in runner.FILES:
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o600


# --- baselines keep the rate --------------------------------------------------------------------------------


def test_a_baseline_keeps_each_incidents_rate_and_intermittent_still_means_k_lt_n(tmp_path):
    incidents = write(tmp_path / "b.json", [[LEAK, CWD], [LEAK], [LEAK, CWD]])
    by_entry = {i["entry"]: i for i in incidents}
    search, terminal = by_entry["tool session_search"], by_entry["tool terminal"]
    assert (search["seen"], search["runs"], search["intermittent"]) == (3, 3, False)
    assert (terminal["seen"], terminal["intermittent"]) == (2, True)
    assert [(h["hop"], h["seen"]) for h in search["hops"]] == [("tool session_search | default -> alpha", 3)]
    assert [(c["kind"], c["role"], c["seen"]) for c in terminal["classes"]] == [("env_leak", "crossing", 2)]
    assert search["documented"] == ["F8"] and search["phases"] == [["oneshot", "lookups"]]
    assert load(tmp_path / "b.json").version == 4


# --- bad input through the CLI ------------------------------------------------------------------------------


def one_line_exit_2(tmp_path: Path, *args: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "c"),
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "c").exists()  # nothing installed
    return done.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (["matrix", "--hermes", "0.19.0", "--shard", "3/2", "--out", "m"], "--shard '3/2'"),
    (["matrix", "--hermes", "0.19.0", "--shard", "0/2", "--out", "m"], "--shard '0/2'"),
    (["matrix", "--hermes", "0.19.0", "--shard", "a/b", "--out", "m"], "--shard 'a/b'"),
    (["matrix", "--hermes", "0.19.0;x", "--out", "m"], "not a release version"),
    (["matrix", "--hermes", "0.19.0,,0.18.2", "--out", "m"], "not a release version"),
    (["matrix", "--hermes", "0.19.0", "--scenario", "nope", "--out", "m"], "unknown scenario 'nope'"),
    (["matrix", "--hermes", "0.19.0", "--runs", "0", "--out", "m"], "--runs"),
    (["matrix", "--hermes", "0.19.0", "--tools", "nope", "--out", "m"], "unknown tool group"),
    (["matrix", "--hermes", "0.19.0", "--phases", "nope", "--out", "m"], "unknown phase 'nope'"),
    (["matrix", "--hermes", "0.19.0", "--unset", "nope.x", "--out", "m"], "unknown setting 'nope.x' for --unset"),
    (["matrix", "--hermes", "0.19.0", "--scenario", "gateway", "--unset", "slack.token", "--out", "m"],
     "the run does not drive 'slack'"),
    (["matrix", "--hermes", "0.19.0", "--out", "/proc/m"], "cannot create a writable folder"),
    (["matrix", "--hermes", "0.19.0", "--out", "file"], "not a directory"),
    (["merge", "nothing", "--out", "m"], "cannot read"),
    (["merge", "bad", "--out", "m"], "not a version-1 matrix.json"),
    (["merge", "good", "--out", "good"], "is one of the shards"),
    (["run", "--runs", "0", "--out", "m"], "--runs"),
    (["run", "--services", "nope", "--out", "m"], "unknown service 'nope'"),
    (["run", "--plant", "memory-key", "--services", "mcp", "--out", "m"], "needs the service 'memory'"),
    (["run", "--plant", "acp-session", "--scenario", "tui", "--out", "m"], "needs --scenario acp or all"),
])
def test_bad_matrix_input_is_one_line_and_exit_2(tmp_path, args, needle):
    (tmp_path / "file").write_text("x")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "matrix.json").write_text('{"version": 9}')
    runner.write_matrix(tmp_path / "good", matrix.document(*recorded()))
    err = one_line_exit_2(tmp_path, *args)
    assert needle in err, err
    assert not (tmp_path / "m").exists()


def test_a_given_python_of_another_release_is_refused(tmp_path):
    err = one_line_exit_2(tmp_path, "matrix", "--hermes", f"0.19.0={sys.executable}", "--out", "m")
    assert f"Hermes at {sys.executable} is broken" in err, err
    assert not (tmp_path / "m").exists()


# --- run --runs N (run_audit replaced: no Hermes) -----------------------------------------------------------


def test_run_runs_n_reports_seen_k_of_n_per_incident_and_class(tmp_path, monkeypatch, capsys):
    seen_in = {1: [LEAK], 2: [], 3: [LEAK]}

    def fake_run_audit(opts):
        run = int(opts.out.name.split("-")[1])
        opts.out.mkdir(parents=True)
        return AuditResult(Verdict(seen_in[run]), ["default", "alpha"], opts.scenario, {"hermes-agent": "0.19.0"},
                           timeline=[{"ok": True}], out=opts.out)

    monkeypatch.setattr(cli, "run_audit", fake_run_audit)
    code = cli.main(["run", "--runs", "3", "--out", str(tmp_path / "rate")])
    out = capsys.readouterr().out
    assert code == 1  # a run leaked
    assert f"seen 2/3 (95% CI {round(wilson(2, 3)[0] * 100)}-{round(wilson(2, 3)[1] * 100)}%)" in out, out
    assert "high     F8      oneshot tool session_search: request_leak default -> alpha at oneshot/lookups" in out
    doc = json.loads((tmp_path / "rate" / "matrix.json").read_text())
    [incident] = doc["incidents"]
    assert incident["documented"] == ["F8"] and incident["cells"]["0.19.0"]["seen"] == 2
    assert doc["rows"][0]["fingerprint"] == LEAK.fingerprint() and doc["rows"][0]["cells"]["0.19.0"]["seen"] == 2
    assert doc["plan"] == {"releases": ["0.19.0"], "scenarios": ["oneshot"], "runs": 3, "tools": None, "phases": None,
                           "services": None, "unset": []}
    assert [c["evidence"] for c in doc["cells"]] == ["run-1", "run-2", "run-3"]
    assert cli.main(["run", "--runs", "3", "--out", str(tmp_path / "rate")]) == 2  # holds a matrix: --force


def test_a_cells_reason_names_files_relative_to_its_evidence_folder(tmp_path):
    out = tmp_path / "m" / "0.18.2" / "gateway" / "run-1"
    result = AuditResult(Verdict([], [], [f"flows: {out}/flows.mitm is empty (no flow was recorded)"]),
                         ["default", "alpha"], "gateway", {"hermes-agent": "0.18.2"}, out=out)
    cell = runner.cell_of(result, "0.18.2", "gateway", 1, tmp_path / "m")
    assert cell.reason == "flows: flows.mitm is empty (no flow was recorded)"
    assert cell.evidence == "0.18.2/gateway/run-1"


def test_matrix_phases_reach_every_run_and_the_plan(tmp_path, monkeypatch):
    ran = []

    def fake_run_audit(opts):
        ran.append((opts.scenario, opts.phases))
        opts.out.mkdir(parents=True)
        return AuditResult(Verdict([]), ["default", "alpha"], opts.scenario, {"hermes-agent": "0.19.0"},
                           timeline=[{"ok": True}], out=opts.out)

    monkeypatch.setattr(cli, "run_audit", fake_run_audit)
    monkeypatch.setattr(runner, "prepare_release", lambda v, *_: runner.Release(v, Path(sys.executable), Features()))
    out = tmp_path / "m"
    assert cli.main(["matrix", "--hermes", "0.19.0", "--scenario", "serve,gateway", "--phases", "all",
                     "--out", str(out), "--quiet"]) == 0
    assert ran == [("serve", list(ALL_PHASES)), ("gateway", list(ALL_PHASES))]
    assert json.loads((out / "matrix.json").read_text())["plan"]["phases"] == list(ALL_PHASES)
    assert f"phases {', '.join(ALL_PHASES)}" in (out / "matrix.md").read_text()
    ran.clear()
    assert cli.main(["matrix", "--hermes", "0.19.0", "--scenario", "serve", "--out", str(tmp_path / "d"),
                     "--quiet"]) == 0
    assert ran == [("serve", [])]  # no --phases: the scenario's default
    assert json.loads((tmp_path / "d" / "matrix.json").read_text())["plan"]["phases"] is None


def test_matrix_platforms_and_unset_settings_reach_every_run_and_the_plan(tmp_path, monkeypatch):
    """`--platforms` and `--unset` are every run's, as for `run`, and the plan's (so shards of other settings do not
    merge); the heading of matrix.md says them."""
    ran = []

    def fake_run_audit(opts):
        ran.append((opts.services, opts.unset))
        opts.out.mkdir(parents=True)
        return AuditResult(Verdict([]), ["default", "alpha"], opts.scenario, {"hermes-agent": "0.19.0"},
                           timeline=[{"ok": True}], out=opts.out)

    monkeypatch.setattr(cli, "run_audit", fake_run_audit)
    monkeypatch.setattr(runner, "prepare_release", lambda v, *_: runner.Release(v, Path(sys.executable), Features()))
    out = tmp_path / "m"
    assert cli.main(["matrix", "--hermes", "0.18.2,0.19.0", "--scenario", "gateway", "--services", "none",
                     "--platforms", "slack,mattermost", "--unset", "slack.allowed_users,launch:mattermost.token",
                     "--out", str(out), "--quiet"]) == 0
    assert ran == [(["slack", "mattermost"], ["slack.allowed_users", "launch:mattermost.token"])] * 2
    plan = json.loads((out / "matrix.json").read_text())["plan"]
    assert plan["services"] == ["mattermost", "slack"]
    assert plan["unset"] == ["launch:mattermost.token", "slack.allowed_users"]
    assert "; services mattermost, slack; unset launch:mattermost.token, slack.allowed_users" in \
        (out / "matrix.md").read_text()
    ran.clear()
    assert cli.main(["matrix", "--hermes", "0.19.0", "--scenario", "gateway", "--out", str(tmp_path / "d"),
                     "--quiet"]) == 0
    assert ran == [(None, [])]  # neither: the default services, every tenant sets every setting
    assert json.loads((tmp_path / "d" / "matrix.json").read_text())["plan"]["unset"] == []


def test_a_matrix_of_other_unset_settings_is_another_plan_and_an_old_shard_merges():
    plan, cells = recorded()
    by_key = {c.key: c for c in cells}
    old, new = (matrix.document(plan, [by_key[k] for k in matrix.shard_keys(plan, i, 2)], f"{i}/2") for i in (1, 2))
    del old["plan"]["unset"]  # a shard written before --unset: nothing left unset
    assert matrix.merge([("old", old), ("new", new)]) == matrix.document(plan, cells)
    other = matrix.document(replace(plan, unset=("slack.allowed_users",)), [])
    with pytest.raises(MatrixError, match="another plan"):
        matrix.merge([("new", new), ("other", other)])


def test_phases_spelt_otherwise_make_the_same_plan_and_an_old_shard_merges():
    def plan(*phases: str) -> Plan:
        return options.MatrixOptions({"0.19.0": None}, ["serve"], 1, Path("m"), phases=list(phases)).plan

    assert plan("cron", "turns", "turns").phases == ("turns", "cron") == plan("turns", "cron").phases
    assert plan(*DEFAULT_PHASES).phases is None and plan(*reversed(DEFAULT_PHASES)).phases is None
    assert plan().phases is None and plan(*ALL_PHASES).phases == ALL_PHASES
    plan_, cells = recorded()
    by_key = {c.key: c for c in cells}
    old, new = (matrix.document(plan_, [by_key[k] for k in matrix.shard_keys(plan_, i, 2)], f"{i}/2") for i in (1, 2))
    del old["plan"]["phases"]  # a shard written before --phases existed
    assert matrix.merge([("old", old), ("new", new)]) == matrix.document(plan_, cells)


def test_incidents_are_counted_per_release_and_merge_like_classes(tmp_path):
    plan, cells = recorded()
    incident = build([LEAK])[0]
    entry = {incident.id: {"entry": incident.entry, "kinds": incident.kinds, "severity": incident.severity,
                           "documented": ["F8"], "victim": "default", "seen_in": "alpha", "scenario": "oneshot",
                           "phase": "lookups", "tool": "session_search", "service": None}}
    cells = [replace(c, incidents=entry if LEAK.fingerprint() in c.classes else {}) for c in cells]
    whole = matrix.document(plan, cells)
    [row_] = whole["incidents"]
    assert row_["id"] == incident.id and row_["audit"] == "oneshot" and row_["first_seen"] == "0.17.0"
    assert row_["cells"]["0.16.0"] == {"state": "not seen", "seen": 0, "runs": 3, "interval": list(wilson(0, 3))}
    assert row_["cells"]["0.19.0"]["seen"] == 3
    halves = [matrix.document(plan, [c for c in cells if c.key in matrix.shard_keys(plan, i, 2)], f"{i}/2")
              for i in (1, 2)]
    assert matrix.merge([("1", halves[0]), ("2", halves[1])]) == whole
    md, html = render_markdown(whole), render_html(whole)
    assert "| high | F8 | `tool session_search` | request_leak default -> alpha at oneshot/lookups | " in md
    assert f'<tr data-incident="{incident.id}" data-documented="F8">' in html


def test_an_incident_row_holds_the_f_numbers_of_every_release_not_only_the_first():
    """An incident (one entry point) can cross differently in each release: its row names every F-number any cell
    linked it to, not the earliest release's alone (F27's skills in 0.16.0, F15's subagent key in 0.19.0)."""
    plan, cells = recorded()
    incident = build([LEAK])[0]

    def entry(numbers: list[str]) -> dict:
        return {incident.id: {"entry": incident.entry, "kinds": incident.kinds, "severity": incident.severity,
                              "documented": numbers, "victim": "default", "seen_in": "alpha", "scenario": "oneshot",
                              "phase": "lookups", "tool": "session_search", "service": None}}
    by_release = {"0.16.0": [], "0.17.0": ["F27"], "0.18.2": [], "0.19.0": ["F15"]}
    cells = [replace(c, incidents=entry(by_release[c.release])) for c in cells]
    [row_] = matrix.document(plan, cells)["incidents"]
    assert row_["documented"] == ["F15", "F27"]


def test_a_matrix_from_before_incidents_is_read_and_not_merged_with_new_shards():
    plan, cells = recorded()
    old = matrix.document(plan, cells)
    del old["incidents"]
    old["fingerprint_version"] = 2
    assert len(matrix.load_document(old, "old")[1]) == len(cells)
    assert "## Incidents (0)" in render_markdown(old) and '<table id="incidents">' in render_html(old)
    with pytest.raises(MatrixError, match="version-2 fingerprints"):
        matrix.merge([("old", old)])


# --- what a release offers ----------------------------------------------------------------------------------


def test_a_scenario_needs_only_its_own_features():
    old = Features(usage_file=False, serve=False, multiplex=False, tui=True, services=frozenset({"web", "aux"}))
    assert missing(old, "serve") == "scenario serve: no `hermes serve`"
    assert missing(old, "gateway") == "scenario gateway: no multiplexed gateway (gateway.multiplex_profiles)"
    assert missing(old, "oneshot") is None and missing(old, "tui") is None  # --usage-file is not needed
    assert missing(old, "all") == "scenario serve: no `hermes serve`"
    assert missing(Features(), "all") is None
    assert missing(Features(dashboard=False), "dashboard") == \
        "scenario dashboard: no web dashboard that says the port it bound (hermes dashboard --port 0)"
    assert missing(Features(dashboard=False), "tui") is None
    assert missing(Features(acp=False), "acp") == "scenario acp: no ACP adapter (hermes acp with the `acp` extra)"
    assert missing(Features(acp=False), "all") == missing(Features(acp=False), "acp")
    assert missing(Features(acp=False), "oneshot") is None


class _Install:
    """Stands in for `Hermes`: counts the children the probe starts and answers as an old release would."""

    def __init__(self, python: Path) -> None:
        self.python, self.children = python, 0
        self.sandbox, self.procs = self, self
        self.home = python.parent

    def env(self) -> dict[str, str]:
        return {}

    def run(self, argv: list[str], **_: object) -> tuple[int, str, str]:
        self.children += 1
        if argv[1] == "-c":
            return 0, json.dumps({"oneshot": True, "usage_file": False, "multiplex": False, "tui": True,
                                  "acp": False, "dashboard": False, "services": ["web", "aux"]}), ""
        return 2, "", "invalid choice: 'serve'"


def test_a_release_is_probed_once_per_python_and_version(tmp_path, monkeypatch):
    monkeypatch.setattr(features, "_probed", {})
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    hermes = _Install(tmp_path / "venv" / "bin" / "python")
    old = Features(usage_file=False, serve=False, multiplex=False, tui=True, acp=False, dashboard=False,
                   services=frozenset({"web", "aux"}))
    assert features.probe(hermes, "0.16.0", PROBES) == old and hermes.children == 2
    same = _Install(tmp_path / "venv" / "bin" / ".." / "bin" / "python")  # the same install, spelt otherwise
    assert features.probe(same, "0.16.0", PROBES) == old and same.children == 0
    assert features.probe(hermes, "0.16.1", PROBES) == old and hermes.children == 4  # another version: asked again
    other = _Install(tmp_path / "other" / "bin" / "python")
    (tmp_path / "other" / "bin").mkdir(parents=True)
    assert features.probe(other, "0.16.0", PROBES) == old and other.children == 2  # another install: asked again


# --- the release cache --------------------------------------------------------------------------------------


def test_a_venv_renamed_into_the_cache_keeps_working_scripts(tmp_path):
    tmp, final = tmp_path / ".0.19.0-x", tmp_path / "0.19.0"
    (tmp / "bin").mkdir(parents=True)
    (tmp / "bin" / "hermes").write_bytes(f"#!{tmp}/bin/python\nimport sys\n".encode())
    (tmp / "bin" / "other").write_bytes(f"#!/usr/bin/env python\n# {tmp}/bin/python\n".encode())  # near miss
    (tmp / "bin" / "python").symlink_to(sys.executable)
    install._relink_scripts(tmp, final)
    assert (tmp / "bin" / "hermes").read_bytes() == f"#!{final}/bin/python\nimport sys\n".encode()
    assert (tmp / "bin" / "other").read_bytes() == f"#!/usr/bin/env python\n# {tmp}/bin/python\n".encode()


def test_an_uninstallable_release_is_an_na_column_not_a_crash(tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run([*CLI, "matrix", "--hermes", "0.0.1.dev0", "--out", str(tmp_path / "m")],
                          capture_output=True, text=True, timeout=600, env=env)
    doc = json.loads((tmp_path / "m" / "matrix.json").read_text())
    assert [c["status"] for c in doc["cells"]] == [NA]
    assert doc["cells"][0]["reason"].startswith("pip cannot install hermes-agent==0.0.1.dev0: ")
    assert done.returncode == 3 and doc["status"] == "inconclusive", done  # nothing ran: nothing proven
    assert list((tmp_path / "cache" / "tenancy-audit" / "hermes").iterdir()) == []  # no half-written install
    assert "installed in" not in done.stderr and "pip cannot install" in done.stderr

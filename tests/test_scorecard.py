"""`tenancy-audit scorecard`: its cases are the seed's, its figures what the detectors saw, and a broken detector
lowers them enough to fail `--fail-under`."""

from __future__ import annotations

import json
import random
import stat
from pathlib import Path

import pytest

from harness import cli
from harness.detect import scan
from harness.detect.engine import codecs, records
from harness.proof.cases import KINDS, mint
from harness.proof.channels import CHANNELS, DECOYS
from harness.proof.encodings import BY_NAME
from harness.proof.score import Tally
from harness.proof.scorecard import Options, cases_of, run

#: A few encodings of every sort: the matcher's forms, a compression, a chain in text, an archive, a run.
SOME = tuple(BY_NAME[n] for n in ("plain", "base64+1", "gzip", "base64-lf/gzip", "zip", "hex/zlib", "br"))


def plan(seed: int, quick: bool = False) -> list:
    rng = random.Random(seed)
    return cases_of(rng, Options(seed=seed, quick=quick), mint(rng, {}))


def test_the_same_seed_gives_the_same_cases_and_another_seed_others() -> None:
    first, again, other = plan(7), plan(7), plan(8)
    assert first == again
    assert [c.payload for c in first] != [c.payload for c in other]
    assert len(plan(7, quick=True)) < len(first)


def test_the_full_plan_covers_every_channel_kind_decoy_and_encoding() -> None:
    cases = plan(3)
    assert sum(c.positive for c in cases) >= 2000 and sum(not c.positive for c in cases) >= 2000
    assert {c.channel for c in cases} == {c.name for c in CHANNELS}
    assert {c.kind for c in cases if c.positive} == set(KINDS)
    assert {c.decoy for c in cases} >= {None, *DECOYS, "public"}
    assert {c.encoding for c in cases} == set(BY_NAME)
    assert all(c.payload and (c.positive == (c.victim is not None)) for c in cases)


def test_tally_figures() -> None:
    t = Tally(tp=9, fn=1, fp=2, tn=8)
    assert (t.recall, t.fpr) == (0.9, 0.2) and t.youden == pytest.approx(0.7)
    assert Tally().youden == 1.0  # nothing seeded: nothing missed


def test_a_small_run_through_the_live_addon_and_reconcile(tmp_path: Path) -> None:
    channels = ("provider.headers", "response.sse", "service.memory", "env", "file.name", "sqlite.freed",
                "log.shared", "rpc.stdio")
    card = run(Options(seed=11, quick=True, out=tmp_path / "ev", channels=channels, encodings=SOME))
    assert set(card.channels) == {*channels, "saved-flows"}
    assert (card.misses, card.false_positives) == ([], [])
    assert card.overall.youden == 1.0 and card.overall.tp > 20 and card.overall.tn > 20
    assert (tmp_path / "ev" / "flows.mitm").exists() and (tmp_path / "ev" / "registry.yaml").exists()
    assert {stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "ev").rglob("*")} == {0o600, 0o700}
    card.write(tmp_path / "card.json")
    doc = json.loads((tmp_path / "card.json").read_text())
    assert doc["seed"] == 11 and doc["overall"]["youden"] == 1.0
    assert stat.S_IMODE((tmp_path / "card.json").stat().st_mode) == 0o600


def test_a_broken_detector_lowers_the_score_and_fails_the_command(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """gzip decoded to nothing: every case through gzip is missed; the command exits 1 under --fail-under."""
    decode = codecs.decode
    monkeypatch.setattr(codecs, "decode", lambda codec, *a: iter(()) if codec == "gzip" else decode(codec, *a))
    out = tmp_path / "card.json"
    argv = ["scorecard", "--seed", "5", "--quick", "--channels", "file,log", "--fail-under", "0.99", "--json", str(out)]
    assert cli.main(argv) == 1
    doc = json.loads(out.read_text())
    assert doc["overall"]["recall"] < 1 and doc["misses"]
    gzipped = {e.name for e in BY_NAME.values() if any(step.startswith("gzip") for step in e.steps)}  # members too
    assert {m["encoding"] for m in doc["misses"]} <= gzipped
    assert "FAILED: Youden index" in capsys.readouterr().out


def test_every_framing_is_scored_on_its_own_too(tmp_path: Path) -> None:
    """A framing's cases count in their channel's row and in the framing's, which the JSON holds too; records not
    reassembled (every cut point missed) lower the records' rows only."""
    framed = tuple(BY_NAME[n] for n in ("plain", "records-ndjson", "qp", "xxd", "gzip-members", "utf16le/base64"))
    card = run(Options(seed=12, quick=True, channels=("file", "log"), encodings=framed))
    assert set(card.framings) == {"records-ndjson", "qp", "xxd", "gzip-members", "utf16le/base64"}
    assert all(t.youden == 1.0 and t.tp and t.tn for t in card.framings.values())
    assert sum(t.tp for t in card.framings.values()) < card.overall.tp  # the plain cases are in no framing's row
    assert "framings" in card.to_dict() and any(line.startswith("framing ") for line in card.lines())


def test_a_framing_not_reassembled_lowers_its_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "cut_points", lambda window, marked, piece_ends, longest: [])
    framed = tuple(BY_NAME[n] for n in ("records-ndjson", "records-jsonrpc", "xxd"))
    card = run(Options(seed=13, quick=True, channels=("file",), encodings=framed))
    assert card.framings["records-ndjson"].recall == card.framings["records-jsonrpc"].recall == 0
    assert card.framings["xxd"].youden == 1.0


def test_a_detector_reporting_a_tenants_own_canary_raises_the_false_positive_rate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scan, "_counts", lambda hit, owner: True)
    card = run(Options(seed=6, channels=("file",), encodings=SOME))
    assert card.overall.fpr > 0 and {fp["decoy"] for fp in card.false_positives} == {"own"}


@pytest.mark.parametrize("argv, message", [
    (["--json", "/nonexistent/dir/card.json"], "cannot write --json"),
    (["--fail-under", "1.5"], "from -1 to 1"),
    (["--channels", "nope"], "unknown channel 'nope'"),
    (["--seed", "-1"], "must not be negative"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["scorecard", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_an_existing_keep_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["scorecard", "--keep", str(tmp_path)]) == 2
    assert "exists" in capsys.readouterr().err

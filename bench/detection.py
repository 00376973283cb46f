"""Regenerate the scorecard's figures in docs/detection.md: the full scorecard at its documented seed, its table
written between the `<!-- scorecard:begin -->` and `<!-- scorecard:end -->` lines.

    .venv/bin/python bench/detection.py [--seed N] [--smoke]

Exit 1 (and the page unchanged) when a case was missed or a decoy reported: each must first be explained there.
`--smoke` (what tests/test_benches.py runs) prints the table of a small scorecard instead and leaves the page alone:
the quick sample of a few channels (a provider request and an SSE response through the live addon, the saved flows,
a home's file and SQLite database, a log) in three encodings, in seconds."""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import mitmproxy.version

import harness
from harness.proof.channels import BY_NAME
from harness.proof.encodings import BY_NAME as ENCODINGS
from harness.proof.encodings import FRAMINGS
from harness.proof.score import Scorecard, Tally
from harness.proof.scorecard import Options, run

PAGE = Path(__file__).resolve().parent.parent / "docs" / "detection.md"
BEGIN, END = "<!-- scorecard:begin -->", "<!-- scorecard:end -->"
SEED = 35
#: `--smoke`: the channels and encodings of its small scorecard.
SMOKE_CHANNELS = ("provider.body", "response.sse", "file", "sqlite", "log")
SMOKE_ENCODINGS = ("plain", "base64+1", "gzip")


def _row(name: str, t: Tally, what: str) -> str:
    return (f"| {name} | {t.tp} | {t.fn} | {t.fp} | {t.tn} | {t.recall:.4f} | {t.fpr:.4f} | {t.youden:.4f} | "
            f"{what} |")


def table(card: Scorecard) -> list[str]:
    """The figures as the page shows them."""
    lines = [f"`tenancy-audit scorecard --seed {card.seed}` (tenancy-audit {harness.__version__}, mitmproxy "
             f"{mitmproxy.version.VERSION}, Python {platform.python_version()}; {card.seconds:.0f} s):", "",
             "| channel | TP | FN | FP | TN | recall | FPR | Youden | where the case is |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    lines += [_row(name, t, BY_NAME[name].what) for name, t in card.channels.items()]
    lines.append(_row("**overall**", card.overall, "every channel, the saved flows included"))
    lines += ["", "The framings, each over every channel that carries it (its cases are in those channels' rows too):",
              "", "| framing | TP | FN | FP | TN | recall | FPR | Youden | what it is |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    lines += [_row(name, t, FRAMINGS[name]) for name, t in card.framings.items()]
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--smoke", action="store_true", help="print a small scorecard's table; the page is left alone")
    a = ap.parse_args()
    opts = Options(seed=a.seed)
    if a.smoke:
        opts = Options(seed=a.seed, quick=True, channels=SMOKE_CHANNELS,
                       encodings=tuple(ENCODINGS[name] for name in SMOKE_ENCODINGS))
    card = run(opts, lambda msg: print(msg, file=sys.stderr))
    if card.misses or card.false_positives:
        for line in card.lines():
            print(line)
        return 1
    if a.smoke:
        print("\n".join(table(card)))
        return 0
    text = PAGE.read_text()
    head, rest = text.split(BEGIN + "\n", 1)
    _, tail = rest.split(END, 1)
    PAGE.write_text(head + BEGIN + "\n" + "\n".join(table(card)) + "\n" + END + tail)
    print(f"wrote {PAGE}: overall Youden {card.overall.youden:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`tenancy-audit scorecard`: its arguments, their checks (before anything runs: a bad one is one line, exit 2) and
what it prints. Exit 0, or 1 when the overall Youden index is under `--fail-under`."""

from __future__ import annotations

import argparse
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from harness.core.evidence import UsageError
from harness.proof.channels import BY_NAME
from harness.proof.scorecard import Options, run

HELP = ("seed canaries and same-shape decoys through every channel and encoding the audit reads, and print its "
        "true and false positive and negative counts, recall, false-positive rate and Youden index per channel")


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("scorecard", help=HELP)
    p.add_argument("--seed", type=int, help="the seed of every case (default: a random one, printed)")
    p.add_argument("--quick", action="store_true", help="a smaller sample (one positive and one decoy per channel "
                   "and encoding instead of four and four)")
    p.add_argument("--fail-under", type=float, metavar="X", help="exit 1 when the overall Youden index "
                   "(recall minus false-positive rate, -1 to 1) is under X")
    p.add_argument("--json", type=Path, dest="json_out", metavar="FILE", help="write the figures, every miss and "
                   "every false positive here as JSON (0600)")
    p.add_argument("--keep", type=Path, metavar="DIR", help="keep the evidence folder here (a new folder; "
                   "`tenancy-audit reconcile DIR` judges it again)")
    p.add_argument("--channels", help="only these channels, comma-separated (default: every one)")


def options(a: argparse.Namespace) -> Options:
    """The run's options, every argument checked first."""
    if a.seed is not None and a.seed < 0:
        raise UsageError("scorecard: --seed must not be negative")
    if a.fail_under is not None and not -1.0 <= a.fail_under <= 1.0:
        raise UsageError("scorecard: --fail-under is a Youden index, from -1 to 1")
    if a.json_out is not None:
        parent = a.json_out.parent
        if a.json_out.is_dir() or not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise UsageError(f"scorecard: cannot write --json {a.json_out} (not a writable file's path)")
    if a.keep is not None and a.keep.exists():
        raise UsageError(f"scorecard: --keep {a.keep} exists (name a new folder)")
    channels = tuple(c for c in (a.channels or "").split(",") if c)
    unknown = [c for c in channels if c not in BY_NAME or c == "saved-flows"]
    if unknown:
        raise UsageError(f"scorecard: unknown channel {unknown[0]!r} (choose from "
                         f"{', '.join(n for n in BY_NAME if n != 'saved-flows')})")
    seed = a.seed if a.seed is not None else secrets.randbelow(1 << 31)
    return Options(seed=seed, quick=a.quick, out=a.keep, channels=channels)


def main(a: argparse.Namespace, show: Callable[[str], None], say: Callable[[str], None]) -> int:
    """Run the scorecard the arguments ask for, print it, write its JSON."""
    opts = options(a)
    again = f"tenancy-audit scorecard --seed {opts.seed}{' --quick' if opts.quick else ''}"
    show(f"scorecard: seed {opts.seed} (the same cases again: {again})")
    card = run(opts, say)
    for line in card.lines():
        show(line)
    if a.json_out is not None:
        card.write(a.json_out)
        show(f"scorecard: wrote {a.json_out}")
    youden = card.overall.youden
    if a.fail_under is not None and youden < a.fail_under:
        show(f"scorecard: FAILED: Youden index {youden:.4f} is under {a.fail_under:g} (seed {opts.seed})")
        return 1
    return 0

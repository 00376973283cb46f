"""The scorecard's figures: per channel and overall, true and false positives and negatives, recall, false-positive
rate and Youden's index (recall minus false-positive rate), with every miss and every false positive listed; and the
same per framing (`encodings.FRAMINGS`), over the channels that carry it (counted in the channels' too)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.files import write_private
from harness.core.findings import Finding
from harness.proof.cases import Case
from harness.proof.channels import Channel
from harness.proof.encodings import FRAMINGS


@dataclass
class Tally:
    tp: int = 0
    fn: int = 0
    fp: int = 0
    tn: int = 0

    def add(self, positive: bool, reported: bool) -> None:
        if positive:
            self.tp, self.fn = self.tp + reported, self.fn + (not reported)
        else:
            self.fp, self.tn = self.fp + reported, self.tn + (not reported)

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 1.0

    @property
    def fpr(self) -> float:
        return self.fp / (self.fp + self.tn) if self.fp + self.tn else 0.0

    @property
    def youden(self) -> float:
        return self.recall - self.fpr

    def to_dict(self) -> dict[str, Any]:
        return {"tp": self.tp, "fn": self.fn, "fp": self.fp, "tn": self.tn, "recall": round(self.recall, 4),
                "fpr": round(self.fpr, 4), "youden": round(self.youden, 4)}


def _row(name: str, t: Tally) -> str:
    return f"{name:<18} {t.tp:>5} {t.fn:>4} {t.fp:>4} {t.tn:>5}  {t.recall:>6.4f}  {t.fpr:>6.4f}  {t.youden:>6.4f}"


def sees(case: Case, channel: Channel, finding: Finding) -> bool:
    """Whether `finding` reports the case's canary as its channel should (a decoy: any finding of its kinds)."""
    if finding.kind not in channel.kinds:
        return False
    if case.decoy is not None:
        return True
    same = finding.victim == case.victim and finding.canary == case.kind
    return same and (finding.transient or channel.name != "versions")


@dataclass
class Scorecard:
    """What one run of the scorecard measured."""

    seed: int
    quick: bool
    channels: dict[str, Tally] = field(default_factory=dict)
    framings: dict[str, Tally] = field(default_factory=dict)  # the cases of each framing, every channel's
    misses: list[dict[str, Any]] = field(default_factory=list)
    false_positives: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def judge(self, case: Case, channel: Channel, findings: Iterable[Finding]) -> None:
        """Count `case` as its channel's reader saw it (`findings`: those in its unit: its flow, file, line)."""
        findings = list(findings)
        reported = any(sees(case, channel, f) for f in findings)
        self.channels.setdefault(channel.name, Tally()).add(case.positive, reported)
        if case.encoding in FRAMINGS:
            self.framings.setdefault(case.encoding, Tally()).add(case.positive, reported)
        got = sorted({f"{f.kind}:{f.victim}:{f.canary}:{f.encoding}" for f in findings})
        if case.positive and not reported:
            self.misses.append(case.summary() | {"reader": channel.name, "got": got})
        elif not case.positive and reported:
            self.false_positives.append(case.summary() | {"reader": channel.name, "got": got})

    @property
    def overall(self) -> Tally:
        total = Tally()
        for t in self.channels.values():
            total.tp, total.fn, total.fp, total.tn = total.tp + t.tp, total.fn + t.fn, total.fp + t.fp, total.tn + t.tn
        return total

    def to_dict(self) -> dict[str, Any]:
        return {"version": 1, "seed": self.seed, "quick": self.quick, "seconds": round(self.seconds, 1),
                "overall": self.overall.to_dict(), "channels": {n: t.to_dict() for n, t in self.channels.items()},
                "framings": {n: t.to_dict() for n, t in self.framings.items()},
                "misses": self.misses, "false_positives": self.false_positives}

    def write(self, path: Path) -> None:
        """The JSON for CI, 0600 and atomically."""
        write_private(path, json.dumps(self.to_dict(), indent=2).encode() + b"\n")

    def lines(self, limit: int = 20) -> list[str]:
        """The table per channel and overall, then the misses and false positives (the first `limit` of each)."""
        head = f"{'channel':<18} {'TP':>5} {'FN':>4} {'FP':>4} {'TN':>5}  {'recall':>6}  {'FPR':>6}  {'Youden':>6}"
        rows = [head, "-" * len(head)]
        for name, t in [*self.channels.items(), ("overall", self.overall)]:
            if name == "overall":
                rows.append("-" * len(head))
            rows.append(_row(name, t))
        if self.framings:
            rows += ["", head.replace("channel", "framing", 1), "-" * len(head)]
            rows += [_row(name, t) for name, t in self.framings.items()]
        for title, items in (("missed", self.misses), ("false positive", self.false_positives)):
            rows += [f"{title}: {i['reader']} {i['encoding']} {i['kind']} {i['decoy'] or ''} ({i['case']}) "
                     f"got {', '.join(i['got']) or 'nothing'}" for i in items[:limit]]
            if len(items) > limit:
                rows.append(f"... and {len(items) - limit} more {title} cases (in the JSON)")
        return rows

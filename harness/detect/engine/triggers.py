"""The fixed strings `harness.detect.engine.matcher.Matcher.find` looks for besides the canaries' patterns (the
marker's forms, the `Doubles` triggers, the start of a JSON escape), found in one leftmost-first pass.
"""

from __future__ import annotations

from collections.abc import Iterable

import ahocorasick_rs

#: What a trigger string found in the data asks `Matcher.find` for (`Triggers`).
WINDOW, DOUBLE, ESCAPE = "window", "double", "escape"
ROLES = (WINDOW, DOUBLE, ESCAPE)


def _can_hide(found: bytes, other: bytes, *, first: bool) -> bool:
    """Whether a leftmost-first search that finds `found` may skip `other` for overlapping it: `other` can
    start inside `found`, or where it starts if `found` comes `first` in the automaton's order."""
    return any(other.startswith(found[k:]) or found.startswith(other, k) for k in range(0 if first else 1, len(found)))


class Triggers:
    """The fixed strings `Matcher.find` looks for besides the canaries' patterns, in one pass, by role:
    WINDOW, a marker form (the automaton runs around it); DOUBLE, a `Doubles` trigger; ESCAPE, the
    start of a `\\u00XX` escape.

    One pass, not one per role: a pass costs about as much as the prefilter's windows (3 ms per 32 MiB),
    so three would halve its speed-up (docs/performance.md). Leftmost-first, with at most 64 strings, is
    what ahocorasick-rs's SIMD searcher runs. A string skipped for overlapping a found one starts inside
    it, so the found one does the skipped one's job too (`roles`), and what is looked at around a found
    string reaches one string further."""

    def __init__(self, groups: dict[str, Iterable[bytes]]) -> None:
        own: dict[bytes, set[str]] = {}
        for role, forms in groups.items():
            for form in forms:
                own.setdefault(form, set()).add(role)
        # At one start the first string in this order wins: a marker form before an escape start.
        self.strings = sorted(own, key=lambda s: (min(map(ROLES.index, own[s])), s))
        self.roles = [frozenset(own[s].union(*(own[o] for j, o in enumerate(self.strings)
                                                if own[o] - own[s] and _can_hide(s, o, first=i < j))))
                      for i, s in enumerate(self.strings)]
        self.longest = max(map(len, self.strings), default=0)
        self._automaton = ahocorasick_rs.BytesAhoCorasick(
            self.strings, matchkind=ahocorasick_rs.MatchKind.LeftmostFirst) if self.strings else None

    def find(self, data: bytes | bytearray | memoryview) -> dict[str, list[int]]:
        """The positions of the strings found, in order, by role."""
        found: dict[str, list[int]] = {WINDOW: [], DOUBLE: [], ESCAPE: []}
        if self._automaton is not None:
            for i, pos, _ in self._automaton.find_matches_as_indexes(data):
                for role in self.roles[i]:
                    found[role].append(pos)
        return found

"""Derived canaries: canaries minted while a run goes on for text a model generated from a tenant's data (a reply, a
session title, a compression summary, a memory entry), their kinds and provenance (`Registry.derive` mints them).
"""

from __future__ import annotations

from dataclasses import dataclass

#: The kinds of text a model derives from what it was asked (`Derived.text`).
DERIVED_TEXTS = ("reply", "subagent", "title", "compression", "memory", "vision", "text")
#: The start of every derived canary's kind.
DERIVED = "derived_"


@dataclass(frozen=True)
class Derived:
    """Where a derived canary came from: the kind of text (`DERIVED_TEXTS`) a model generated from its owner's data,
    and the tenant whose model (provider, auxiliary or subagent model) generated it."""

    text: str
    by: str

    def to_dict(self) -> dict[str, str]:
        return {"text": self.text, "by": self.by}


def derived_kind(text: str, owner: str, by: str) -> str:
    """`derived_TEXT`, or `derived_TEXT_via_BY` when another tenant's model generated it (a kind has no `-`)."""
    return DERIVED + text + ("" if by == owner else "_via_" + by.replace("-", "_"))


def is_derived_kind(kind: str) -> bool:
    return kind.startswith(DERIVED)

"""Text a model stub derives from what it was asked, so that generated text can be traced to the tenants whose data
it came from.

A real model's title, summary, context-compression checkpoint, memory entry or reply is made of what it was sent: a
tenant's data travels inside the text Hermes then stores (a session's title, the compressed history, MEMORY.md). A
stub that answered with fixed text of its own tenant would hide where that text goes. So every model stub (the
provider, the auxiliary models, the subagents' model) adds to its text answer one *derived canary* per tenant whose
canaries the request's messages carried (`Registry.derive`: kind `derived_TEXT`, or `derived_TEXT_via_BY` when the
answering model is another tenant's); a request that carried none is the answering tenant's own. The canary is
minted on first use and reused for the same owner, text and model, so a run mints a handful and a finding's class is
the same in every run. The registry file is saved before the answer leaves, so the addon knows the canary before
any later request carries it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.protocol import SUBAGENT_TASK
from harness.core.registry import Registry
from harness.detect.engine.matcher import matcher_for

#: How each kind of text Hermes asks for begins (its prompts in Hermes 0.19.0: agent/title_generator.py,
#: agent/context_compressor.py, agent/background_review.py).
TITLE_PROMPT = "Generate a short, descriptive title"
COMPRESSION_MARKS = ("TURNS TO SUMMARIZE:", "You are a summarization agent")
REVIEW_PROMPT = "Review the conversation above"


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _has_image(messages: list[Any]) -> bool:
    return any(isinstance(m, dict) and isinstance(m.get("content"), list) and any(
        isinstance(p, dict) and p.get("type") in ("image_url", "input_image") for p in m["content"]) for m in messages)


def _last_user_text(messages: list[Any]) -> str:
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            return _text_of(m.get("content"))
    return ""


def text_kind(service: str, body: dict[str, Any]) -> str:
    """Which kind of text (`registry.DERIVED_TEXTS`) a chat request asks for: a memory review's entry, a subagent's
    or a main turn's reply (a request offering tools), else a title, a compression checkpoint, a picture's
    description, or other text."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    asked = _last_user_text(messages)
    everything = " ".join(_text_of(m.get("content")) for m in messages)
    if asked.startswith(REVIEW_PROMPT):
        return "memory"
    if service == "delegation" or asked.startswith(SUBAGENT_TASK):
        return "subagent"
    if body.get("tools"):
        return "reply"
    if TITLE_PROMPT in everything:
        return "title"
    if any(mark in everything for mark in COMPRESSION_MARKS):
        return "compression"
    return "vision" if _has_image(messages) else "text"


@dataclass
class Deriver:
    """Mints the derived canaries of the model stubs' answers in the run's registry, and saves its file."""

    registry: Registry
    path: Path

    def sources(self, messages: list[Any]) -> list[str]:
        """The tenants whose canaries (derived ones included) `messages` carry, in the registry's order."""
        data = json.dumps(messages).encode()
        found = {hit.tenant for hit in matcher_for(self.registry).find(data)}
        return [name for name in self.registry.names() if name in found]

    def tokens(self, by: str, text: str, messages: list[Any]) -> list[str]:
        """One derived canary of `text` per tenant whose data `messages` carry (none: `by`'s own), as `by`'s model
        generated it."""
        owners = self.sources(messages) or [by]
        with self.registry.lock:
            minted = [self.registry.derive(owner, text, by) for owner in owners]
            if any(new for _, new in minted):
                self.registry.save(self.path)
        return [value for value, _ in minted]

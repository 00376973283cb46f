"""Conversations carried across profiles: another profile's tool calls and results in a tenant's chat request.

A chat request re-sends its conversation: the tool calls of its assistant messages (by id) and their results (the
`role: tool` messages, by `tool_call_id`). A call belongs to the tenant whose request held it first: its Hermes ran
the call and sent the result to its own provider. The same call in a later request of another tenant means that
tenant's provider was sent the other's conversation (the API server continuing another profile's stored response:
F18), every tool of it at once. A finding in such a message, or in an env snapshot taken from one, was carried by
the conversation, not by its tool: its `carrier` is `conversation` (its tool stays, and so does its fingerprint).
Incidents group by the carrier (`incidents.entry_point`), so one such conversation is one incident, its tools its
spread, instead of one incident per tool it held.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from harness.core.findings import Finding
from harness.detect.tools import message_spans

#: The carrier of a finding in a message of another tenant's conversation.
CONVERSATION = "conversation"
_BODY = re.compile(r"request\.body@(\d+)")


def message_calls(messages: list[Any]) -> list[frozenset[str]]:
    """The ids of the tool calls each message makes (an assistant's `tool_calls`) or answers (a tool result)."""
    out = []
    for m in messages:
        ids: set[str] = set()
        if isinstance(m, dict):
            if m.get("role") == "tool" and isinstance(m.get("tool_call_id"), str):
                ids.add(m["tool_call_id"])
            ids |= {c["id"] for c in m.get("tool_calls") or [] if isinstance(c, dict) and isinstance(c.get("id"), str)}
        out.append(frozenset(ids))
    return out


@dataclass
class Chat:
    """One chat request: when it started, its flow, its tenant, its body and the calls of each of its messages."""

    start: float
    flow_id: str
    tenant: str
    data: bytes
    calls: list[frozenset[str]]


@dataclass
class Conversations:
    """Every chat request of a run, and whose conversation each tool call is: the tenant whose request held it
    first (the evidence order, whatever order the requests were read in)."""

    chats: list[Chat] = field(default_factory=list)

    def add(self, start: float, flow_id: str, tenant: str, data: bytes, doc: Any) -> None:
        messages = doc.get("messages") if isinstance(doc, dict) else None
        if isinstance(messages, list):
            self.chats.append(Chat(start, flow_id, tenant, data, message_calls(messages)))

    def owners(self) -> dict[str, str]:
        """Call id -> the tenant whose request held it first."""
        owner: dict[str, str] = {}
        for chat in sorted(self.chats, key=lambda c: (c.start, c.flow_id)):
            for ids in chat.calls:
                for call in ids:
                    owner.setdefault(call, chat.tenant)
        return owner

    def carried(self, findings: Iterable[Finding]) -> list[Finding]:
        """`findings` with the carrier of each found in a message of another tenant's conversation (in a request's
        body, or an env snapshot of a tool result: `flow:ID:tool:CALL`)."""
        owner = self.owners()
        foreign = {c.flow_id: c for c in self.chats
                   if any(owner.get(i, c.tenant) != c.tenant for ids in c.calls for i in ids)}
        if not foreign:
            return list(findings)
        spans = {flow_id: message_spans(c.data) for flow_id, c in foreign.items()}
        return [replace(f, carrier=CONVERSATION) if _in_foreign(f, foreign, spans, owner) else f for f in findings]


def _in_foreign(f: Finding, foreign: dict[str, Chat], spans: dict[str, tuple[tuple[int, int], ...]],
                owner: dict[str, str]) -> bool:
    """Whether `f` sits in a message of a foreign chat whose calls another tenant made."""
    head, _, rest = f.location.partition(":")
    flow_id, _, where = rest.partition(":")
    chat = foreign.get(flow_id) if head == "flow" else None
    if chat is None:
        return False
    if where.startswith("tool:"):
        return owner.get(where[len("tool:"):], chat.tenant) != chat.tenant
    at = _BODY.fullmatch(where)
    if at is None or len(spans[flow_id]) != len(chat.calls):
        return False
    offset = int(at[1])
    index = next((n for n, (a, b) in enumerate(spans[flow_id]) if a <= offset < b), None)
    return index is not None and any(owner.get(i, chat.tenant) != chat.tenant for i in chat.calls[index])

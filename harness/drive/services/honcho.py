"""The Honcho memory provider (`plugins/memory/honcho`, the `honcho-ai` SDK 2.x over REST `/v3`): the profile's
`memory.provider: honcho` and `honcho.json` in its home (`baseUrl` at the root, the profile's host block
`hosts.<host>` with `apiKey`, `workspace` and `peerName`), `HONCHO_API_KEY` in `.env`; the tools `honcho_*`
and every turn's prefetch (peer context, dialectic chat) and sync (session messages).

The host block is the one Hermes resolves for the profile (`client.profile_host_key`: `hermes` for the default
profile, `hermes_<name>` for a named one). The key sits in the host block because the client sends a
placeholder (`local`) instead of the configured key to a loopback base URL unless the host block holds one.

The stub is the subset of the Honcho API the SDK calls for Hermes' plugin (`plugins/memory/honcho/session.py`),
answered in the shapes the SDK validates (`honcho/api_types.py`); every path is
`/v3/workspaces/{workspace}/...` after the get-or-create `POST /v3/workspaces`:

- `peers` (get-or-create), `peers/{peer}/card` (GET, PUT), `peers/{peer}/context`, `peers/{peer}/representation`,
  `peers/{peer}/chat` (the dialectic), `peers/{peer}/search`;
- `sessions` (get-or-create), `sessions/{session}/peers` (add, list), `sessions/{session}/peers/{peer}/config`,
  `sessions/{session}/messages` (add), `sessions/{session}/messages/upload` (a memory file, at a new session's
  start), `sessions/{session}/messages/list`, `sessions/{session}/context`,
  `sessions/{session}/search`, `search`;
- `conclusions` (create), `conclusions/list`, `conclusions/query`, `conclusions/{id}` (DELETE);
  `queue/status`.

What it answers holds the tenant's record (its `honcho_record` canary): the peer card, representation and
context, the dialectic's answer, a search hit, a conclusion. What it is sent (messages, cards, conclusions) is
kept and answered back. The stub belongs to one tenant: a request that reaches it with another tenant's key,
workspace, peer or content is what the audit looks for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from harness.capture.stubs.base import JsonApiStub
from harness.capture.stubs.provider import ToolStep
from harness.core.registry import Tenant
from harness.drive.surface import (
    COMMON_WORD,
    Battery,
    Coverage,
    Plant,
    PlantContext,
    ServiceSpec,
    Setup,
    Turn,
    Where,
    edit_json,
    set_env,
)

CREATED = "2026-01-01T00:00:00Z"
PREFIX = "/v3/workspaces"


def host_key(profile: str) -> str:
    """The host block Hermes reads for a profile (`plugins/memory/honcho/client.py`, `profile_host_key`)."""
    if profile in ("default", "custom"):
        return "hermes"
    return "hermes_" + ("".join(c if c.isalnum() or c in "_-" else "_" for c in profile).strip("_") or "profile")


def _page(items: list[Any]) -> dict[str, Any]:
    return {"items": items, "page": 1, "size": max(len(items), 1), "total": len(items), "pages": 1}


@dataclass
class HonchoStub(JsonApiStub):
    service: str = "honcho"
    record_kind: ClassVar[str] = "honcho_record"
    messages: list[dict[str, Any]] = field(default_factory=list)
    cards: dict[str, list[str]] = field(default_factory=dict)
    conclusions: list[dict[str, Any]] = field(default_factory=list)

    def message(self, ws: str, session: str, peer: str, content: str, n: int) -> dict[str, Any]:
        return {"id": f"{self.tenant.name}-msg-{n}", "content": content, "peer_id": peer, "session_id": session,
                "metadata": {}, "created_at": CREATED, "workspace_id": ws, "token_count": len(content.split())}

    def record_message(self, ws: str, peer: str) -> dict[str, Any]:
        return self.message(ws, f"{self.tenant.name}-history", peer, self.record_text(), 0)

    def conclusion(self, content: str, ident: str, observer: str, observed: str) -> dict[str, Any]:
        return {"id": ident, "content": content, "observer_id": observer, "observed_id": observed,
                "session_id": None, "level": "explicit", "created_at": CREATED}

    def card(self, peer: str) -> list[str]:
        with self.lock:
            return list(self.cards.get(peer) or [self.record_text()])

    def route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if not path.startswith(PREFIX):
            return 404, {"detail": "not found"}
        parts = path[len(PREFIX):].strip("/").split("/")
        if parts == [""]:
            if method != "POST" or not isinstance(body, dict) or not body.get("id"):
                return 422, {"detail": "a workspace id is needed"}
            return 200, {"id": body["id"], "metadata": {}, "configuration": {}, "created_at": CREATED}
        ws, rest = parts[0], parts[1:]
        if rest[:1] == ["peers"]:
            return self.peers(method, ws, rest[1:], body)
        if rest[:1] == ["sessions"]:
            return self.sessions(method, ws, rest[1:], body)
        if rest[:1] == ["conclusions"]:
            return self.conclusion_route(method, ws, rest[1:], body)
        if rest == ["search"] and method == "POST":
            return 200, [self.record_message(ws, "user"), *self.stored(ws)]
        if rest == ["queue", "status"]:
            return 200, {"total_work_units": 0, "completed_work_units": 0, "in_progress_work_units": 0,
                         "pending_work_units": 0, "sessions": {}}
        return 404, {"detail": "not found"}

    def stored(self, ws: str, session: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [{**m, "workspace_id": ws} for m in self.messages if session in (None, m["session_id"])]

    def peers(self, method: str, ws: str, rest: list[str], body: Any) -> tuple[int, Any]:
        if not rest and method == "POST" and isinstance(body, dict) and body.get("id"):
            return 200, {"id": body["id"], "workspace_id": ws, "created_at": CREATED, "metadata": {},
                         "configuration": {}}
        if len(rest) != 2:
            return 404, {"detail": "not found"}
        peer, action = rest
        if action == "card" and method == "PUT" and isinstance(body, dict):
            card = [str(c) for c in body.get("peer_card") or []]
            with self.lock:
                self.cards[peer] = card
            return 200, {"peer_card": card}
        if action == "card" and method == "GET":
            return 200, {"peer_card": self.card(peer)}
        if action == "context" and method == "GET":
            return 200, {"peer_id": peer, "target_id": peer, "representation": self.record_text(),
                         "peer_card": self.card(peer)}
        if action == "representation" and method == "POST":
            return 200, {"representation": self.record_text()}
        if action == "chat" and method == "POST":
            return 200, {"content": self.record_text()}
        if action == "search" and method == "POST":
            return 200, [self.record_message(ws, peer), *self.stored(ws)]
        return 404, {"detail": "not found"}

    def sessions(self, method: str, ws: str, rest: list[str], body: Any) -> tuple[int, Any]:
        if not rest and method == "POST" and isinstance(body, dict) and body.get("id"):
            return 200, {"id": body["id"], "is_active": True, "workspace_id": ws, "metadata": {},
                         "configuration": {}, "created_at": CREATED}
        if not rest:
            return 404, {"detail": "not found"}
        session, tail = rest[0], rest[1:]
        if tail == ["peers"]:
            return 200, (_page([]) if method == "GET" else {})
        if len(tail) == 3 and tail[0] == "peers" and tail[2] == "config":
            return 200, ({"observe_me": None, "observe_others": None} if method == "GET" else {})
        if tail == ["messages"] and method == "POST" and isinstance(body, dict):
            return 200, self.add_messages(ws, session, body.get("messages") or [])
        if tail == ["messages", "upload"] and method == "POST":  # a file (multipart): its messages, one here
            return 200, self.add_messages(ws, session, [{"content": "an uploaded file", "peer_id": "user"}])
        if tail == ["messages", "list"]:
            return 200, _page(self.stored(ws, session))
        if tail == ["context"] and method == "GET":
            return 200, {"id": session, "messages": self.stored(ws, session), "summary": None,
                         "peer_representation": self.record_text(), "peer_card": self.card("user")}
        if tail == ["search"] and method == "POST":
            return 200, [self.record_message(ws, "user"), *self.stored(ws, session)]
        return 404, {"detail": "not found"}

    def add_messages(self, ws: str, session: str, messages: list[Any]) -> list[dict[str, Any]]:
        added = []
        with self.lock:
            for m in messages:
                if isinstance(m, dict) and isinstance(m.get("content"), str):
                    added.append(self.message(ws, session, str(m.get("peer_id") or ""), m["content"],
                                              len(self.messages) + 1))
                    self.messages.append(added[-1])
        return added

    def conclusion_route(self, method: str, ws: str, rest: list[str], body: Any) -> tuple[int, Any]:
        record = self.conclusion(self.record_text(), f"{self.tenant.name}-conclusion", "hermes", "user")
        if not rest and method == "POST" and isinstance(body, dict):
            made = []
            with self.lock:
                for c in body.get("conclusions") or []:
                    if isinstance(c, dict) and isinstance(c.get("content"), str):
                        made.append(self.conclusion(c["content"], f"{self.tenant.name}-c{len(self.conclusions) + 1}",
                                                    str(c.get("observer_id")), str(c.get("observed_id"))))
                        self.conclusions.append(made[-1])
            return 200, made
        with self.lock:
            every = [record, *self.conclusions]
        if rest == ["list"] and method == "POST":
            return 200, _page(every)
        if rest == ["query"] and method == "POST":
            return 200, every
        if len(rest) == 1 and method == "DELETE":
            if rest[0] == record["id"]:  # the record stays (every read answers it)
                return 200, {}
            with self.lock:
                found = any(c["id"] == rest[0] for c in self.conclusions)
                self.conclusions = [c for c in self.conclusions if c["id"] != rest[0]]
            return (200, {}) if found else (404, {"detail": "conclusion not found"})
        return 404, {"detail": "not found"}


def honcho_json(t: Tenant, url: str, host: str = "") -> dict[str, Any]:
    """A profile's `honcho.json`: the base URL at the root, its settings in its host block (the tenant's)."""
    c = t.canaries
    return {"baseUrl": url, "hosts": {host or host_key(t.name): {
        "enabled": True, "apiKey": c["honcho_key"], "workspace": c["honcho_workspace"],
        "peerName": c["honcho_peer"]}}}


def configure(t: Tenant, where: Where) -> Setup:
    return Setup(config={"memory": {"provider": "honcho"}, "security": {"allow_lazy_installs": False}},
                 env={"HONCHO_API_KEY": t.canaries["honcho_key"]},
                 files={"honcho.json": json.dumps(honcho_json(t, where.url), indent=2).encode()})


def _writes(u: Turn) -> list[ToolStep]:
    """A conclusion and a peer card of the tenant's, then its record conclusion (the stub's id
    `<tenant>-conclusion`: its own, so the call succeeds) deleted."""
    note = f"{u.tenant.canaries['honcho_note']} ({u.scenario})"
    return [ToolStep("honcho_conclude", {"conclusion": note}), ToolStep("honcho_profile", {"card": [note]}),
            ToolStep("honcho_conclude", {"delete_id": f"{u.tenant.name}-conclusion"})]


def _reads(u: Turn) -> list[ToolStep]:
    return [ToolStep("honcho_profile", {}), ToolStep("honcho_context", {}),
            ToolStep("honcho_search", {"query": COMMON_WORD}),
            ToolStep("honcho_reasoning", {"query": f"What does the {COMMON_WORD} hold?"})]


def _lookups(u: Turn) -> list[ToolStep]:
    """A search and a list, and another tenant's record conclusion by id (at an isolated service: not found)."""
    return [ToolStep("honcho_search", {"query": COMMON_WORD}), ToolStep("honcho_conclude", {"list": True}),
            ToolStep("honcho_conclude", {"delete_id": f"{u.other}-conclusion"})]


def _edit_host(c: PlantContext, field_name: str, kind: str) -> None:
    """The donor's canary `kind` under `field_name` of the target's host block in its `honcho.json`."""
    edit_json(c.target_home, "honcho.json",
              lambda doc: doc["hosts"][host_key(c.target.name)].update({field_name: c.donor.canaries[kind]}))


def _key(c: PlantContext) -> None:
    """The donor's key where the target's is: its `.env` and its host block."""
    set_env(c.target_home, "HONCHO_API_KEY", c.donor.canaries["honcho_key"])
    _edit_host(c, "apiKey", "honcho_key")


SERVICE = ServiceSpec(
    "honcho", "the Honcho memory provider", rank=34, make=lambda t, m: HonchoStub(t, m),
    credential="honcho_key", credential_env="HONCHO_API_KEY", identity=("honcho_workspace", "honcho_peer"),
    data=("honcho_record", "honcho_note"), passive=True, configure=configure, slot="memory.provider",
    packages=("honcho-ai",),
    by_default=False,
    coverage=Coverage('has("honcho") and source_has("plugins.memory.honcho.client", "profile_host_key")',
                      "no Honcho memory provider with per-profile host blocks (plugins/memory/honcho), or no "
                      "honcho-ai SDK"),
    battery=Battery("honcho", tools=("honcho_profile", "honcho_search", "honcho_reasoning", "honcho_context",
                                     "honcho_conclude"), writes=_writes, reads=_reads, lookups=_lookups),
    plants={"honcho-key": Plant(_key, frozenset({"wrong_key"})),
            "honcho-workspace": Plant(lambda c: _edit_host(c, "workspace", "honcho_workspace"),
                                      frozenset({"wrong_identity"})),
            "honcho-peer": Plant(lambda c: _edit_host(c, "peerName", "honcho_peer"), frozenset({"wrong_identity"}))},
)

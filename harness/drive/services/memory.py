"""The mem0 memory provider in self-hosted mode (`plugins/memory/mem0`, plain httpx with `X-API-Key`): the
profile's `memory.provider: mem0` and `mem0.json` (host, user and agent ids), `MEM0_API_KEY`; the tools
`mem0_*` and every turn's prefetch and sync.

The stub is the subset of the mem0 REST API that Hermes' plugin calls (`plugins/memory/mem0/_backend.py`):

- `POST /search` `{"query", "top_k", "filters": {"user_id"}}`: before every turn (prefetch) and for the
  `mem0_search` tool; answered with the tenant's record (its `memory_record` canary) and every memory added;
- `POST /memories` `{"messages", "user_id", "agent_id", "infer", ...}`: after every turn (sync) and for
  `mem0_add`; the messages are kept as memories;
- `PUT /memories/{id}` and `DELETE /memories/{id}`: `mem0_update`, `mem0_delete`.

The stub belongs to one tenant: what it stores and answers is that tenant's memory, and a request that
reaches it with another tenant's key, user id or content is what the audit looks for.
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
    Unset,
    Where,
    credential_plant,
    edit_json,
)


@dataclass
class Mem0Stub(JsonApiStub):
    service: str = "memory"
    record_kind: ClassVar[str] = "memory_record"
    memories: list[dict[str, Any]] = field(default_factory=list)

    def route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict):
            return 400, {"detail": "body is not a JSON object"}
        if method == "POST" and path == "/search":
            with self.lock:
                stored = list(self.memories)
            results = [{"id": f"{self.tenant.name}-record", "memory": self.record_text(), "score": 0.99}]
            return 200, {"results": results + [{**m, "score": 0.9} for m in stored]}
        if method == "POST" and path == "/memories":
            texts = [m.get("content") for m in body.get("messages") or [] if isinstance(m, dict)]
            added = []
            with self.lock:
                for text in texts:
                    if isinstance(text, str) and text:
                        memory = {"id": f"{self.tenant.name}-{len(self.memories) + 1}", "memory": text}
                        self.memories.append(memory)
                        added.append({**memory, "event": "ADD"})
            return 200, {"results": added}
        if method in ("PUT", "DELETE") and path.startswith("/memories/"):
            memory_id = path.rsplit("/", 1)[1]
            if memory_id == f"{self.tenant.name}-record":  # the record stays (every search answers it)
                return 200, {"message": "ok"}
            with self.lock:
                found = [m for m in self.memories if m["id"] == memory_id]
                if method == "DELETE":
                    self.memories = [m for m in self.memories if m["id"] != memory_id]
                elif found and isinstance(body.get("text"), str):
                    found[0]["memory"] = body["text"]
            return (200, {"message": "ok"}) if found else (404, {"detail": "memory not found"})
        return 404, {"detail": "not found"}


def configure(t: Tenant, where: Where) -> Setup:
    mem0 = {"host": where.url, "user_id": t.canaries["memory_user"], "agent_id": t.canaries["memory_agent"],
            "rerank": False}
    return Setup(config={"memory": {"provider": "mem0"}, "security": {"allow_lazy_installs": False}},
                 env={"MEM0_API_KEY": t.canaries["memory_key"]},
                 files={"mem0.json": json.dumps(mem0, indent=2).encode()})


def _writes(u: Turn) -> list[ToolStep]:
    """A memory of the tenant's, then its record (the stub's id `<tenant>-record`: its own, so the calls
    succeed) updated and deleted."""
    note, record = f"{u.tenant.canaries['memory_note']} ({u.scenario})", f"{u.tenant.name}-record"
    return [ToolStep("mem0_add", {"content": note}), ToolStep("mem0_update", {"memory_id": record, "text": note}),
            ToolStep("mem0_delete", {"memory_id": record})]


def _lookups(u: Turn) -> list[ToolStep]:
    """A search, and another tenant's record by id (at an isolated service: not found)."""
    return [ToolStep("mem0_search", {"query": COMMON_WORD}),
            ToolStep("mem0_delete", {"memory_id": f"{u.other}-record"})]


def _user(c: PlantContext) -> None:
    """The donor's user id at the memory provider in the target's `mem0.json`."""
    edit_json(c.target_home, "mem0.json", lambda doc: doc.update(user_id=c.donor.canaries["memory_user"]))


SERVICE = ServiceSpec(
    "memory", "the mem0 memory provider (self-hosted)", rank=30, make=lambda t, m: Mem0Stub(t, m),
    credential="memory_key", credential_env="MEM0_API_KEY", identity=("memory_user", "memory_agent"),
    data=("memory_record", "memory_note"), passive=True, configure=configure, slot="memory.provider",
    coverage=Coverage('source_has("plugins.memory.mem0._backend", "class SelfHostedBackend")',
                      "no mem0 memory provider in self-hosted mode (plugins/memory/mem0)",
                      forward="Hermes' mem0 client gives httpx a transport of its own, which ignores HTTPS_PROXY"),
    battery=Battery("mem0", tools=("mem0_add", "mem0_search", "mem0_update", "mem0_delete"), writes=_writes,
                    reads=lambda u: [ToolStep("mem0_search", {"query": COMMON_WORD})], lookups=_lookups),
    plants={"memory-key": credential_plant("memory_key", "MEM0_API_KEY"),
            "memory-user": Plant(_user, frozenset({"wrong_identity"}))},
    unsettable=(Unset("key", env=("MEM0_API_KEY",)), Unset("config", files=("mem0.json",)))
)

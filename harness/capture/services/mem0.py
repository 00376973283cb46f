"""A tenant's mem0 memory provider in self-hosted mode: the subset of the mem0 REST API that Hermes' `mem0`
plugin calls (`plugins/memory/mem0/_backend.py`, plain httpx with `X-API-Key`).

- `POST /search` `{"query", "top_k", "filters": {"user_id"}}`: before every turn (prefetch) and for the
  `mem0_search` tool; answered with the tenant's record (its `memory_record` canary) and every memory added;
- `POST /memories` `{"messages", "user_id", "agent_id", "infer", ...}`: after every turn (sync) and for
  `mem0_add`; the messages are kept as memories;
- `PUT /memories/{id}` and `DELETE /memories/{id}`: `mem0_update`, `mem0_delete`.

The stub belongs to one tenant: what it stores and answers is that tenant's memory, and a request that
reaches it with another tenant's key, user id or content is what the audit looks for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from harness.capture.services.base import JsonApiStub


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

"""The Supermemory memory provider (`plugins/memory/supermemory`: the `supermemory` SDK, plus urllib for
conversations; `Authorization: Bearer`): the profile's `memory.provider: supermemory` and `supermemory.json`
(`base_url`, `container_tag`), `SUPERMEMORY_API_KEY`; the tools `supermemory_*` and every turn's prefetch.

The stub is the subset of the Supermemory API that Hermes' client (`_SupermemoryClient`) calls:

- `POST /v4/profile` `{"containerTag", "q"?}`: before every turn (prefetch) and for `supermemory_profile`;
  answered with the tenant's record (its `supermemory_record` canary) as a static fact, the memories added
  as dynamic ones, and with a query the same as search results;
- `POST /v4/search` `{"q", "containerTag", "limit", "searchMode"}`: `supermemory_search` (and a forget by
  query); the record and every memory added;
- `POST /v3/documents` `{"content", "containerTags", "metadata", "entityContext"}`: `supermemory_store` and
  the built-in memory tool's writes; kept as a memory;
- `DELETE /v4/memories` `{"containerTag", "id"}`: `supermemory_forget`;
- `POST /v4/conversations` `{"conversationId", "messages", "containerTags"}` (urllib): a session's turns at
  its end or switch; kept as one memory.

The container tag is the tenant's identity there (`supermemory_tag`, minted as word characters: Hermes
sanitises a tag to letters, digits and `_`).
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
    credential_plant,
    edit_json,
)

UPDATED = "2026-01-01T00:00:00Z"


@dataclass
class SupermemoryStub(JsonApiStub):
    service: str = "supermemory"
    record_kind: ClassVar[str] = "supermemory_record"
    memories: list[dict[str, Any]] = field(default_factory=list)

    def _record_id(self) -> str:
        return f"{self.tenant.name}-record"

    def _results(self) -> list[dict[str, Any]]:
        with self.lock:
            stored = list(self.memories)
        found = [{"id": self._record_id(), "memory": self.record_text()}, *stored]
        return [{**m, "similarity": 0.9, "updatedAt": UPDATED} for m in found]

    def _keep(self, text: str) -> str:
        with self.lock:
            memory_id = f"{self.tenant.name}-{len(self.memories) + 1}"
            self.memories.append({"id": memory_id, "memory": text})
        return memory_id

    def route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict):
            return 400, {"error": "body is not a JSON object"}
        if method == "POST" and path == "/v4/profile":
            answer: dict[str, Any] = {"profile": {"static": [self.record_text()],
                                                  "dynamic": [m["memory"] for m in self._results()[1:]]}}
            if body.get("q"):
                results = self._results()
                answer["searchResults"] = {"results": results, "timing": 1.0, "total": len(results)}
            return 200, answer
        if method == "POST" and path == "/v4/search":
            results = self._results()
            return 200, {"results": results, "timing": 1.0, "total": len(results)}
        if method == "POST" and path == "/v3/documents":
            content = body.get("content")
            if not isinstance(content, str) or not content:
                return 400, {"error": "content is required"}
            return 200, {"id": self._keep(content), "status": "queued"}
        if method == "POST" and path == "/v4/conversations":
            messages = [m.get("content") for m in body.get("messages") or [] if isinstance(m, dict)]
            text = "\n".join(m for m in messages if isinstance(m, str))
            return (200, {"id": self._keep(text), "status": "queued"}) if text else (400, {"error": "no messages"})
        if method == "DELETE" and path == "/v4/memories":
            memory_id = body.get("id")
            if memory_id == self._record_id():  # the record stays (every answer holds it)
                return 200, {"id": memory_id, "forgotten": True}
            with self.lock:
                found = any(m["id"] == memory_id for m in self.memories)
                self.memories = [m for m in self.memories if m["id"] != memory_id]
            return (200, {"id": memory_id, "forgotten": True}) if found else (404, {"error": "memory not found"})
        return 404, {"error": "not found"}


def configure(t: Tenant, where: Where) -> Setup:
    doc = {"base_url": where.url, "container_tag": t.canaries["supermemory_tag"], "api_timeout": 15}
    return Setup(config={"memory": {"provider": "supermemory"}, "security": {"allow_lazy_installs": False}},
                 env={"SUPERMEMORY_API_KEY": t.canaries["supermemory_key"]},
                 files={"supermemory.json": json.dumps(doc, indent=2).encode()})


def _writes(u: Turn) -> list[ToolStep]:
    """A memory of the tenant's, stored by each name of the tool (Hermes offers every tool under a kebab-case
    alias too), then its record (the stub's id `<tenant>-record`: its own) forgotten by id and by a query (the
    best match: the record)."""
    note = f"{u.tenant.canaries['supermemory_note']} ({u.scenario})"
    return [ToolStep("supermemory_store", {"content": note}),
            ToolStep("supermemory-save", {"content": f"{note} (by alias)"}),
            ToolStep("supermemory_forget", {"id": f"{u.tenant.name}-record"}),
            ToolStep("supermemory-forget", {"query": COMMON_WORD})]


def _reads(u: Turn) -> list[ToolStep]:
    return [ToolStep("supermemory_search", {"query": COMMON_WORD}),
            ToolStep("supermemory-profile", {"query": COMMON_WORD})]


def _lookups(u: Turn) -> list[ToolStep]:
    """Searches and the profile, and another tenant's record by id (at an isolated service: not found)."""
    return [ToolStep("supermemory-search", {"query": COMMON_WORD}),
            ToolStep("supermemory_profile", {"query": COMMON_WORD}),
            ToolStep("supermemory_forget", {"id": f"{u.other}-record"})]


def _tag(c: PlantContext) -> None:
    """The donor's container tag in the target's `supermemory.json`."""
    edit_json(c.target_home, "supermemory.json",
              lambda doc: doc.update(container_tag=c.donor.canaries["supermemory_tag"]))


SERVICE = ServiceSpec(
    "supermemory", "the Supermemory memory provider", rank=32, make=lambda t, m: SupermemoryStub(t, m),
    credential="supermemory_key", credential_env="SUPERMEMORY_API_KEY", identity=("supermemory_tag",),
    data=("supermemory_record", "supermemory_note"), passive=True, configure=configure, slot="memory.provider",
    packages=("supermemory",),
    by_default=False, words=frozenset({"supermemory_tag"}),
    coverage=Coverage('has("supermemory") and source_has("plugins.memory.supermemory", "SUPERMEMORY_BASE_URL")',
                      "no Supermemory memory provider with a configurable base URL, or no supermemory SDK"),
    battery=Battery("supermemory", tools=("supermemory_store", "supermemory_search", "supermemory_profile",
                                          "supermemory_forget", "supermemory-save", "supermemory-search",
                                          "supermemory-profile", "supermemory-forget"),
                    writes=_writes, reads=_reads, lookups=_lookups),
    plants={"supermemory-key": credential_plant("supermemory_key", "SUPERMEMORY_API_KEY"),
            "supermemory-tag": Plant(_tag, frozenset({"wrong_identity"}))},
)

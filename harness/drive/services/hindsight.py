"""The Hindsight memory provider in cloud mode (`plugins/memory/hindsight`, the `hindsight-client` SDK on aiohttp,
`Authorization: Bearer`): the profile's `memory.provider: hindsight`, `hindsight/config.json` in its home (mode,
API URL, bank id: what `hermes memory setup` writes) and `HINDSIGHT_API_KEY` in `.env`; the tools
`hindsight_*` and every turn's prefetch (a recall) and sync (a retain).

The stub is the subset of the Hindsight API that Hermes' plugin calls, answered in the shapes the SDK's models
validate:

- `GET /version` (the plugin's capability probe, once per API URL and process, over urllib):
  `{"api_version", "features"}`; 0.5.0 or later makes the plugin retain with `update_mode: append`;
- `POST /v1/default/banks/{bank}/memories` `{"items": [{"content", ...}], "async"}` (sync and
  `hindsight_retain`): the items are kept in that bank; `RetainResponse`;
- `POST /v1/default/banks/{bank}/memories/recall` `{"query", "types", ...}` (prefetch and `hindsight_recall`):
  `RecallResponse` with the bank's memories, the tenant's record (its `hindsight_record` canary) first in its
  own bank;
- `POST /v1/default/banks/{bank}/reflect` `{"query", ...}` (`hindsight_reflect`): `ReflectResponse` whose text
  is what the bank holds.

The stub belongs to one tenant: its bank (the `hindsight_bank` canary) holds that tenant's memory, and a
request that reaches it with another tenant's key, bank or content is what the audit looks for.
"""

from __future__ import annotations

import json
import re
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

#: `/v1/default/banks/{bank}/{operation}`: the bank and what is asked of it.
BANK_PATH = re.compile(r"/v1/default/banks/(?P<bank>[^/]+)/(?P<op>memories|memories/recall|reflect)")
API_VERSION = "0.6.1"


@dataclass
class HindsightStub(JsonApiStub):
    service: str = "hindsight"
    record_kind: ClassVar[str] = "hindsight_record"
    banks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # bank id -> its memories

    def route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if method == "GET" and path == "/version":
            return 200, {"api_version": API_VERSION, "features": {
                "observations": True, "mcp": False, "worker": True, "bank_config_api": True, "file_upload_api": False}}
        match = BANK_PATH.fullmatch(path)
        if method != "POST" or match is None:
            return 404, {"detail": "Not Found"}
        if not isinstance(body, dict):
            return 422, {"detail": "body is not a JSON object"}
        bank, op = match["bank"], match["op"]
        if op == "memories":
            return 200, self._retain(bank, body)
        results = self._held(bank)
        if op == "reflect":
            return 200, {"text": "\n".join(r["text"] for r in results) or "No memories in this bank."}
        return 200, {"results": results}

    def _retain(self, bank: str, body: dict[str, Any]) -> dict[str, Any]:
        items = [i for i in body.get("items") or [] if isinstance(i, dict) and isinstance(i.get("content"), str)]
        with self.lock:
            held = self.banks.setdefault(bank, [])
            for item in items:
                held.append({"id": f"{self.tenant.name}-{len(held) + 1}", "text": item["content"],
                             "type": "observation"})
        return {"success": True, "bank_id": bank, "items_count": len(items), "async": bool(body.get("async"))}

    def _held(self, bank: str) -> list[dict[str, Any]]:
        """What a bank holds: the tenant's record in its own bank, then every memory retained there."""
        record = {"id": f"{self.tenant.name}-record", "text": self.record_text(), "type": "observation"}
        own = [record] if bank == self.tenant.canaries.get("hindsight_bank") else []
        with self.lock:
            return own + list(self.banks.get(bank, []))


def configure(t: Tenant, where: Where) -> Setup:
    hindsight = {"mode": "cloud", "api_url": where.url, "bank_id": t.canaries["hindsight_bank"]}
    return Setup(config={"memory": {"provider": "hindsight"}, "security": {"allow_lazy_installs": False}},
                 env={"HINDSIGHT_API_KEY": t.canaries["hindsight_key"]},
                 files={"hindsight/config.json": json.dumps(hindsight, indent=2).encode()})


def _writes(u: Turn) -> list[ToolStep]:
    return [ToolStep("hindsight_retain", {"content": f"{u.tenant.canaries['hindsight_note']} ({u.scenario})",
                                          "context": "tenancy note"})]


def _reads(u: Turn) -> list[ToolStep]:
    return [ToolStep("hindsight_recall", {"query": COMMON_WORD}), ToolStep("hindsight_reflect", {"query": COMMON_WORD})]


def _lookups(u: Turn) -> list[ToolStep]:
    """The tools take no bank: a lookup can only ask, in words, for what another tenant keeps."""
    return [ToolStep("hindsight_recall", {"query": f"what {u.other} keeps about the {COMMON_WORD}"})]


def _bank(c: PlantContext) -> None:
    """The donor's bank id in the target's `hindsight/config.json`."""
    edit_json(c.target_home, "hindsight/config.json",
              lambda doc: doc.update(bank_id=c.donor.canaries["hindsight_bank"]))


SERVICE = ServiceSpec(
    "hindsight", "the Hindsight memory provider (cloud mode)", rank=33, make=lambda t, m: HindsightStub(t, m),
    credential="hindsight_key", credential_env="HINDSIGHT_API_KEY", identity=("hindsight_bank",),
    data=("hindsight_record", "hindsight_note"), passive=True, configure=configure, slot="memory.provider",
    packages=("hindsight-client", "aiohttp-retry"),
    by_default=False,
    coverage=Coverage('has("hindsight_client") and source_has("plugins.memory.hindsight", "api_url")',
                      "no Hindsight memory provider with a configurable API URL, or no hindsight-client"),
    battery=Battery("hindsight", tools=("hindsight_retain", "hindsight_recall", "hindsight_reflect"),
                    writes=_writes, reads=_reads, lookups=_lookups),
    plants={"hindsight-key": credential_plant("hindsight_key", "HINDSIGHT_API_KEY"),
            "hindsight-bank": Plant(_bank, frozenset({"wrong_identity"}))},
)

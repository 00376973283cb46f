"""A tenant's web search API: the subset of the Tavily API that Hermes' `tavily` web backend calls
(`plugins/web/tavily/provider.py`: `httpx.post(f"{TAVILY_BASE_URL}/{endpoint}", json=...)`, the key in the
body's `api_key`).

- `POST /search` `{"query", "max_results", ...}` (`web_search`): one result whose content is the tenant's
  record (its `web_record` canary) and the query it was asked;
- `POST /extract` `{"urls": [...]}` (`web_extract`): every URL "extracted" as the tenant's record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from harness.capture.services.base import JsonApiStub


@dataclass
class TavilyStub(JsonApiStub):
    service: str = "web"
    record_kind: ClassVar[str] = "web_record"

    def route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if method != "POST" or path not in ("/search", "/extract"):
            return 404, {"detail": "not found"}
        if not isinstance(body, dict):
            return 400, {"detail": "body is not a JSON object"}
        if path == "/search":
            query = str(body.get("query") or "")
            return 200, {"query": query, "results": [{
                "title": f"Tenancy result for {self.tenant.name}", "url": f"http://127.0.0.1/{self.tenant.name}",
                "content": f"{self.record_text()} (asked: {query})", "score": 0.9}]}
        urls = [u for u in body.get("urls") or [] if isinstance(u, str)]
        return 200, {"results": [{"url": u, "title": f"Tenancy page of {self.tenant.name}",
                                  "raw_content": f"{self.record_text()} (page {u})"} for u in urls],
                     "failed_results": []}

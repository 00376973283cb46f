"""The Tavily web search API (`plugins/web/tavily/provider.py`: `httpx.post(f"{TAVILY_BASE_URL}/{endpoint}",
json=...)`, the key in the body's `api_key`): the profile's `web.backend: tavily`, `TAVILY_BASE_URL` and
`TAVILY_API_KEY` in `.env`; tools `web_search`, `web_extract`.

The stub answers
- `POST /search` `{"query", "max_results", ...}` (`web_search`): one result whose content is the tenant's
  record (its `web_record` canary) and the query it was asked;
- `POST /extract` `{"urls": [...]}` (`web_extract`): every URL "extracted" as the tenant's record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from harness.capture.stubs.base import JsonApiStub
from harness.capture.stubs.provider import ToolStep
from harness.core.registry import Tenant
from harness.drive.surface import Battery, Coverage, ServiceSpec, Setup, Turn, Unset, Where, credential_plant


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


def configure(t: Tenant, where: Where) -> Setup:
    return Setup(config={"web": {"backend": "tavily"},
                         "security": {"allow_private_urls": True, "allow_lazy_installs": False}},
                 env={"TAVILY_API_KEY": t.canaries["web_key"], "TAVILY_BASE_URL": where.url})


def extract_url(tenant: str, scenario: str) -> str:
    """The page `web_extract` is asked for: on loopback (never fetched by Hermes: the web backend extracts it)."""
    return f"http://127.0.0.1:9/tenancy/{tenant}/{scenario}"


def _reads(u: Turn) -> list[ToolStep]:
    return [ToolStep("web_search", {"query": f"{u.tenant.canaries['web_query']} ({u.scenario})"}),
            ToolStep("web_extract", {"urls": [extract_url(u.tenant.name, u.scenario)]})]


SERVICE = ServiceSpec(
    "web", "the Tavily web search API", rank=40, make=lambda t, m: TavilyStub(t, m), credential="web_key",
    credential_env="TAVILY_API_KEY", data=("web_record", "web_query"), configure=configure,
    coverage=Coverage('source_has("plugins.web.tavily.provider", "TAVILY_BASE_URL") '
                      'or source_has("tools.web_tools", "TAVILY_BASE_URL")',
                      "no Tavily web backend with a configurable TAVILY_BASE_URL"),
    battery=Battery("web", tools=("web_search", "web_extract"), parallel_safe=frozenset({"web_search", "web_extract"}),
                    reads=_reads,
                    lookups=lambda u: [ToolStep("web_search", {"query": f"tenancy lookup by {u.tenant.name}"})]),
    plants={"web-key": credential_plant("web_key", "TAVILY_API_KEY")},
    unsettable=(Unset("key", env=("TAVILY_API_KEY",)), Unset("url", env=("TAVILY_BASE_URL",)))
)

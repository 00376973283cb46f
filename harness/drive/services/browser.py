"""The browser tools on a Camofox server (`tools/browser_camofox.py`: `requests` to `CAMOFOX_URL`, the key as
`Authorization: Bearer $CAMOFOX_API_KEY`), the one browser backend that needs no browser, no CLI and no cloud
account on the auditing machine: `CAMOFOX_URL` and `CAMOFOX_API_KEY` in `.env`, the browser identity in the
profile's `browser.camofox.user_id`; tools `browser_navigate`, `browser_type`, `browser_snapshot`.

The stub is the subset of the Camofox REST API that Hermes' backend calls:

- `GET /health` (the first navigation of a process: is the server up, has it a VNC port);
- `POST /tabs` `{"userId", "listItemId", "url"}` (a task's first navigation): a tab of the tenant's;
- `POST /tabs/{id}/navigate` `{"userId", "url"}`; `GET /tabs/{id}/snapshot?userId=` (after every navigation
  and for `browser_snapshot`): the page, whose text is the tenant's record (its `browser_record` canary), the
  user id the tab was opened for and what was typed into it;
- `POST /tabs/{id}/{click,type,scroll,back,press}` `{"userId", ...}`; `DELETE /sessions/{userId}` (a task's
  browser closed).

The stub never fetches a page: whatever URL a tab opens, it shows the tenant's page. A tab id it did not hand
out is 404 (Hermes then opens a fresh tab).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, ClassVar

from harness.capture.stubs.base import JsonApiStub
from harness.capture.stubs.provider import ToolStep
from harness.core.registry import Tenant
from harness.drive.surface import (
    Battery,
    Coverage,
    Plant,
    PlantContext,
    ServiceSpec,
    Setup,
    Turn,
    Where,
    credential_plant,
    edit_config,
)

#: The page's text box: the ref `browser_type` is given (the snapshot names it).
NOTE_REF = "e2"
_ACTIONS = frozenset({"click", "type", "scroll", "back", "press"})


@dataclass
class CamofoxStub(JsonApiStub):
    service: str = "browser"
    record_kind: ClassVar[str] = "browser_record"
    tabs: dict[str, dict[str, Any]] = field(default_factory=dict)
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    def page(self, tab: dict[str, Any]) -> str:
        """The tab's accessibility snapshot: the tenant's page, the user the tab was opened for (so a tab that
        another profile's session reaches names its opener) and what was typed into its note."""
        typed = " | ".join(tab["typed"])
        return (f'- heading "Tenancy page of {self.tenant.name}" [e1]\n- paragraph: {self.record_text()}\n'
                f'- paragraph: opened for {tab["user"]}\n- textbox "Note" [{NOTE_REF}]: {typed}\n'
                f'- link "More" [e3]\n  - /url: {tab["url"]}')

    def route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        parts = path.strip("/").split("/")
        if method == "GET" and parts == ["health"]:
            return 200, {"ok": True, "engine": "camoufox"}
        if method == "DELETE" and len(parts) == 2 and parts[0] == "sessions":
            return 200, {"ok": True}
        if parts[0] != "tabs":
            return 404, {"error": "not found"}
        if method == "GET" and len(parts) == 1:
            with self.lock:
                return 200, {"tabs": [{"tabId": i, "listItemId": t["key"], "url": t["url"]}
                                      for i, t in self.tabs.items()]}
        if not isinstance(body, dict):
            return 400, {"error": "body is not a JSON object"}
        if method == "POST" and len(parts) == 1:
            tab_id, url = f"{self.tenant.name}-tab-{next(self._ids)}", str(body.get("url") or "about:blank")
            with self.lock:
                self.tabs[tab_id] = {"url": url, "key": str(body.get("listItemId") or ""),
                                     "user": str(body.get("userId") or ""), "typed": []}
            return 200, {"tabId": tab_id, "url": url}
        with self.lock:
            tab = self.tabs.get(parts[1]) if len(parts) == 3 else None
        if tab is None:
            return 404, {"error": "tab not found"}
        return self._act(method, parts[2], tab, body)

    def _act(self, method: str, action: str, tab: dict[str, Any], body: dict[str, Any]) -> tuple[int, Any]:
        if method == "GET" and action == "snapshot":
            return 200, {"snapshot": self.page(tab), "refsCount": 3}
        if method == "POST" and action == "navigate":
            tab["url"] = str(body.get("url") or tab["url"])
            return 200, {"ok": True, "url": tab["url"], "title": f"Tenancy page of {self.tenant.name}"}
        if method == "POST" and action in _ACTIONS:
            if action == "type" and isinstance(body.get("text"), str):
                with self.lock:
                    tab["typed"].append(body["text"])
            return 200, {"ok": True, "url": tab["url"]}
        return 404, {"error": "not found"}


def configure(t: Tenant, where: Where) -> Setup:
    return Setup(config={"browser": {"camofox": {"user_id": t.canaries["browser_user"]}}},
                 env={"CAMOFOX_URL": where.url, "CAMOFOX_API_KEY": t.canaries["browser_key"]})


def page_url(tenant: str, scenario: str) -> str:
    """The page the battery opens: on loopback (never fetched: the Camofox stub shows the tenant's page)."""
    return f"http://127.0.0.1:9/tenancy/{tenant}/{scenario}"


def _writes(u: Turn) -> list[ToolStep]:
    return [ToolStep("browser_navigate", {"url": page_url(u.tenant.name, u.scenario)}),
            ToolStep("browser_type", {"ref": f"@{NOTE_REF}",
                                      "text": f"{u.tenant.canaries['browser_note']} ({u.scenario})"})]


def _user(c: PlantContext) -> None:
    """The donor's browser identity in the target's `browser.camofox.user_id`."""
    edit_config(c.target_home, lambda cfg: cfg.setdefault("browser", {}).setdefault("camofox", {}).update(
        user_id=c.donor.canaries["browser_user"]))


SERVICE = ServiceSpec(
    "browser", "the browser tools on a Camofox server", rank=45, make=lambda t, m: CamofoxStub(t, m),
    credential="browser_key", credential_env="CAMOFOX_API_KEY", identity=("browser_user",),
    data=("browser_record", "browser_note"), configure=configure, by_default=False,
    coverage=Coverage('source_has("tools.browser_camofox", "CAMOFOX_API_KEY") '
                      'and source_has("tools.browser_camofox", "user_id")',
                      "no Camofox browser backend with an API key and a configurable user id"),
    battery=Battery("browser", tools=("browser_navigate", "browser_type", "browser_snapshot"), writes=_writes,
                    reads=lambda u: [ToolStep("browser_snapshot", {})],
                    lookups=lambda u: [ToolStep("browser_snapshot", {})]),
    plants={"browser-key": credential_plant("browser_key", "CAMOFOX_API_KEY"),
            "browser-user": Plant(_user, frozenset({"wrong_identity"}))},
)

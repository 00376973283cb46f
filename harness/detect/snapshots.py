"""Environment snapshots: what the tool subprocess saw, recovered from the tool results sent upstream.

The stubs' probe prints the environment plainly (Hermes masks secret-looking values there), base64
encoded (which Hermes leaves intact), and the cwd. Each tool result reaches the tenant's provider in
the next request, so the saved flows hold every snapshot; they are deduplicated by tool_call_id
because Hermes re-sends the whole conversation on every call.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any

from harness.core.findings import Finding
from harness.core.protocol import PROBE_BEGIN, PROBE_END
from harness.core.registry import Registry, Tenant, is_path_kind
from harness.detect.engine.matcher import Matcher
from harness.detect.engine.stream import scan_bytes
from harness.detect.tools import call_names

#: The tools whose results hold the probe's output: the shell command and its Python twin (`probe_code`).
PROBE_TOOLS = ("terminal", "execute_code")
#: The probe's output between its markers, each a line of its own (a tool that quotes the probe's code or command,
#: asking for approval, has the markers inside a line, never alone on one).
_SECTION = re.compile(f"^{PROBE_BEGIN}$(.*?)^{PROBE_END}$", re.M | re.S)
_B64_LINE = re.compile(r"^ENVB64=([A-Za-z0-9+/=]*)\s*$", re.M)
_CWD_LINE = re.compile(r"^CWD=(.*)$", re.M)


@dataclass(frozen=True)
class EnvSnapshot:
    """One run of the probe inside a tenant's tool subprocess."""

    tenant: str
    flow_id: str
    tool_call_id: str
    origin: str  # "turn" or "cron"
    cwd: str | None
    plain: str
    decoded: bytes
    tool: str = "terminal"

    @property
    def location(self) -> str:
        return f"flow:{self.flow_id}:tool:{self.tool_call_id}"


def _tool_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    if not isinstance(content, str):
        return ""
    try:
        parsed = json.loads(content)
    except ValueError:
        return content
    if isinstance(parsed, dict) and isinstance(parsed.get("output"), str):
        return parsed["output"]
    return content


def extract(tenant: Tenant, flow_id: str, body: dict[str, Any]) -> list[EnvSnapshot]:
    """Every probe output in a chat request body of `tenant`'s route."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    cron_mark = tenant.canaries.get("cron_prompt", "\0")
    origin = "cron" if any(cron_mark in json.dumps(m.get("content")) for m in messages if m.get("role") == "user") \
        else "turn"
    found = []
    names = call_names(messages)
    for m in messages:
        tool = names.get(str(m.get("tool_call_id")), "terminal")
        if m.get("role") != "tool" or tool not in PROBE_TOOLS:
            continue  # another tool's result may quote a probe's output (a session transcript): not a snapshot
        text = _tool_text(m)
        output = _SECTION.search(text)
        if output is None:
            continue
        section = output.group(1)
        cwd = _CWD_LINE.search(section)
        b64 = _B64_LINE.search(section)
        try:
            decoded = base64.b64decode(b64.group(1)) if b64 else b""
        except (binascii.Error, ValueError):
            decoded = b""
        call_id = str(m.get("tool_call_id") or hash(text))
        found.append(EnvSnapshot(tenant.name, flow_id, call_id, origin, cwd.group(1).strip() if cwd else None,
                                 section, decoded, tool))
    return found


def check(snapshot: EnvSnapshot, registry: Registry, matcher: Matcher, **where: Any) -> list[Finding]:
    """The tool ran in the tenant's own cwd and saw no other tenant's canary (plain or in the b64 dump); another
    tenant's path (its home, its workdir) in the environment is `wrong_path`."""
    tenant = registry[snapshot.tenant]
    findings = []
    own_dirs = [v for k, v in tenant.canaries.items() if k.startswith("workdir")]
    if snapshot.cwd not in own_dirs:
        findings.append(Finding(
            "wrong_cwd", tenant.name, tenant.name, "workdir", "env", snapshot.location, "plain",
            matcher.redact_text(f"CWD={snapshot.cwd}"), detail=f"{snapshot.origin}: not its own workdir",
            tool=snapshot.tool, **where,
        ))
    seen: set[tuple[str, str]] = set()
    for data, encoding in ((snapshot.decoded, "base64"), (snapshot.plain.encode(), None)):
        for hit in scan_bytes(data, matcher, exclude=tenant.name):  # a variable may hold layers (gzip in base64)
            if (hit.tenant, hit.kind) in seen:
                continue
            seen.add((hit.tenant, hit.kind))
            label = hit.encoding if encoding is None else encoding if hit.encoding == "plain" else \
                f"{encoding}/{hit.encoding}"
            findings.append(Finding(
                "wrong_path" if is_path_kind(hit.kind) else "env_leak", hit.tenant, tenant.name, hit.kind, "env",
                snapshot.location, label, hit.evidence, detail=f"{snapshot.origin} tool subprocess",
                tool=snapshot.tool, **where,
            ))
    return findings


def shows_home(snapshot: EnvSnapshot) -> bool:
    """The snapshot has a `HERMES_HOME` (what lets the path check see a wrong home at all): in the base64 dump,
    or in the plain one (a redacted copy's base64 dump is cut by the placeholders of the secrets inside it)."""
    return any(line.startswith(b"HERMES_HOME=") for line in snapshot.decoded.splitlines()) or any(
        line.startswith("HERMES_HOME=") for line in snapshot.plain.splitlines())

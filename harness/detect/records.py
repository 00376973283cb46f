"""Servers that are not behind the proxy record themselves: a tenant's MCP server over stdio writes, one JSON
line each, how it was started (argv, whole environment, cwd) and every tool call with its arguments and
result (`harness.capture.stubs.mcp_stdio`). This reads those records and checks them like any other
evidence of the tenant's service:

- its start: another tenant's canary in its environment, argv or cwd is an `env_leak` (the server is a
  child Hermes started for that tenant's profile, as a tool subprocess is); its credential variable must
  hold the tenant's credential for it, else `wrong_key`;
- a call's arguments are what the server received (`request_leak`), its result what it answered
  (`response_leak`), attributed to the tool `mcp__<server>__<tool>`.

Every finding names the service. Locations are `services/<file>#<line>` with the part (`env.NAME`, `argv`,
`cwd`, `arguments`, `result`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.core.findings import Finding
from harness.core.registry import Registry, is_path_kind
from harness.detect import scan
from harness.detect.engine.matcher import Matcher
from harness.detect.engine.stream import NotInspected

#: What a record file is named: `<service>-<tenant>-<pid>.jsonl`, and the variable that carries the server's
#: credential (`mcp_stdio.TOKEN_ENV`), by service.
TOKEN_ENVS = {"mcp_stdio": "TENANCY_MCP_STDIO_KEY"}
#: The name a service's server has in the profiles' config (its tools are `mcp__<name>__<tool>`).
SERVER_NAMES = {"mcp_stdio": "tenancy_stdio"}


@dataclass
class Line:
    """One line of a record file: its number and its event."""

    number: int
    event: dict[str, Any]

    @property
    def time(self) -> float:
        value = self.event.get("time")
        return float(value) if isinstance(value, int | float) else 0.0


@dataclass
class Record:
    """One server process's record."""

    path: Path
    service: str
    tenant: str
    lines: list[Line] = field(default_factory=list)
    unreadable: str = ""

    @property
    def label(self) -> str:
        return f"services/{self.path.name}"

    def calls(self) -> Iterator[Line]:
        return (ln for ln in self.lines if ln.event.get("event") == "call")


def read(folder: Path, registry: Registry) -> list[Record]:
    """Every record file in `folder` (the evidence folder's `services/`) of a known service and tenant."""
    records = []
    for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        service, _, rest = path.stem.partition("-")
        tenant = rest.rsplit("-", 1)[0]
        if service not in TOKEN_ENVS or tenant not in registry.tenants:
            continue
        record = Record(path, service, tenant)
        try:
            text = path.read_text(encoding="utf-8", errors="surrogateescape")
        except OSError as exc:
            record.unreadable = exc.strerror or str(exc)
            records.append(record)
            continue
        for n, line in enumerate(text.splitlines(), 1):
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line cut by a killed server
            if isinstance(event, dict):
                record.lines.append(Line(n, event))
        records.append(record)
    return records


def check(record: Record, registry: Registry, matcher: Matcher,
          not_inspected: list[NotInspected] | None = None) -> list[tuple[float, Finding]]:
    """The findings of one server's record (see the module docstring), each with the time its line was
    written (for its phase); unlabelled (no scenario or phase)."""
    found: list[tuple[float, Finding]] = []
    tenant = registry[record.tenant]
    start = next((ln for ln in record.lines if ln.event.get("event") == "start"), None)
    if start is not None:
        findings: list[Finding] = []
        where = f"{record.label}#{start.number}"
        env = {str(k): str(v) for k, v in (start.event.get("env") or {}).items()}
        token_env = TOKEN_ENVS[record.service]
        findings += _credential(tenant.name, record.service, env.pop(token_env, None), registry, matcher,
                                f"{where}:env.{token_env}")
        parts = [(f"env.{k}", f"{k}={v}") for k, v in env.items()]
        parts += [("argv", json.dumps(start.event.get("argv"))), ("cwd", str(start.event.get("cwd")))]
        for part, text in parts:
            findings += [replace(f, kind="wrong_path") if is_path_kind(f.canary or "") else f for f in _scan(
                text, registry, tenant.name, matcher, f"{where}:{part}",
                {"kind": "env_leak", "channel": "env", "service": record.service, "tool": None}, not_inspected)]
        found += [(start.time, f) for f in findings]
    server = SERVER_NAMES[record.service]
    for line in record.calls():
        tool = f"mcp__{server}__{line.event.get('tool')}"
        where = f"{record.label}#{line.number}"
        findings = _scan(json.dumps(line.event.get("arguments")), registry, tenant.name, matcher,
                         f"{where}:arguments", {"kind": "request_leak", "channel": "request", "service": record.service,
                                                "tool": tool}, not_inspected)
        findings += _scan(str(line.event.get("result")), registry, tenant.name, matcher, f"{where}:result",
                          {"kind": "response_leak", "channel": "response", "service": record.service, "tool": tool},
                          not_inspected)
        found += [(line.time, f) for f in findings]
    return found


def _credential(tenant: str, service: str, value: str | None, registry: Registry, matcher: Matcher,
                location: str) -> list[Finding]:
    """`wrong_key` unless `value` is the tenant's credential for `service`."""
    t = registry[tenant]
    expected = t.credential(service)
    own_kind = t.services[service].credential if service in t.services else None
    if value == expected:
        return []
    if not value:
        return [Finding("wrong_key", tenant, tenant, own_kind, "env", location, evidence="no credential",
                        detail=f"the {service} server got no credential", service=service)]
    owner = registry.owner_of_key(value)
    if owner is None:
        return [Finding("wrong_key", tenant, tenant, own_kind, "env", location,
                        evidence=f"<unknown, {len(value)} chars>", detail="unknown credential", service=service)]
    canary = next(k for k, v in owner.secrets().items() if v == value)
    detail = "another tenant's secret" if owner.name != tenant else f"not the tenant's {service} credential"
    return [Finding("wrong_key", owner.name, tenant, canary, "env", location,
                    evidence=matcher.redact_text(value), detail=f"the {service} server's credential is {detail}",
                    service=service)]


def _scan(text: str, registry: Registry, owner: str, matcher: Matcher, label: str, as_: dict[str, str | None],
          not_inspected: list[NotInspected] | None) -> list[Finding]:
    """The foreign canaries of `text` as findings with the fields of `as_` (kind, channel, service, tool)."""
    hits = scan.scan_text(text, registry, owner, label=label, channel="log", matcher=matcher,
                          not_inspected=not_inspected)
    return [replace(f, **as_) for f in hits]

"""Which tool a finding came through, and which tools a run drove (the coverage table).

A chat request re-sends the whole conversation: the assistant messages hold the tool calls (id, name,
arguments) and the `role: tool` messages their results (by `tool_call_id`). A canary found inside a tool
result (or a call's arguments) is attributed to that tool. Files a tool writes (its store under the
profile's home) are attributed by path. Shared by the live addon (through `flows`) and by `reconcile`.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from typing import Any

from harness.core.findings import INCONCLUSIVE_KINDS, Finding

#: File stores of the battery's tools, relative to a profile's home (a file finding's location starts so).
_STORES = (("memories/", "memory"), ("skills/", "skill_manage"), ("cron/", "cronjob"),
           ("kanban.db", "kanban_create"), ("kanban/", "kanban_create"))

_DECODER = json.JSONDecoder()


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _members(text: str, i: int) -> list[tuple[str, int, int]]:
    """(key, start, end) of every value of the JSON object at `text[i]` (`text[i]` is `{`)."""
    out = []
    i = _skip(text, i + 1)
    while i < len(text) and text[i] != "}":
        key, i = _DECODER.raw_decode(text, i)
        i = _skip(text, _skip(text, i) + 1)  # past ':'
        _, end = _DECODER.raw_decode(text, i)
        out.append((key, i, end))
        i = _skip(text, end)
        if i < len(text) and text[i] == ",":
            i = _skip(text, i + 1)
    return out


def _elements(text: str, i: int) -> list[tuple[int, int]]:
    """(start, end) of every element of the JSON array at `text[i]` (`text[i]` is `[`)."""
    out = []
    i = _skip(text, i + 1)
    while i < len(text) and text[i] != "]":
        _, end = _DECODER.raw_decode(text, i)
        out.append((i, end))
        i = _skip(text, end)
        if i < len(text) and text[i] == ",":
            i = _skip(text, i + 1)
    return out


@functools.lru_cache(maxsize=4)  # a request's leak scan and its findings' tools read the same body's spans
def message_spans(data: bytes) -> tuple[tuple[int, int], ...]:
    """Byte spans of the `messages` of a chat request body, in order; () when it is not one."""
    text = data.decode("latin-1")  # one char per byte: char offsets are byte offsets
    i = _skip(text, 0)
    if not text.startswith("{", i):
        return ()
    try:
        for key, start, _ in _members(text, i):
            if key == "messages" and text.startswith("[", start):
                return tuple(_elements(text, start))
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the decoder goes
        return ()
    return ()


def call_names(messages: list[Any]) -> dict[str, str]:
    """tool_call_id -> tool name, from the assistant messages' tool calls."""
    names = {}
    for m in messages:
        if not isinstance(m, dict) or m.get("role") != "assistant":
            continue
        for call in m.get("tool_calls") or []:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and isinstance(call.get("id"), str):
                names[call["id"]] = str(fn.get("name"))
    return names


def _message_tool(m: Any, names: dict[str, str]) -> str | None:
    if not isinstance(m, dict):
        return None
    if m.get("role") == "tool":
        return names.get(str(m.get("tool_call_id")))
    calls = [c for c in m.get("tool_calls") or [] if isinstance(c, dict)]
    if m.get("role") == "assistant" and len(calls) == 1 and isinstance(calls[0].get("function"), dict):
        return str(calls[0]["function"].get("name"))
    return None


def relative_calls(messages: list[Any]) -> dict[str, str]:
    """tool_call_id -> the relative `path` argument of each call given one (neither absolute nor from `~`): the tool
    resolves it against a directory of its choosing, the profile's working directory."""
    out = {}
    for m in messages:
        for call in (m.get("tool_calls") or []) if isinstance(m, dict) and m.get("role") == "assistant" else []:
            fn = call.get("function") if isinstance(call, dict) else None
            try:
                args = json.loads(fn.get("arguments") or "{}") if isinstance(fn, dict) else None
            except ValueError:
                continue
            path = args.get("path") if isinstance(args, dict) else None
            if isinstance(path, str) and path and not path.startswith(("/", "~")) and isinstance(call.get("id"), str):
                out[call["id"]] = path
    return out


def _resolved_elsewhere(f: Finding, tool: str, path: str) -> Finding:
    """A tenant's relative path answered with another tenant's data: resolved against a directory not its own. Not a
    file tool's reach (the tenant named no path of another), so never what the file tools share by design."""
    return replace(f, kind="wrong_path", tool=tool,
                   detail=f"{tool} resolved the relative path {path!r} outside the profile's own directories")


def attribute_body(findings: list[Finding], data: bytes, doc: Any, prefix: str) -> list[Finding]:
    """Give every finding at `<prefix>@OFFSET` of a chat request body the tool of the message it sits in; a request
    leak in the result of a call given a relative path is a `wrong_path` (`_resolved_elsewhere`)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list):
        return findings
    if not any(f.location.startswith(prefix + "@") for f in findings):
        return findings
    messages = doc["messages"]
    spans = message_spans(data)
    if len(spans) != len(messages):
        return findings
    names, relative = call_names(messages), relative_calls(messages)
    out = []
    for f in findings:
        tool, path = None, None
        if f.location.startswith(prefix + "@"):
            offset = int(f.location.rsplit("@", 1)[1])
            idx = next((n for n, (a, b) in enumerate(spans) if a <= offset < b), None)
            tool = _message_tool(messages[idx], names) if idx is not None else None
            if idx is not None and isinstance(messages[idx], dict) and messages[idx].get("role") == "tool":
                path = relative.get(str(messages[idx].get("tool_call_id")))
        if tool and path and f.kind == "request_leak":
            out.append(_resolved_elsewhere(f, tool, path))
        else:
            out.append(replace(f, tool=tool) if tool else f)
    return out


#: The tools that write a file at a path their call names.
_WRITERS = ("write_file", "patch")
_FILE_PART = re.compile(r"[^@:#]+")


def written_files(messages: list[Any]) -> dict[str, str]:
    """File name -> the tool that wrote it, from the write calls of a conversation's assistant messages."""
    out: dict[str, str] = {}
    for m in messages:
        if not isinstance(m, dict) or m.get("role") != "assistant":
            continue
        for call in m.get("tool_calls") or []:
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or fn.get("name") not in _WRITERS:
                continue
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except ValueError:
                continue
            path = args.get("path") if isinstance(args, dict) else None
            if isinstance(path, str) and path:
                out.setdefault(PurePosixPath(path).name, fn["name"])
    return out


def store_named(following: bytes) -> str | None:
    """The tool whose store a path continues into when `following` comes right after a home in it
    (`/kanban/boards/b/kanban.db`: kanban_create), or None (a path elsewhere, or no path)."""
    if not following.startswith(b"/"):
        return None
    rest = following[1:].decode("latin-1")
    return next((tool for prefix, tool in _STORES if rest.startswith(prefix)), None)


def tool_for_file(location: str, written: dict[str, str] | None = None) -> str | None:
    """The tool a file finding came through: the tool whose store it is in (`memories/MEMORY.md@12` -> memory),
    else the tool that wrote a file of its name (`written`: `written_files` of the run's requests), if any."""
    store = next((tool for prefix, tool in _STORES if location.startswith(prefix)), None)
    if store or not written or not (m := _FILE_PART.match(location)):
        return store
    return written.get(PurePosixPath(m[0]).name)


def _is_error(content: Any) -> bool:
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(content, str):
        return False
    try:
        doc = json.loads(content)
    except ValueError:
        return False
    return isinstance(doc, dict) and (doc.get("success") is False or (bool(doc.get("error"))
                                                                      and doc.get("success") is not True))


def offered_tools(doc: dict[str, Any]) -> set[str]:
    """The names of the tools a chat-completion request offers its model."""
    return {str(t["function"].get("name")) for t in doc.get("tools") or []
            if isinstance(t, dict) and isinstance(t.get("function"), dict)}


@dataclass

class Coverage:
    """Per scenario: the tools Hermes offered, and per tool the calls whose result came back ok or in error;
    per service (other than the provider) the requests it answered ok or in error."""

    offered: dict[str, set[str]] = field(default_factory=dict)
    ok: dict[str, dict[str, int]] = field(default_factory=dict)
    errors: dict[str, dict[str, int]] = field(default_factory=dict)
    service_ok: dict[str, dict[str, int]] = field(default_factory=dict)
    service_errors: dict[str, dict[str, int]] = field(default_factory=dict)
    _seen: set[str] = field(default_factory=set)

    def used(self, scenario: str, service: str, ok: bool) -> None:
        """Count one request a service received (`ok`: answered with a success)."""
        per = (self.service_ok if ok else self.service_errors).setdefault(scenario, {})
        per[service] = per.get(service, 0) + 1

    def add(self, scenario: str, doc: dict[str, Any]) -> None:
        """Count one main request: its offered tools and every tool result not counted yet."""
        self.offered.setdefault(scenario, set()).update(offered_tools(doc))
        messages = [m for m in doc.get("messages") or [] if isinstance(m, dict)]
        names = call_names(messages)
        for m in messages:
            call_id = m.get("tool_call_id")
            if m.get("role") != "tool" or not isinstance(call_id, str) or call_id in self._seen:
                continue
            self._seen.add(call_id)
            tool = names.get(call_id)
            if tool is None:
                continue
            bucket = self.errors if _is_error(m.get("content")) else self.ok
            per = bucket.setdefault(scenario, {})
            per[tool] = per.get(tool, 0) + 1

    def table(self, tools: tuple[str, ...] | list[str], findings: list[Finding],
              out_of_scope: dict[str, str] | None = None,
              allowed: Sequence[Finding] = (), driven_by: Mapping[str, str] | None = None) -> dict[str, dict[str, str]]:
        """scenario -> tool -> `leak`, `allowed` (only findings an isolation policy allows), `driven`, `failed`,
        `not offered`, `not driven: <the option that drives it>` (`driven_by`: the tools this run's options left
        out), `not driven` (the battery asked for it and the model never called it) or `out of scope: <why>`: every
        tool of `tools` (the battery's), then every other tool a request of the scenario offered."""
        leaks = {(f.scenario, f.tool) for f in findings if f.tool and f.kind not in ("shortfall", "bypass")}
        shared = {(f.scenario, f.tool) for f in allowed if f.tool}
        out_of_scope, driven_by = out_of_scope or {}, driven_by or {}
        out: dict[str, dict[str, str]] = {}
        for scenario in sorted(self.offered):
            row = {}
            for tool in [*tools, *sorted(self.offered[scenario] - set(tools))]:
                ok = self.ok.get(scenario, {}).get(tool, 0)
                bad = self.errors.get(scenario, {}).get(tool, 0)
                if (scenario, tool) in leaks:
                    row[tool] = "leak"
                elif (scenario, tool) in shared:
                    row[tool] = "allowed"
                elif ok:
                    row[tool] = "driven"
                elif bad:
                    row[tool] = "failed"
                elif tool not in self.offered[scenario]:
                    row[tool] = "not offered"
                elif tool in driven_by:
                    row[tool] = f"not driven: {driven_by[tool]}"
                elif tool in out_of_scope:
                    row[tool] = f"out of scope: {out_of_scope[tool]}"
                else:
                    row[tool] = "not driven"
            out[scenario] = row
        return out

    def service_table(self, states: dict[str, str], findings: list[Finding], allowed: Sequence[Finding] = (),
                      doors: Mapping[str, Sequence[str]] | None = None) -> dict[str, dict[str, str]]:
        """scenario -> service -> `leak`, `driven`, `failed`, `not driven` or `n/a: <why>` (`states`: what the
        run recorded of each service, `on` or `n/a: <why>`; `doors`: the services only some front doors drive,
        `n/a` where no request of another scenario reached them)."""
        doors = doors or {}
        leaks = {(f.scenario, f.service) for f in findings if f.service and f.kind not in ("shortfall", "bypass")}
        shared = {(f.scenario, f.service) for f in allowed if f.service}
        out: dict[str, dict[str, str]] = {}
        for scenario in sorted(self.offered):
            row = {}
            for service, state in states.items():
                if state != "on":
                    row[service] = state
                elif (scenario, service) in leaks:
                    row[service] = "leak"
                elif (scenario, service) in shared:
                    row[service] = "allowed"
                elif self.service_ok.get(scenario, {}).get(service):
                    row[service] = "driven"
                elif self.service_errors.get(scenario, {}).get(service):
                    row[service] = "failed"
                elif doors.get(service) and scenario not in doors[service]:
                    row[service] = f"n/a: only the {', '.join(doors[service])} door drives it"
                else:
                    row[service] = "not driven"
            out[scenario] = row
        return out


def door_table(states: dict[str, str], turns: Sequence[dict], findings: Sequence[Finding],
               allowed: Sequence[Finding] = ()) -> dict[str, str]:
    """front door -> `leak`, `allowed`, `driven`, `failed`, or the run's state of it (`not driven: ...`,
    `out of scope: ...`): `states` is what the run recorded (`on` for the doors its scenario drove, `phase NAME`
    for a way in that phase drove)."""
    leaks = {f.scenario for f in findings if f.kind not in INCONCLUSIVE_KINDS}
    shared = {f.scenario for f in allowed}
    ran = {t.get("scenario") for t in turns if t.get("ok")}
    out = {}
    for door, state in states.items():
        if state.startswith("phase "):
            phase = state.removeprefix("phase ")
            out[door] = ("leak" if any(f.phase == phase and f.kind not in INCONCLUSIVE_KINDS for f in findings)
                         else "driven" if any(t.get("phase") == phase and t.get("ok") for t in turns) else "failed")
        elif state != "on":
            out[door] = state
        elif door in leaks:
            out[door] = "leak"
        elif door in shared:
            out[door] = "allowed"
        else:
            out[door] = "driven" if door in ran else "failed"
    return out


def platform_table(states: dict[str, str], turns: Sequence[dict], findings: Sequence[Finding],
                   allowed: Sequence[Finding] = ()) -> dict[str, str]:
    """messaging platform adapter -> `leak`, `allowed`, `driven`, `failed`, or the run's state of it (`not driven:
    ...`, `n/a: ...`, `out of scope: ...`): `states` is what the run recorded (`on` for a platform it drove, whose
    bots' steps are the `messaging` phase's with the platform as their driver)."""
    out = {}
    for name, state in states.items():
        if state != "on":
            out[name] = state
        elif any(f.service == name and f.kind not in INCONCLUSIVE_KINDS for f in findings):
            out[name] = "leak"
        elif any(f.service == name for f in allowed):
            out[name] = "allowed"
        else:
            steps = [t for t in turns if t.get("driver") == name]
            out[name] = "driven" if steps and all(t.get("ok") for t in steps) else "failed"
    return out

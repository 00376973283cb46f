"""The tool battery: what each tenant's scripted model asks Hermes' profile-scoped tools to do.

A tenant's first turn of a scenario (phase `turns`) runs the *write plan*: the env probe and every
battery tool writing something that holds a canary of that tenant, then every tool reading or listing it
back. Its turn in phase `lookups` runs the *lookup plan*: every tool lists again, and every tool that
takes an identifier is asked for one of another tenant's (its ring neighbour's session ids, job id and
name, process id and skill name, bare and in the profile-qualified forms the tool accepts). Whatever of
the other tenant comes back reaches the provider in the tool result, where the flow inspection finds it
and attributes it to the tool.

The identifiers are not canaries (a probe naming one would flag itself); the canaries are what the
objects hold: a skill's description and body, a job's prompt, a process' command line, a memory entry, a
todo item, a session's messages. The plan is data for the stubs (`ToolStep`s); a step whose tool the
request does not offer is skipped by the stub and shows as `not offered` in the coverage table.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.capture.stubs.provider import Plan, StubProvider, ToolStep, probe_step
from harness.core.protocol import SUBAGENT_TASK, probe_code
from harness.core.registry import TAG_MARKER, new_tag
from harness.detect.decode import loads
from harness.detect.tools import call_names
from harness.drive import forms
from harness.drive.context import Context
from harness.drive.services import GROUP_SERVICES, SERVICES, TOOL_GROUPS
from harness.drive.surface import COMMON_WORD, Turn

#: Canary kinds the battery mints for every tenant (kind -> value prefix).
KINDS = {
    "bg_process": "bgproc",
    "tool_memory": "toolmem",
    "skill_desc": "skilldesc",
    "skill_body": "skillbody",
    "todo_item": "todo",
    "cron_job": "cronjob",
    "title": "title",
    "file_note": "filenote",
    "file_patch": "filepatch",
    **forms.KINDS,
}
#: `memory` has no read action; a remove that matches nothing answers with every current entry.
NO_MATCH = "tenancy-read-back-matches-no-entry"
_PROC_ID = re.compile(r"proc_[0-9a-f]{6,}")
#: Tools Hermes 0.19 runs concurrently when one message calls only these (the MCP servers' are, as their
#: config says `supports_parallel_tool_calls`); any other message's calls run one by one with a 1 s pause in
#: between (`AIAgent.tool_delay`, not configurable), so every other call gets a model round trip of its own,
#: which is faster.
PARALLEL_SAFE = frozenset({"session_search", "skill_view", "skills_list", "read_file", "search_files",
                           *(t for spec in SERVICES.values() for t in spec.battery.parallel_safe)})


def rounds(steps: list[ToolStep]) -> Plan:
    """The steps as rounds: every call that is not parallel-safe in a round of its own, in order, then every
    parallel-safe call in one last round (the reads, and the MCP servers' notes: a note and its recall may
    then come back in either order, which only decides whether the tenant's own note is in the answer)."""
    safe = [s for s in steps if s.tool in PARALLEL_SAFE]
    return [[s] for s in steps if s.tool not in PARALLEL_SAFE] + ([safe] if safe else [])


def groups(ctx: Context) -> tuple[str, ...]:
    """The battery's groups this run drives: a service's group only where a service it needs is on."""
    on = set(ctx.services())
    return tuple(g for g in ctx.opts.tools if g not in GROUP_SERVICES or on & set(GROUP_SERVICES[g]))


def _services(ctx: Context, on: tuple[str, ...]) -> list[str]:
    """The services whose battery steps this run takes: on, and their group enabled."""
    return [s for s in ctx.services() if SERVICES[s].battery.group in on]


def enabled(ctx: Context) -> bool:
    return bool(ctx.opts.tools)


def mint(ctx: Context) -> None:
    """Mint the battery's canaries for every tenant (one registry save), lay the plants and settings of its argument
    and configuration forms (`forms`) and answer auxiliary requests with the tenant's title canary. Before any
    plant, so plants can copy them."""
    for t in ctx.registry:
        tag = new_tag()
        for kind, prefix in KINDS.items():
            if kind not in t.canaries:
                ctx.registry.add_canary(t.name, kind, f"{prefix}-{t.name}-{tag}")
    ctx.registry.save(ctx.registry_path)
    on = groups(ctx)
    if "files" in on:
        forms.lay_relative(ctx, {name: neighbour(ctx, name) for name in ctx.registry.names()})
    if "code" in on:
        forms.lay_passthrough(ctx)
    if enabled(ctx):
        for t in ctx.registry:
            ctx.stubs[t.name].aux_text = f"Title {t.canaries['title']}"
            for (tenant, service), stub in ctx.service_stubs.items():
                if tenant == t.name and SERVICES[service].battery.titles and isinstance(stub, StubProvider):
                    stub.aux_text = f"Title {t.canaries['title']}"


def skill_name(tenant: str, scenario: str) -> str:
    """The skill the battery creates (lowercase, hyphens; not a canary: lookups must name it)."""
    return f"tenancy-{tenant}-{scenario}"


def job_name(tenant: str, scenario: str) -> str:
    return f"tenancy-{tenant}-{scenario}"


def skill_document(name: str, description: str, body: str) -> str:
    return f"---\nname: {name}\ndescription: Tenancy audit skill {description}\n---\n\n# Tenancy\n\n{body}\n"


def write_plan(ctx: Context, tenant: str) -> Plan:
    """The env probe, each enabled tool writing a canary of `tenant`, then each reading or listing it back."""
    t = ctx.registry[tenant]
    c, sc, on = t.canaries, ctx.scenario, groups(ctx)
    writes, reads = [probe_step(t)], []
    if "terminal" in on:
        writes.append(ToolStep("terminal", {"command": f"echo {c['bg_process']} {sc}; sleep 2",
                                            "background": True}))
        reads.append(ToolStep("process", {"action": "list"}))
    if "memory" in on:
        entry = f"{c['tool_memory']} ({sc})"
        writes.append(ToolStep("memory", {"action": "add", "target": "memory", "content": entry}))
        reads.append(ToolStep("memory", {"action": "remove", "target": "memory", "old_text": NO_MATCH}))
    if "skills" in on:
        name = skill_name(tenant, sc)
        writes.append(ToolStep("skill_manage", {"action": "create", "name": name,
                                                "content": skill_document(name, c["skill_desc"], c["skill_body"])}))
        reads += [ToolStep("skills_list", {}), ToolStep("skill_view", {"name": name})]
    if "todo" in on:
        writes.append(ToolStep("todo", {"todos": [{"id": "tenancy-1", "content": f"{c['todo_item']} ({sc})",
                                                   "status": "pending"}]}))
        reads.append(ToolStep("todo", {}))
    if "cronjob" in on:
        writes.append(ToolStep("cronjob", {"action": "create", "name": job_name(tenant, sc), "schedule": "30m",
                                           "prompt": f"{c['cron_job']} ({sc}): say hello", "deliver": "local"}))
        reads.append(ToolStep("cronjob", {"action": "list"}))
    if "session_search" in on:
        reads += [ToolStep("session_search", {}), ToolStep("session_search", {"query": COMMON_WORD})]
    for service in _services(ctx, on):
        writes += SERVICES[service].battery.writes(Turn(t, sc))
        reads += SERVICES[service].battery.reads(Turn(t, sc))
    if "code" in on:
        writes.append(ToolStep("execute_code", {"code": probe_code()}))
    if "delegate" in on:
        writes.append(ToolStep("delegate_task", {"goal": subagent_goal(tenant)}))
    if "files" in on:
        own = f"{home_path(ctx, tenant)}/{FILE_PREFIX}{tenant}-own.txt"
        writes += [ToolStep("write_file", {"path": own, "content": f"{c['file_note']} ({sc})\n"}),
                   ToolStep("patch", {"mode": "replace", "path": own, "old_string": c["file_note"],
                                      "new_string": c["file_patch"]})]
        # its own files: the launch profile's home holds every other profile's, so search its workdir
        writes += forms.relative_writes(t, sc)
        reads += [ToolStep("read_file", {"path": f"{home_path(ctx, tenant)}/SOUL.md"}),
                  ToolStep("search_files", {"pattern": TAG_MARKER, "path": c["workdir"]}), *forms.relative_reads()]
    if "projects" in on:
        writes += [ToolStep("project_create", {"name": project_name(tenant, sc), "path": c["workdir"]}),
                   ToolStep("project_switch", {"project": project_name(tenant, sc)})]
        reads.append(ToolStep("project_list", {}))
    if "terminals" in on:  # a tab of a process of its own (none: the tab of a process that is not there)
        reads.append(ToolStep("close_terminal", {"process_id": "proc_000000"}))
    return rounds(writes + reads)


#: What the battery's files are called (`detect.tools` attributes a file so named to `write_file`).
FILE_PREFIX = "tenancy-file-"


def home_path(ctx: Context, tenant: str) -> str:
    """A tenant's Hermes home as a tool argument: relative to the shared HOME (`~/.hermes/profiles/NAME`), so a
    call naming another tenant's home carries no canary of it."""
    return "~/" + ctx.sandbox.home_of(tenant).relative_to(ctx.sandbox.home).as_posix()


def workdirs_path(ctx: Context) -> str:
    """The folder of every tenant's workdir, relative to HOME (a workdir's own name is a canary)."""
    return "~/" + Path(os.path.relpath(ctx.sandbox.root / "work", ctx.sandbox.home)).as_posix()


def subagent_goal(tenant: str) -> str:
    """The task of the battery's subagent (a conversation of its own: the stubs answer it with the env probe)."""
    return f"{SUBAGENT_TASK} {tenant}: run the environment probe and report"


def project_name(tenant: str, scenario: str) -> str:
    return f"tenancy-{tenant}-{scenario}"


@dataclass
class Refs:
    """Identifiers of one tenant's objects, learned after its turn."""

    tenant: str
    sessions: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    processes: list[str] = field(default_factory=list)


def lookup_plan(ctx: Context, tenant: str, other: Refs) -> Plan:
    """The env probe, every tool's list or read again, and every identifier of `other`, bare and in the
    profile-qualified forms the tool accepts."""
    t = ctx.registry[tenant]
    o, sc, on = other.tenant, ctx.scenario, groups(ctx)
    steps = [probe_step(t)]
    if "terminal" in on:
        steps.append(ToolStep("process", {"action": "list"}))
        steps += [ToolStep("process", {"action": "poll", "session_id": p}) for p in other.processes[:1]]
    if "memory" in on:
        steps.append(ToolStep("memory", {"action": "remove", "target": "memory", "old_text": NO_MATCH}))
    if "skills" in on:
        # skill_view takes no profile-qualified name (`x:name` is a plugin's namespace): bare only
        steps += [ToolStep("skills_list", {}), ToolStep("skill_view", {"name": skill_name(o, sc)})]
    if "todo" in on:
        steps.append(ToolStep("todo", {}))
    if "cronjob" in on:  # a job is named by id or by name
        steps += [ToolStep("cronjob", {"action": "list"}),
                  ToolStep("cronjob", {"action": "pause", "job_id": job_name(o, sc)})]
        steps += [ToolStep("cronjob", {"action": "pause", "job_id": j}) for j in other.jobs[:1]]
    for service in _services(ctx, on):
        steps += SERVICES[service].battery.lookups(Turn(t, sc, o))
    if "files" in on:  # another tenant's home, read, searched and written to (by design not a sandbox)
        theirs = home_path(ctx, o)
        mine = f"{theirs}/{FILE_PREFIX}{tenant}-in-{o}.txt"
        steps += [ToolStep("read_file", {"path": f"{theirs}/SOUL.md"}),
                  ToolStep("search_files", {"pattern": TAG_MARKER, "path": theirs}),
                  ToolStep("search_files", {"pattern": TAG_MARKER, "path": workdirs_path(ctx)}),
                  ToolStep("write_file", {"path": mine, "content": f"{t.canaries['file_note']} ({sc})\n"})]
    if "projects" in on:
        steps += [ToolStep("project_list", {}), ToolStep("project_switch", {"project": project_name(o, sc)})]
    if "terminals" in on:
        steps += [ToolStep("close_terminal", {"process_id": p}) for p in other.processes[:1]]
    if "session_search" in on:
        steps += [ToolStep("session_search", {"profile": o}),
                  ToolStep("session_search", {"query": COMMON_WORD, "profile": o})]
        for sid in other.sessions[:1]:
            steps += [ToolStep("session_search", {"session_id": sid}),
                      ToolStep("session_search", {"session_id": sid, "profile": o})]
    return rounds(steps)


@contextmanager
def scripted(ctx: Context, plans: dict[str, Plan]) -> Iterator[None]:
    """Tenants' stubs answer with these plans for the duration; then with the env probe only."""
    for name, plan in plans.items():
        ctx.stubs[name].script(plan)
    try:
        yield
    finally:
        for name in plans:
            ctx.stubs[name].script(None)


def tool_results(ctx: Context, tenant: str, since: float) -> Iterator[tuple[str, Any]]:
    """(tool name, parsed result) of every tool result `tenant`'s provider received since `since`."""
    seen: set[str] = set()
    for r in ctx.stubs[tenant].snapshot():
        if r.time < since or not r.body:
            continue
        body = loads(r.body)
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list):
            continue
        names = call_names(messages)
        for m in messages:
            if not isinstance(m, dict) or m.get("role") != "tool" or m.get("tool_call_id") in seen:
                continue
            seen.add(str(m.get("tool_call_id")))
            content = m.get("content")
            try:
                doc = json.loads(content) if isinstance(content, str) else content
            except ValueError:
                doc = content
            yield names.get(str(m.get("tool_call_id")), ""), doc


def _sessions_in_home(ctx: Context, tenant: str, since: float) -> list[str]:
    db = ctx.sandbox.home_of(tenant) / "state.db"
    if not db.exists():
        return []
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            rows = conn.execute("SELECT id FROM sessions WHERE started_at >= ? ORDER BY started_at DESC",
                                (since - 1,)).fetchall()
    except sqlite3.Error:
        return []
    return [str(r[0]) for r in rows]


def learn(ctx: Context, tenant: str, since: float, sessions: list[str] | None = None) -> Refs:
    """`tenant`'s session ids (its home's state.db, or `sessions` from RPC replies), the job ids and
    process ids its tools returned since `since` (what its provider received)."""
    refs = Refs(tenant, sessions=list(sessions or []) + _sessions_in_home(ctx, tenant, since))
    for name, doc in tool_results(ctx, tenant, since):
        if name == "cronjob" and isinstance(doc, dict) and isinstance(doc.get("job_id"), str):
            refs.jobs.append(doc["job_id"])
        elif name == "terminal":
            refs.processes += _PROC_ID.findall(json.dumps(doc))
    refs.sessions = list(dict.fromkeys(s for s in refs.sessions if s))
    return refs


def neighbour(ctx: Context, tenant: str) -> str:
    """The tenant whose identifiers `tenant` looks up: the previous one in the ring (default: the last)."""
    names = ctx.registry.names()
    return names[(names.index(tenant) - 1) % len(names)]


def check_groups(names: list[str]) -> list[str]:
    """Unknown group names (for the option check)."""
    return [n for n in names if n not in TOOL_GROUPS]


def write_turns(ctx: Context, turn: Callable[[str], None]) -> None:
    """Every tenant's turn, one after the other, each running its write plan (so a later tenant's lists
    run after an earlier tenant's writes)."""
    for name in ctx.registry.names():
        with scripted(ctx, {name: write_plan(ctx, name)} if enabled(ctx) else {}):
            turn(name)


def lookup_turns(ctx: Context, turn: Callable[[str], None], since: float,
                 sessions: dict[str, list[str]] | None = None) -> None:
    """Every tenant's turn, one after the other, each asking for its ring neighbour's identifiers."""
    names = ctx.registry.names()
    refs = {name: learn(ctx, name, since, (sessions or {}).get(name)) for name in names}
    for name in names:
        with scripted(ctx, {name: lookup_plan(ctx, name, refs[neighbour(ctx, name)])}):
            turn(name)

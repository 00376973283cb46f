"""The argument and configuration forms the battery drives besides the first that comes to mind: a regression in the
code of a form the audit never used, or used only where right and wrong give the same value, stays unseen.

- **Relative paths** (the `files` group). A relative path is resolved by the file tools against the profile's
  working directory, which differs per profile; the process's own cwd (the sandbox HOME) is every profile's. Each
  tenant's workdir holds `RELATIVE` with its own `relative_note`; HOME holds a file of the same name with every
  tenant's (what a resolution against the process's cwd finds); each workdir also holds `RELATIVE_WRITTEN` with its
  ring neighbour's note, which the tenant's relative write replaces before its relative read (a write that went
  elsewhere leaves the neighbour's note to be read). Only the right resolution reads nothing but the tenant's own:
  another tenant's canary in the result of a call given a relative path is a `wrong_path` (`detect.tools`), never
  what the file tools share by design.
- **Code execution's environment** (the `code` group). The environment a script gets from `execute_code` is an
  allowlist of the process's, to which a profile adds variables by name (`terminal.env_passthrough`). Without one,
  nothing of a profile's `.env` reaches the script, so a script run with the launch profile's environment looked
  the same. Every profile passes `PASSTHROUGH` through, its `.env` holding its own `passthrough` canary.
- **Auxiliary settings at run time** are the `aux` service's (`services/aux.py`): the run's second tenant takes its
  vision model from the environment and titles on its session's runtime.
"""

from __future__ import annotations

from pathlib import Path

from harness.capture.stubs.provider import ToolStep
from harness.core.registry import Tenant
from harness.drive.context import Context
from harness.drive.surface import edit_config, set_env

#: The file every workdir holds (and HOME, with every tenant's note) under the same relative path.
RELATIVE = "tenancy-relative.txt"
#: The file a tenant writes by its relative path (its workdir's holds its ring neighbour's note until then).
RELATIVE_WRITTEN = "tenancy-relative-written.txt"
#: The variable every profile passes through to its scripts.
PASSTHROUGH = "TENANT_PASSTHROUGH"
#: The canary kinds the forms need (kind -> value prefix), minted with the battery's.
KINDS = {"relative_note": "relnote", "passthrough": "passthrough"}


def lay_relative(ctx: Context, neighbour: dict[str, str]) -> None:
    """The relative-path plants: each workdir's own note and its neighbour's in the file it will write; HOME's file
    of every tenant's note (`neighbour`: each tenant's ring neighbour)."""
    notes = {t.name: t.canaries["relative_note"] for t in ctx.registry}
    for t in ctx.registry:
        workdir = Path(t.canaries["workdir"])
        (workdir / RELATIVE).write_text(f"{notes[t.name]}\n", encoding="utf-8")
        (workdir / RELATIVE_WRITTEN).write_text(f"{notes[neighbour[t.name]]}\n", encoding="utf-8")
    (ctx.sandbox.home / RELATIVE).write_text("".join(f"{n}\n" for n in notes.values()), encoding="utf-8")


def lay_passthrough(ctx: Context) -> None:
    """Every profile passes `PASSTHROUGH` to its scripts, its `.env` holding its own canary."""
    for t in ctx.registry:
        home = ctx.sandbox.home_of(t.name)
        edit_config(home, lambda cfg: cfg.setdefault("terminal", {}).update(env_passthrough=[PASSTHROUGH]))
        set_env(home, PASSTHROUGH, t.canaries["passthrough"])


def relative_writes(t: Tenant, scenario: str) -> list[ToolStep]:
    """The tenant's own note written and patched by its relative path."""
    c = t.canaries
    return [ToolStep("write_file", {"path": RELATIVE_WRITTEN, "content": f"{c['file_note']} ({scenario})\n"}),
            ToolStep("patch", {"mode": "replace", "path": RELATIVE_WRITTEN, "old_string": c["file_note"],
                               "new_string": c["file_patch"]})]


def relative_reads() -> list[ToolStep]:
    """Both files read, and the working directory searched, by relative paths."""
    return [ToolStep("read_file", {"path": RELATIVE}), ToolStep("read_file", {"path": RELATIVE_WRITTEN}),
            ToolStep("search_files", {"pattern": KINDS["relative_note"], "path": "."})]

"""Isolation regressions to plant in a copy of Hermes (`tenancy-audit mutants`): each a one-line change that
makes one profile's store, settings or credentials those of the launch profile, the shape of Hermes' own
isolation bugs (a path taken from the process's home instead of the profile's: F5, F7, F10, F16, F17).

A mutant names a file under site-packages, a line of it (a substring found exactly once) and, inside that line,
the expression it replaces. The replacement still computes the original expression and writes to a trace file in
the sandbox HOME whether the mutant's value differed from it, so a mutant the audit did not catch is told apart
from one whose code never ran or computed the same value (`not exercised`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

#: Where a mutated line records that it ran: `True` when its value differed from the original's.
TRACE = ".tenancy-mutant"
#: The launch profile's home as an expression in Hermes' code (its HOME is the sandbox's).
LAUNCH = '__import__("pathlib").Path.home() / ".hermes"'
_RECORDING = ('(lambda o, n: (open(__import__("os").path.expanduser("~/{trace}"), "a").write("%s\\n" % (o != n)), '
              'n)[1])({old}, {new})')


class MutantError(ValueError):
    """A mutant does not fit the installed file (the line is missing or not unique)."""


@dataclass(frozen=True)
class Mutant:
    name: str
    surface: str
    file: str  # relative to site-packages
    line: str  # a substring of exactly one line of the file
    old: str  # the expression in that line the mutant replaces
    new: str
    bug: str  # the isolation bug it reintroduces, in one line

    def patch(self, site: Path) -> str:
        """The unified diff (paths a/FILE, b/FILE) that plants it in the install at `site`."""
        text = (site / self.file).read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)
        at = [i for i, line in enumerate(lines) if self.line in line]
        if len(at) != 1 or self.old not in lines[at[0]]:
            raise MutantError(f"mutant {self.name}: {self.line!r} is on {len(at)} lines of {self.file}, not one "
                              f"holding {self.old!r}")
        changed = list(lines)
        changed[at[0]] = lines[at[0]].replace(self.old, _RECORDING.format(trace=TRACE, old=self.old, new=self.new), 1)
        return "".join(difflib.unified_diff(lines, changed, f"a/{self.file}", f"b/{self.file}"))


def _home(name: str, surface: str, file: str, line: str, bug: str) -> Mutant:
    """A path of the profile's home (`get_hermes_home()` in `line`) taken from the launch profile's instead."""
    return Mutant(name, surface, file, line, "get_hermes_home()", LAUNCH, bug)


MUTANTS: tuple[Mutant, ...] = (
    _home("memory-dir", "memory tool", "tools/memory_tool.py", 'return get_hermes_home() / "memories"',
          "the memory tool reads and writes the launch profile's MEMORY.md"),
    _home("skills-write", "skills", "tools/skill_manager_tool.py", 'return get_hermes_home() / "skills"',
          "skill_manage creates a profile's skills in the launch profile's skills/"),
    _home("skills-read", "skills", "tools/skills_tool.py", 'return get_hermes_home() / "skills"',
          "skills_list and skill_view list the launch profile's skills"),
    _home("process-checkpoint", "processes", "tools/process_registry.py",
          'CHECKPOINT_PATH = get_hermes_home() / "processes.json"',
          "background processes are checkpointed into the launch profile's processes.json (F17's shape)"),
    _home("state-db", "sessions", "hermes_state.py", 'DEFAULT_DB_PATH = get_hermes_home() / "state.db"',
          "every profile's sessions and messages are stored in the launch profile's state.db"),
    _home("dotenv-path", "credentials", "hermes_cli/config.py", 'return get_hermes_home() / ".env"',
          "the profile's .env path is the launch profile's (its keys read and written there)"),
    Mutant("dotenv-load", "credentials", "hermes_cli/env_loader.py", 'user_env = home_path / ".env"', "home_path",
           LAUNCH, "the process loads the launch profile's .env: every key is the launch profile's (F1, F10)"),
    _home("config-path", "settings", "hermes_cli/config.py", 'return get_hermes_home() / "config.yaml"',
          "config.yaml is read from the launch profile: its model, provider, cwd and services (F3, F7)"),
    _home("soul", "prompt", "agent/prompt_builder.py", 'soul_path = get_hermes_home() / "SOUL.md"',
          "the system prompt carries the launch profile's SOUL.md"),
    _home("mem0-config", "memory provider", "plugins/memory/mem0/__init__.py",
          'config_path = get_hermes_home() / "mem0.json"',
          "the mem0 provider reads the launch profile's mem0.json: its user and agent ids (F12's shape)"),
    _home("checkpoints", "file checkpoints", "tools/checkpoint_manager.py",
          'CHECKPOINT_BASE = get_hermes_home() / "checkpoints"',
          "file checkpoints of every profile go to the launch profile's checkpoints/"),
    _home("delegate-home", "subagents", "tools/delegate_tool.py", "hermes_home = get_hermes_home()",
          "a subagent runs in the launch profile's home (F15's shape)"),
    _home("debug-logs", "logs", "tools/debug_helpers.py", 'self.log_dir = get_hermes_home() / "logs"',
          "tool debug logs of every profile go to the launch profile's logs/ (F5's shape)"),
    _home("skills-env", "skills", "tools/skills_tool.py", 'env_path = get_hermes_home() / ".env"',
          "a skill's setup reads the launch profile's .env"),
    _home("cron-scripts", "cron", "tools/cronjob_tools.py", 'scripts_dir = get_hermes_home() / "scripts"',
          "cron job scripts of every profile are kept in the launch profile's scripts/"),
    Mutant("aux-key-env", "auxiliary models", "agent/auxiliary_client.py",
           'return os.getenv(key_env, "").strip() or None', "key_env", '"TENANT_PROVIDER_KEY"',
           "the auxiliary models take the profile's provider key instead of their own key_env (F14's shape)"),
)

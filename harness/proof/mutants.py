"""Isolation regressions to plant in a copy of Hermes (`tenancy-audit mutants`): each a one-line change that
makes one profile's store, settings or credentials those of the launch profile, the shape of Hermes' own
isolation bugs (a path taken from the process's home instead of the profile's: F5, F7, F10, F16, F17).

A mutant names a file under site-packages, a line of it (a substring found exactly once) and, inside that line,
the expression it replaces. Where the fix series (docs/fixes) rewrites that line, or the code around it so that it
is no longer used, the mutant also carries its twin form: the same regression written against the line as the series
leaves it, planted wherever that line is found (only in a patched install), so a mutant audits the twin as well as
the release. The replacement still computes the original expression and writes to a trace file in the sandbox HOME
whether the mutant's value differed from it, so a mutant the audit did not catch is told apart from one whose code
never ran or computed the same value (`not exercised`).
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
    """A mutant does not fit the install (its file is missing, its line missing or not unique): why, in words."""


@dataclass(frozen=True)
class Form:
    """Where and how a mutant is planted: a line of `file` (relative to site-packages; `line` a substring of exactly
    one line) and, inside it, the expression `old` it replaces with `new`."""

    file: str
    line: str
    old: str
    new: str

    def patch(self, site: Path) -> str:
        """The unified diff (paths a/FILE, b/FILE) that plants it in the install at `site`."""
        if not (site / self.file).is_file():
            raise MutantError(f"{self.file} is not in the install")
        text = (site / self.file).read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)
        at = [i for i, line in enumerate(lines) if self.line in line]
        if len(at) != 1 or self.old not in lines[at[0]]:
            raise MutantError(f"{self.line!r} is on {len(at)} lines of {self.file}, not one holding {self.old!r}")
        changed = list(lines)
        changed[at[0]] = lines[at[0]].replace(self.old, _RECORDING.format(trace=TRACE, old=self.old, new=self.new), 1)
        return "".join(difflib.unified_diff(lines, changed, f"a/{self.file}", f"b/{self.file}"))


@dataclass(frozen=True)
class Mutant:
    name: str
    surface: str
    file: str  # relative to site-packages
    line: str  # a substring of exactly one line of the file
    old: str  # the expression in that line the mutant replaces
    new: str
    bug: str  # the isolation bug it reintroduces, in one line
    twin: Form | None = None  # the same regression in the line as the fix series leaves it

    def form(self, site: Path) -> Form:
        """The form that fits the install at `site`: the twin form where its line is found, else the line as Hermes
        ships it; MutantError naming why each does not fit."""
        shipped = Form(self.file, self.line, self.old, self.new)
        whys = []
        for form in (self.twin, shipped) if self.twin else (shipped,):
            try:
                form.patch(site)
                return form
            except MutantError as exc:
                whys.append(str(exc))
        raise MutantError("; its twin form: ".join(reversed(whys)))

    def patch(self, site: Path) -> str:
        """The unified diff (paths a/FILE, b/FILE) that plants it in the install at `site`."""
        return self.form(site).patch(site)


def _home(name: str, surface: str, file: str, line: str, bug: str, twin: Form | None = None) -> Mutant:
    """A path of the profile's home (`get_hermes_home()` in `line`) taken from the launch profile's instead."""
    return Mutant(name, surface, file, line, "get_hermes_home()", LAUNCH, bug, twin)


#: The launch profile's `.env` as a dict, as an expression in Hermes' code.
LAUNCH_DOTENV = (f'dict(line.split("=", 1) for line in ({LAUNCH} / ".env").read_text().splitlines() '
                 'if "=" in line)')


def _launch_env(variable: str) -> str:
    """The launch profile's `.env` value of `variable`, as an expression in Hermes' code."""
    return f'{LAUNCH_DOTENV}.get("{variable}", "")'


MUTANTS: tuple[Mutant, ...] = (
    Mutant("profile-override", "profile selection", "hermes_cli/main.py", 'os.environ["HERMES_HOME"] = hermes_home',
           "hermes_home", f"str({LAUNCH})", "`-p NAME` is parsed but the process keeps the launch profile's home"),
    _home("memory-dir", "memory tool", "tools/memory_tool.py", 'return get_hermes_home() / "memories"',
          "the memory tool reads and writes the launch profile's MEMORY.md"),
    _home("skills-write", "skills", "tools/skill_manager_tool.py", 'return get_hermes_home() / "skills"',
          "skill_manage creates a profile's skills in the launch profile's skills/"),
    _home("skills-read", "skills", "tools/skills_tool.py", 'return get_hermes_home() / "skills"',
          "skills_list and skill_view list the launch profile's skills"),
    _home("process-checkpoint", "processes", "tools/process_registry.py",
          'CHECKPOINT_PATH = get_hermes_home() / "processes.json"',
          "background processes are checkpointed into the launch profile's processes.json (F17's shape)",
          Form("tools/process_registry.py", 'atomic_json_write(Path(home) / "processes.json", entries)',
               "Path(home)", LAUNCH)),
    _home("state-db", "sessions", "hermes_state.py", 'DEFAULT_DB_PATH = get_hermes_home() / "state.db"',
          "every profile's sessions and messages are stored in the launch profile's state.db"),
    Mutant("dotenv-load", "credentials", "hermes_cli/env_loader.py", 'user_env = home_path / ".env"', "home_path",
           LAUNCH, "the process loads the launch profile's .env: every key is the launch profile's (F1, F10)"),
    _home("config-path", "settings", "hermes_cli/config.py", 'return get_hermes_home() / "config.yaml"',
          "config.yaml is read from the launch profile: its model, provider, cwd and services (F3, F7)"),
    _home("soul", "prompt", "agent/prompt_builder.py", 'soul_path = get_hermes_home() / "SOUL.md"',
          "the system prompt carries the launch profile's SOUL.md"),
    Mutant("terminal-cwd", "terminal", "tools/terminal_tool.py", 'cwd = os.getenv("TERMINAL_CWD", default_cwd)',
           'os.getenv("TERMINAL_CWD", default_cwd)', 'os.path.expanduser("~")',
           "the terminal starts in the process's HOME instead of the profile's cwd (F2, F16's shape)",
           Form("tools/terminal_tool.py", 'cwd = bound_profile_cwd() or os.getenv("TERMINAL_CWD", default_cwd)',
                'bound_profile_cwd() or os.getenv("TERMINAL_CWD", default_cwd)', 'os.path.expanduser("~")')),
    _home("mem0-config", "memory provider", "plugins/memory/mem0/__init__.py",
          'config_path = get_hermes_home() / "mem0.json"',
          "the mem0 provider reads the launch profile's mem0.json: its user and agent ids (F12's shape)"),
    Mutant("mem0-key", "memory provider", "plugins/memory/mem0/__init__.py",
           '"api_key": os.environ.get("MEM0_API_KEY", ""),', 'os.environ.get("MEM0_API_KEY", "")',
           _launch_env("MEM0_API_KEY"), "the mem0 provider authenticates with the launch profile's key (F12)",
           Form("plugins/memory/mem0/__init__.py", '"api_key": get_secret("MEM0_API_KEY", ""),',
                'get_secret("MEM0_API_KEY", "")', _launch_env("MEM0_API_KEY"))),
    Mutant("web-key", "web search", "plugins/web/tavily/provider.py", 'api_key = get_provider_env("TAVILY_API_KEY")',
           'get_provider_env("TAVILY_API_KEY")', _launch_env("TAVILY_API_KEY"),
           "web search runs on the launch profile's Tavily account (F13)"),
    Mutant("aux-key", "auxiliary models", "agent/auxiliary_client.py",
           'cfg_api_key = os.getenv(cfg_key_env, "").strip() or None', "cfg_key_env", '"TENANT_PROVIDER_KEY"',
           "the auxiliary models are sent the main provider's key instead of their own key_env (F14's shape)",
           Form("agent/auxiliary_client.py", 'cfg_api_key = (_get_secret(cfg_key_env) or "").strip() or None',
                "_get_secret(cfg_key_env)", '_get_secret("TENANT_PROVIDER_KEY")')),
    _home("cron-scripts", "cron", "tools/cronjob_tools.py", 'scripts_dir = get_hermes_home() / "scripts"',
          "cron job scripts of every profile are kept in the launch profile's scripts/"),
    # The argument and configuration forms the battery drives (`drive.forms`, `services.aux`): their code runs only
    # with a relative path, a setting given at run time, a variable a profile passes to its scripts.
    Mutant("relative-path", "file tools", "tools/file_tools.py",
           "resolved = _resolve_base_dir(task_id, container_paths=False) / p",
           "_resolve_base_dir(task_id, container_paths=False)", '__import__("pathlib").Path.cwd()',
           "a relative path given to a file tool is resolved against the process's cwd, not the profile's"),
    Mutant("aux-runtime-model", "auxiliary models", "tools/vision_tools.py",
           'model = os.getenv("AUXILIARY_VISION_MODEL", "").strip() or None',
           'os.getenv("AUXILIARY_VISION_MODEL", "")', _launch_env("AUXILIARY_VISION_MODEL"),
           "the vision model a profile sets at run time (its environment) is taken from the launch profile's",
           Form("tools/vision_tools.py", 'model = _profile_env("AUXILIARY_VISION_MODEL") or None',
                '_profile_env("AUXILIARY_VISION_MODEL")', _launch_env("AUXILIARY_VISION_MODEL"))),
    Mutant("script-env", "code execution", "tools/code_execution_tool.py", "child_env = _scrub_child_env(os.environ)",
           "os.environ", f"{{**os.environ, **{LAUNCH_DOTENV}}}",
           "a script's environment is built over the launch profile's .env: what a profile passes through is the "
           "launch profile's",
           Form("tools/code_execution_tool.py", "child_env = _scrub_child_env(_with_profile_dotenv(dict(os.environ)))",
                "_with_profile_dotenv(dict(os.environ))", f"{{**os.environ, **{LAUNCH_DOTENV}}}")),
)

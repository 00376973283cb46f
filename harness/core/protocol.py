"""What the stubs, the addon and the detectors agree on: the flow header, probe markers, local probe paths
and the placeholder that stands for a redacted canary."""

from __future__ import annotations

import re

#: The addon stamps every request it forwards with the flow id; a stub request without it bypassed the proxy.
FLOW_HEADER = "x-tenancy-flow"
#: How the addon's error of a connection it refused before dialling begins (saved with the flow: a raw stream).
REFUSED_CONNECTION = "tenancy-audit: refused"
#: Paths Hermes probes to detect a local server; they are not provider calls.
LOCAL_PROBES = frozenset({"/api/tags", "/v1/props", "/props", "/version", "/api/v1/models"})
#: The lines that frame the environment probe's output in a tool result.
PROBE_BEGIN, PROBE_END = "SNAPSHOT-BEGIN", "SNAPSHOT-END"
#: The tool battery's groups of Hermes' own tools (`--tools`): the tools each group drives. `terminal` always
#: runs the env probe. Each service brings its own group besides (`harness.drive.services.TOOL_GROUPS`); the
#: coverage table reports every tool of the groups that ran.
TOOL_GROUPS: dict[str, tuple[str, ...]] = {
    "terminal": ("terminal", "process"),
    "memory": ("memory",),
    "skills": ("skill_manage", "skills_list", "skill_view"),
    "todo": ("todo",),
    "cronjob": ("cronjob",),
    "session_search": ("session_search",),
    "code": ("execute_code",),
    "delegate": ("delegate_task",),
    "files": ("write_file", "patch", "read_file", "search_files"),
    "projects": ("project_create", "project_list", "project_switch"),
    "terminals": ("close_terminal",),
}
_BROWSER = "needs a browser session on real web pages, and the sandbox has no network to browse"
#: Tools Hermes 0.19.0 offers that the battery does not drive, and why: the coverage table says `out of scope`
#: with the reason. docs/tools.md lists them; the e2e tests fail on an offered tool that is in neither the
#: battery nor this list, and on an entry no scenario offers any more (the list only shrinks).
OUT_OF_SCOPE: dict[str, str] = {
    **{f"browser_{name}": _BROWSER for name in ("back", "click", "console", "get_images", "press", "scroll",
                                                "vision")},
    "clarify": "asks the person at the terminal and waits for an answer; it reads and writes nothing of a profile",
    "text_to_speech": "its provider (edge by default) needs Microsoft's servers; no TTS stub yet (docs/services.md)",
    "read_terminal": "reads the desktop app's terminal pane; without the app it waits 30 s and reports none open",
}
#: What redaction leaves in place of a canary (`placeholder`); a redacted registry holds these instead of
#: the secrets.
PLACEHOLDER_PATTERN = r"<[a-z][a-z0-9_-]{0,31}:[a-z][a-z0-9_]{0,63}>"
PLACEHOLDER = re.compile(f"^{PLACEHOLDER_PATTERN}$")


def placeholder(tenant: str, kind: str) -> str:
    """`<tenant:kind>`: the text that replaces a redacted canary."""
    return f"<{tenant}:{kind}>"


#: What the drivers ask every tenant's Hermes: a stub runs its plan in the conversation that starts so.
PROMPT = "Run the environment probe for this tenant."
#: The battery's subagent task starts so: a stub answers that conversation with the env probe.
SUBAGENT_TASK = "Subagent of"


def probe_code() -> str:
    """The env probe as Python (for `execute_code`): the same lines as `probe_command` prints."""
    return (
        "import base64, os\n"
        "lines = sorted(f'{k}={v}' for k, v in os.environ.items())\n"
        f"print({PROBE_BEGIN!r})\n"
        "print('CWD=' + os.getcwd())\n"  # first: a tool that cuts long output still shows it
        "print('\\n'.join(lines))\n"
        "print('ENVB64=' + base64.b64encode(('\\n'.join(lines) + '\\n').encode()).decode())\n"
        f"print({PROBE_END!r})\n"
    )


def probe_command(shell_state: str) -> str:
    """Dump the env plainly and base64-encoded (Hermes masks secret-looking values as ***), then cwd;
    export the tenant's shell-state canary afterwards, so a shell reused by another tenant shows it."""
    return (
        f"echo {PROBE_BEGIN}; env | sort; echo ENVB64=$(env | sort | base64 -w0); echo CWD=$(pwd); "
        f"echo {PROBE_END}; export TENANT_SHELL_STATE={shell_state}"
    )

"""Which documented Hermes finding (the F-numbers of docs/hermes-findings.md) an incident is.

Each F-number has an incident signature: clauses over an incident's crossings (entry point, kind, canary kind,
scenario, phase, direction). An incident links to every F-number one of its crossings matches; one that matches
none is a new root cause. The table in docs/hermes-findings.md ("Incident signatures") is `text()` of these,
line by line (a test keeps them equal).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from harness.core.findings import Finding
from harness.detect.incidents import Incident

#: Hermes' launch profile: its home is HOME/.hermes, every other profile's is under its `profiles/`.
LAUNCH = "default"
DIRECTIONS = ("", "launch -> other", "other -> launch")


@dataclass(frozen=True)
class Clause:
    """Crossings through one of `entries`, and of `kinds`, `canaries` (kinds), `scenarios`, `phases`, `direction` and
    `at` (locations: a failed step's is `DRIVER:PHASE`) when given (empty: any). Entries, canaries and locations are
    shell-style patterns."""

    entries: tuple[str, ...]
    kinds: tuple[str, ...] = ()
    canaries: tuple[str, ...] = ()
    scenarios: tuple[str, ...] = ()
    phases: tuple[str, ...] = ()
    direction: str = ""
    at: tuple[str, ...] = ()

    def matches(self, entry: str, f: Finding) -> bool:
        launch_victim, launch_recipient = f.victim == LAUNCH, f.seen_in == LAUNCH
        direction = {"": True, "launch -> other": launch_victim and not launch_recipient,
                     "other -> launch": launch_recipient and not launch_victim}[self.direction]
        return (any(fnmatchcase(entry, p) for p in self.entries) and direction
                and (not self.kinds or f.kind in self.kinds)
                and (not self.canaries or any(fnmatchcase(f.canary or "", p) for p in self.canaries))
                and (not self.scenarios or f.scenario in self.scenarios)
                and (not self.phases or f.phase in self.phases)
                and (not self.at or any(fnmatchcase(f.location, p) for p in self.at)))

    def text(self) -> str:
        """`ENTRY or ENTRY (KIND, KIND; canary CANARY, ...; in SCENARIO, ...; phase PHASE; DIRECTION; at LOCATION)`."""
        parts = [", ".join(self.kinds), "canary " + ", ".join(self.canaries) if self.canaries else "",
                 "in " + ", ".join(self.scenarios) if self.scenarios else "",
                 "phase " + ", ".join(self.phases) if self.phases else "", self.direction,
                 "at " + ", ".join(self.at) if self.at else ""]
        extra = "; ".join(p for p in parts if p)
        return " or ".join(self.entries) + (f" ({extra})" if extra else "")


#: The canaries a messaging platform's home channel is in (`<PLATFORM>_HOME_CHANNEL` in a profile's `.env`).
HOME_CHANNELS = ("mattermost_channel", "telegram_channel", "discord_channel", "slack_channel", "irc_channel",
                 "email_channel", "signal_group", "ntfy_topic")

SIGNATURES: dict[str, tuple[Clause, ...]] = {
    "F1": (Clause(("provider",), ("wrong_key", "wrong_model"), direction="launch -> other"),),
    "F2": (Clause(("tool terminal",), ("wrong_cwd",)), Clause(("tool terminal",), scenarios=("gateway",)),
           Clause(("request",), ("request_leak",), ("workdir*",))),
    "F3": (Clause(("rpc",), ("profile_bleed",)),
           Clause(("rpc",), ("text_leak",), ("model", "profile_name"), ("tui", "serve"), direction="launch -> other")),
    "F4": (Clause(("route",), ("route_auth",)),),
    "F5": (Clause(("file logs/*", "file state.db*", "file sessions/*"), ("file_leak",), direction="other -> launch"),),
    "F6": (Clause(("shortfall",), phases=("cron",)),),
    "F7": (Clause(("file",), ("profile_bleed",), direction="other -> launch"),
           Clause(("file .env", "file config.yaml"), ("file_leak",), direction="other -> launch")),
    "F8": (Clause(("tool session_search",)),),
    "F9": (Clause(("tool process",)),),
    "F10": (Clause(("tool terminal",), ("env_leak",), scenarios=("tui", "serve")),),
    "F11": (Clause(("service mcp", "service mcp_stdio", "tool mcp__*")),),
    "F12": (Clause(("service memory",), ("wrong_key", "wrong_identity"), direction="launch -> other"),),
    "F13": (Clause(("service web", "tool web_*")),),
    "F14": (Clause(("service aux",), ("wrong_key", "wrong_identity"), direction="launch -> other"),),
    "F15": (Clause(("service delegation",), direction="launch -> other"),
            Clause(("request",), ("request_leak",), ("skill_*",), direction="launch -> other"),
            Clause(("tool delegate_task", "request"), ("request_leak",), ("delegation_model",),
                   direction="launch -> other")),
    "F16": (Clause(("tool execute_code",), ("wrong_path", "env_leak"), direction="launch -> other"),),
    "F17": (Clause(("file processes.json",), ("file_leak",), direction="other -> launch"),),
    "F18": (Clause(("conversation",), scenarios=("api_server",)),
            Clause(("request",), ("request_leak",), scenarios=("api_server",), phases=("lookups",)),
            Clause(("rpc",), ("text_leak",), scenarios=("api_server",), phases=("lookups",)),
            Clause(("file response_store.db*",), ("file_leak",)),
            Clause(("run",), ("profile_bleed",), ("run_control",), scenarios=("api_server",))),
    "F19": (Clause(("approval",), ("profile_bleed",)),),
    "F20": (Clause(("service supermemory",), ("wrong_key", "wrong_identity"), direction="launch -> other"),),
    "F21": (Clause(("service honcho", "tool honcho_*")), Clause(("request",), ("request_leak",), ("honcho_*",))),
    "F22": (Clause(("service hindsight",), ("wrong_key", "wrong_identity"), direction="launch -> other"),),
    "F23": (Clause(("service browser", "tool browser_*")),),
    "F24": (Clause(("service mattermost",), ("profile_bleed",), ("allowed_channels",)),),
    "F25": (Clause(("service mattermost", "service signal", "service telegram", "service slack", "service email",
                    "service irc"),
                   ("profile_bleed",), ("allowed_users",)),
            Clause(("service ntfy",), ("profile_bleed",), ("allowed_users", "allowed_channels")),
            Clause(("shortfall",), phases=("messaging",)),
            Clause(("service memory", "service aux", "service web"), ("wrong_key", "wrong_identity"),
                   scenarios=("gateway",), phases=("messaging",))),
    "F26": (Clause(("redaction",), ("profile_bleed",), direction="launch -> other"),),
    "F27": (Clause(("tool skill_manage", "tool skills_list", "tool skill_view")),
            Clause(("service delegation",), ("request_leak",), ("skill_*",), direction="other -> launch")),
    "F28": (Clause(("tool cronjob",), ("request_leak",)),),
    "F29": (Clause(("tool execute_code",), ("wrong_cwd",), scenarios=("oneshot",)),),
    "F30": (Clause(("service aux",), ("wrong_key",), scenarios=("oneshot",)),),
    "F31": (Clause(("service mattermost", "service signal", "service telegram", "service slack_issued",
                    "service email", "service discord"), ("request_leak",)),),
    "F33": (Clause(("route dashboard",), ("route_auth",)),),
    "F34": (Clause(("kanban board",), ("profile_bleed",)),),
    "F35": (Clause(("toolsets",), ("profile_bleed",), direction="launch -> other"),),
    "F36": (Clause(("shortfall",), phases=("messaging",), at=("telegram:*",)),),
    "F40": (Clause(("service signal",), ("profile_bleed",), ("allowed_channels",)),),
    "F41": (Clause(("service signal",), ("profile_bleed",), ("reactions",)),),
    "F42": (Clause(("service signal",), ("wrong_key",), ("signal_account",)),),
    "F43": (Clause(("service slack",), ("profile_bleed",), ("allowed_channels",)),),
    "F47": (Clause(("service discord",), ("profile_bleed",), ("allowed_users",)),
            Clause(("shortfall",), phases=("messaging",), at=("discord:*",))),
    "F48": (Clause(("service discord",), ("profile_bleed",), ("allowed_channels",)),),
    "F51": (Clause(("shortfall",), phases=("messaging-connect:email",)),),
    "F52": (Clause(("shortfall",), phases=("messaging-connect:irc",)),),
    "F53": (Clause(("service email",), ("profile_bleed",), ("message",)),
            Clause(("shortfall",), phases=("messaging",), at=("email:*",))),
    "F55": (Clause(("shortfall",), phases=("messaging-connect:ntfy",)),),
    "F56": (Clause(("service ntfy",), ("wrong_key",), direction="other -> launch"),),
    "F58": (Clause(("service *",), ("profile_bleed",), ("*_fallback",)),),
    "F59": (Clause(("service aux",), ("request_leak",), direction="other -> launch"),),
    "F60": (Clause(("request",), ("request_leak",), ("soul", "memory", "tool_memory", "derived_memory*"),
                   ("tui", "serve"), ("resume",), "launch -> other"),
            Clause(("rpc",), ("text_leak",), ("soul", "memory", "tool_memory", "derived_memory*"),
                   ("tui", "serve"), ("generated",), "launch -> other")),
    "F61": (Clause(("tool read_file", "tool write_file", "tool patch", "tool search_files"), ("wrong_path",)),),
    "F62": (Clause(("webhook",), ("profile_bleed",), ("webhook_route", "webhook_channel")),
            Clause(("request", "file *"), ("request_leak", "file_leak"), ("webhook_payload*",))),
    "F63": (Clause(("webhook",), ("profile_bleed",), ("webhook_bot",)),
            Clause(("service *",), ("wrong_identity", "request_leak", "response_leak"), phases=("webhooks",),
                   direction="other -> launch"),
            Clause(("shortfall",), phases=("webhooks",))),
    "F64": (Clause(("webhook",), ("profile_bleed",), ("webhook_borrowed_bot",)),
            Clause(("service *",), ("wrong_identity", "request_leak", "response_leak"), phases=("webhooks",),
                   direction="launch -> other")),
    "F65": (Clause(("request",), ("request_leak",), HOME_CHANNELS, ("gateway",), direction="launch -> other"),),
}


def text(number: str) -> str:
    """An F-number's signature as docs/hermes-findings.md writes it: each clause in backticks, `or` between them."""
    return " or ".join(f"`{c.text()}`" for c in SIGNATURES[number])


def documented(incident: Incident) -> list[str]:
    """The F-numbers whose signature one of the incident's crossings matches ([]: a new root cause)."""
    return [n for n, clauses in SIGNATURES.items()
            if any(c.matches(incident.entry, f) for f in incident.crossings for c in clauses)]

"""The stdio JSON-RPC backend of Hermes' terminal UI (`tui_gateway.entry`): one process, every profile's
sessions (`session.create {profile}`); the multi-profile phases of `rpc_doors`."""

from __future__ import annotations

from harness.drive.context import Context
from harness.drive.doors.base import Door
from harness.drive.doors.rpc_doors import drive_rpc
from harness.drive.doors.tui_client import TuiBackend


def tui(ctx: Context) -> None:
    log = ctx.rpc_log("tui")
    drive_rpc(ctx, lambda: TuiBackend(ctx.hermes, log, ctx.out / "logs" / "backend-tui.log").start(), "tui", cron=False)


DOOR = Door("tui", "the stdio JSON-RPC backend (tui_gateway), one process for every profile", rank=20, drive=tui,
            needs=(("tui", "no per-profile sessions in the tui backend (tui_gateway session.create profile)"),))

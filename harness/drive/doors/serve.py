"""`hermes serve`: the websocket JSON-RPC backend, one process for every profile; the multi-profile phases of
`rpc_doors`, the cron ticker among them (`--phases cron`)."""

from __future__ import annotations

from harness.drive.context import Context
from harness.drive.doors.base import Door
from harness.drive.doors.rpc_doors import drive_rpc
from harness.drive.doors.serve_client import ServeBackend


def serve(ctx: Context) -> None:
    log = ctx.rpc_log("serve")
    drive_rpc(ctx, lambda: ServeBackend(ctx.hermes, log, ctx.out / "logs" / "backend-serve.log").start(), "serve",
              cron=True)


DOOR = Door("serve", "`hermes serve`, the websocket JSON-RPC backend for every profile", rank=30, drive=serve,
            needs=(("serve", "no `hermes serve`"),))

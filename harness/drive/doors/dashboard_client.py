"""The client for `hermes dashboard` (Hermes' web administration UI, one process for every profile) on loopback:
started with a session token of the harness's choosing, its route table read from the install itself, and one
request or websocket handshake at a time with whatever credential the caller gives."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.procs import Stdio, stop_tree
from harness.drive.hermes.agent import Hermes
from harness.drive.hermes.rpc import BackendError, announced_port

#: Hermes' dashboard reads its session token from here (`hermes_cli/web_server.py`: `_SESSION_TOKEN`).
TOKEN_ENV = "HERMES_DASHBOARD_SESSION_TOKEN"
#: The header the dashboard's SPA sends the token in (`_SESSION_HEADER_NAME`); `Authorization: Bearer` also works.
TOKEN_HEADER = "X-Hermes-Session-Token"

#: One child prints the dashboard app's route table: every route, those of the routers it includes (plugins,
#: login) with their prefix, each HTTP route with its methods and whether its handler takes a `profile` query
#: parameter, and every websocket (each reads its query itself).
_ROUTES = """
import json, os
report = os.fdopen(os.dup(1), "w")
from starlette.routing import WebSocketRoute
from hermes_cli.web_server import app
def walk(routes, prefix):
    for r in routes:
        inner = getattr(r, "original_router", None)
        if inner is not None:
            yield from walk(inner.routes, prefix + r.include_context.prefix)
        elif hasattr(r, "path"):
            yield r, prefix + r.path
def profiled(r):
    return any(q.name == "profile" for q in getattr(getattr(r, "dependant", None), "query_params", ()))
rows = [{"path": p, "ws": isinstance(r, WebSocketRoute), "methods": sorted(getattr(r, "methods", None) or []),
         "profile": isinstance(r, WebSocketRoute) or profiled(r)} for r, p in walk(app.routes, "")]
print(json.dumps(rows), file=report, flush=True)
os._exit(0)
"""


@dataclass(frozen=True)
class Route:
    """One route of the dashboard: its path template, whether it is a websocket, and whether it answers per
    profile (`?profile=NAME`; every websocket may)."""

    path: str
    ws: bool = False
    profiled: bool = True

    def concrete(self, fill: str = "tenancy") -> str:
        """The path with every parameter (`{id}`, `{rest:path}`) filled."""
        return re.sub(r"\{[^}]+\}", fill, self.path)


def data_routes(rows: list[dict[str, Any]]) -> list[Route]:
    """The routes that can answer with data: every HTTP route that takes GET, and every websocket (a mount of
    static files, the SPA's assets, is neither)."""
    seen: dict[str, Route] = {}
    for row in rows:
        if row["ws"] or "GET" in row["methods"]:
            seen.setdefault(row["path"], Route(row["path"], bool(row["ws"]), bool(row["profile"])))
    return list(seen.values())


class DashboardBackend:
    """`hermes dashboard --no-open --skip-build --host 127.0.0.1 --port 0` with a session token the harness
    knows."""

    READY = re.compile(r"HERMES_DASHBOARD_READY port=(\d+)")

    def __init__(self, hermes: Hermes, log_path: Path) -> None:
        self.hermes, self.log_path = hermes, log_path
        self.token = secrets.token_urlsafe(32)
        self.port = 0
        self.proc: subprocess.Popen[Any] | None = None

    def start(self, timeout: float = 90.0) -> DashboardBackend:
        self._out = self.log_path.open("a", encoding="utf-8", errors="replace")
        self.proc = self.hermes.procs.spawn(
            [str(self.hermes.python), "-m", "hermes_cli.main", "dashboard", "--no-open", "--skip-build",
             "--host", "127.0.0.1", "--port", "0"],
            env=self.hermes.env({TOKEN_ENV: self.token}), cwd=self.hermes.sandbox.home,
            stdio=Stdio(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
        )
        self.port = announced_port(self.proc, self._out, self.READY, "hermes dashboard", timeout)
        return self

    def routes(self) -> list[Route]:
        """The data routes of the install's dashboard app, read from its route table."""
        rc, out, err = self.hermes.procs.run([str(self.hermes.python), "-c", _ROUTES], env=self.hermes.env(),
                                             cwd=self.hermes.sandbox.home, timeout=120)
        try:
            rows = json.loads(out.strip().splitlines()[-1]) if rc == 0 else None
        except (IndexError, ValueError):
            rows = None
        if not rows:
            last = (err.strip().splitlines() or ["no output"])[-1]
            raise BackendError(f"cannot read the dashboard's route table (rc={rc}): {last[:200]}")
        return data_routes(rows)

    def get(self, path: str, headers: dict[str, str], timeout: float = 30.0) -> tuple[int, str]:
        """(status, body) of one GET; status 0 when the connection failed."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode("utf-8", "replace")
        except OSError as exc:
            return 0, f"{type(exc).__name__}: {exc}"

    def handshake(self, path: str, headers: dict[str, str], host: str = "", timeout: float = 10.0) -> tuple[int, str]:
        """A websocket upgrade (as if to `host`, with its Origin, when given), closed at once: (101, the first frame
        if one came within a second) when the server accepted it, else (the HTTP status it answered, its body); 0
        when the connection failed."""
        import socket

        from websockets.exceptions import InvalidStatus
        from websockets.sync.client import connect

        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        except OSError as exc:
            return 0, f"{type(exc).__name__}: {exc}"
        try:
            ws = connect(f"ws://{host or '127.0.0.1'}:{self.port}{path}", sock=sock, proxy=None,
                         origin=f"http://{host}" if host else None,  # type: ignore[arg-type]
                         additional_headers=headers, open_timeout=timeout)
        except InvalidStatus as exc:
            sock.close()
            body = exc.response.body or b""
            return exc.response.status_code, body.decode("utf-8", "replace")
        except Exception as exc:  # refused, reset, timed out or unparsable: not an accepted socket
            sock.close()
            return 0, f"{type(exc).__name__}: {exc}"
        try:
            first = ws.recv(timeout=1.0)
        except Exception:
            first = ""
        finally:
            ws.close()
        return 101, first if isinstance(first, str) else first.decode("utf-8", "replace")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def close(self) -> None:
        """Stop it, killed after 5 s: a websocket it accepted keeps uvicorn's graceful shutdown waiting (0.19.0's
        kanban events handler only sends, so it never sees its client leave: 41 s by hand), and a dashboard that
        ran no turn has nothing to finish."""
        if self.proc is None:
            return
        stop_tree(self.proc, grace=5.0)
        self._out.close()

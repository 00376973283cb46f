"""The `dashboard` front door: `hermes dashboard`, the install's web administration UI, one process on loopback
for every profile (`?profile=NAME` scopes a request to a profile).

Phase `route-auth` (the door's only one): every data route of the install's own route table (every route that
takes GET, every websocket), for every profile when its handler takes one (once, for the launch profile, when
not), is asked
- with no credential, with a wrong token of the session token's shape, and with the session token from a
  foreign `Host` (a DNS-rebinding page: Hermes' `host_header_middleware` must refuse it);
- with every credential a tenant holds (its provider key, API-server key and services' keys), each sent as the
  session token header, as a bearer token and as `?token=` at once.
A canary in any of those answers, of any tenant but the credential's holder, is a `route_auth` finding (entry
point `route dashboard`). Its recipient is nobody (`seen_in` None): an answer reaches the dashboard's caller, not
a tenant's Hermes, whatever credential it sent (the detail names it); so it explains no copy in a tenant's files
or requests, which stay crossings of their own. Each answer goes whole to the RPC log, nobody's too, where the
reconciler finds every secret in it again.

The near miss: the same routes with the session token. One token opens every profile by design in Hermes
0.19.0, so what it reads is the operator's, never reported: its answers are logged as the canaries they carried
(placeholders), and every tenant's data among them is the probe's positive control (a tenant none of them
carried is a failed step: a probe that reads nothing proves nothing). Websockets are not opened with it (an
accepted `/api/pty` starts a chat process).
"""

from __future__ import annotations

import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlencode

from harness.core.findings import Finding
from harness.core.protocol import placeholder
from harness.detect.engine.stream import DEFAULT_LIMITS, ScanHit, scan_bytes
from harness.drive.context import Context
from harness.drive.doors.base import Door
from harness.drive.doors.dashboard_client import TOKEN_HEADER, DashboardBackend, Route
from harness.drive.hermes.agent import TurnResult

PHASE = "route-auth"
#: The label of the RPC log and of a finding's location (`dashboard:GET /api/...`).
LABEL = "dashboard"
#: A Host no loopback dashboard may answer: what a DNS-rebinding page sends.
FOREIGN_HOST = "tenancy-rebinding.invalid"


@dataclass(frozen=True)
class Credential:
    """What one request carries: `label` names it in the log and in findings, `owner` is the tenant holding it
    (None: nobody's), `authorized` only for the session token from the dashboard's own host."""

    label: str
    owner: str | None
    token: str = ""
    host: str = ""
    authorized: bool = False

    def headers(self, ws: bool = False) -> dict[str, str]:
        """The token headers, and (HTTP: a websocket is opened to the host itself) the foreign Host and Origin."""
        sent = {TOKEN_HEADER: self.token, "Authorization": f"Bearer {self.token}"} if self.token else {}
        return {**sent, **({"Host": self.host, "Origin": f"http://{self.host}"} if self.host and not ws else {})}

    def query(self, profile: str) -> str:
        asked = {"profile": profile, **({"token": self.token} if self.token and not self.authorized else {})}
        return "?" + urlencode(asked)


def credentials(ctx: Context, session_token: str) -> list[Credential]:
    """No credential, every credential each tenant holds, a wrong token, the session token from a foreign host,
    and the session token itself (the near miss)."""
    held = [Credential(placeholder(t.name, kind), t.name, value) for t in ctx.registry
            for kind, value in sorted(t.secrets().items())]
    return [Credential("no credential", None), *held,
            Credential("a wrong token", None, secrets.token_urlsafe(len(session_token) * 3 // 4)),
            Credential("the session token from a foreign host", None, session_token, FOREIGN_HOST),
            Credential("the session token", None, session_token, authorized=True)]


@dataclass
class Answer:
    """One request and what the dashboard answered."""

    route: Route
    profile: str
    credential: Credential
    status: int = 0
    body: str = ""
    where: str = field(init=False, default="")

    def __post_init__(self) -> None:
        self.where = f"{'WS' if self.route.ws else 'GET'} {self.route.concrete()}?profile={self.profile}"


def _ask(dash: DashboardBackend, a: Answer) -> Answer:
    path = a.route.concrete() + a.credential.query(a.profile)
    if a.route.ws:
        a.status, a.body = dash.handshake(path, a.credential.headers(ws=True), a.credential.host)
    else:
        a.status, a.body = dash.get(path, a.credential.headers())
    return a


class Hits:
    """Every canary of every tenant in an answer's body (secret or not: unlike a log line, nothing a request
    reads is its by default), each distinct body scanned once (most routes answer every credential alike)."""

    def __init__(self, ctx: Context) -> None:
        self.matcher = ctx.matcher()
        self._seen: dict[str, list[ScanHit]] = {}

    def __call__(self, a: Answer) -> list[ScanHit]:
        if a.body not in self._seen:
            data = a.body.encode("utf-8", "surrogateescape")
            self._seen[a.body] = scan_bytes(data, self.matcher, limits=DEFAULT_LIMITS)
        return self._seen[a.body]


def _judge(ctx: Context, a: Answer, hits: list[ScanHit]) -> list[Finding]:
    """What an answer to a request without the session token (or from a foreign host) gave away: a canary of a
    tenant other than the credential's, or a websocket opened without the session token at all (it serves every
    profile). A socket the session token opened from a foreign host is only said: the token is what such a page
    cannot get (the Host check keeps from it the SPA page that holds the token)."""
    found = [Finding("route_auth", h.tenant, None, h.kind, "response", f"{LABEL}:{a.where}",
                     h.encoding, f"{a.credential.label} -> HTTP {a.status}", scenario=ctx.scenario, phase=PHASE,
                     detail=f"{a.credential.label} read {h.tenant}'s {h.kind} from the dashboard's "
                            f"{a.route.path} (profile {a.profile})")
             for h in hits if h.tenant != a.credential.owner]
    if a.route.ws and a.status == 101 and not a.credential.host:
        found.append(Finding("route_auth", ctx.sandbox.launch, None, None, "response",
                             f"{LABEL}:{a.where}", evidence=f"{a.credential.label} -> HTTP 101", scenario=ctx.scenario,
                             phase=PHASE, detail=f"{a.credential.label} opened the dashboard's {a.route.path}"))
    return found


def probe(ctx: Context, dash: DashboardBackend, routes: list[Route]) -> None:
    """Every route, for every profile, with every credential; findings, the RPC log and the positive control."""
    log = ctx.rpc_log(LABEL)
    started = time.monotonic()
    names = ctx.registry.names()
    asks = [Answer(r, p, c) for r in routes for p in (names if r.profiled else [ctx.sandbox.launch])
            for c in credentials(ctx, dash.token) if not (r.ws and c.authorized)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda a: _ask(dash, a), asks))
    asked = time.monotonic() - started
    hits = Hits(ctx)
    found: dict[tuple[object, ...], Finding] = {}
    seen: set[tuple[str, str]] = set()
    failed = [a for a in answers if a.status == 0]
    for a in answers:
        log.write("out", None, {"request": a.where, "credential": a.credential.label})
        if a.credential.authorized:
            carried = {(h.tenant, h.kind) for h in hits(a)}
            seen |= carried
            log.write("in", None, {"request": a.where, "status": a.status, "bytes": len(a.body),
                                   "carried": sorted(placeholder(t, k) for t, k in carried)})
            continue
        log.write("in", None, {"request": a.where, "status": a.status, "body": a.body})
        for f in _judge(ctx, a, hits(a)):
            found.setdefault(f.identity(), f)
    ctx.findings += found.values()
    for path in sorted({a.route.path for a in answers if a.route.ws and a.status == 101 and a.credential.host}):
        ctx.say(f"  dashboard: the session token from a foreign host opened {path} (no Host/Origin check there)")
    seconds = time.monotonic() - started
    ctx.say(f"  dashboard: {len(answers)} requests on {len(routes)} routes in {asked:.1f}s, judged in "
            f"{seconds - asked:.1f}s: {len(found)} route_auth finding(s)")
    for t in ctx.registry.names():
        ok = any(owner == t for owner, _ in seen) and not failed
        detail = ("" if ok else f"{len(failed)} request(s) got no answer, the first {failed[0].where}" if failed
                  else "no answer to the session token carried its data")
        ctx.record(TurnResult(t, LABEL, ok, seconds, detail), PHASE, snapshot=False)


def dashboard(ctx: Context) -> None:
    """The dashboard's one phase (always: it is what the door does)."""
    ctx.rpc_log(LABEL)
    dash = DashboardBackend(ctx.hermes, ctx.out / "logs" / "backend-dashboard.log")
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:  # the route table is read while the dashboard starts
            table = pool.submit(dash.routes)
            dash.start()
            routes = table.result()
        with ctx.phase(PHASE):
            probe(ctx, dash, routes)
    finally:
        dash.close()


DOOR = Door("dashboard", "`hermes dashboard`, the web administration UI of every profile: every data route "
            "without its session token, with each tenant's credentials and from a foreign host", rank=60,
            drive=dashboard, backend=False,
            needs=(("dashboard", "no web dashboard that says the port it bound (hermes dashboard --port 0)"),))

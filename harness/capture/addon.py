"""The tenancy addon: route, attribute, record and flag every tenant flow of a tenancy audit.

Thin glue over `harness.detect.flows` (the detection core the offline reconciler uses too). A flow with a
finding is marked, commented, logged at WARNING and carries its findings in `flow.metadata["tenancy"]`;
every flow is one line of the JSONL ledger. `addons/tenancy.py` is the file users pass to `mitmdump -s`;
see docs/addon.md.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import mitmproxy.types
import orjson
from mitmproxy import command, contentviews, ctx, exceptions, http
from mitmproxy.log import ALERT

from harness.capture.contentview import TenancyContentview
from harness.core import registry
from harness.core.files import write_private
from harness.core.findings import Finding
from harness.core.protocol import FLOW_HEADER
from harness.detect import flows
from harness.detect.engine.matcher import Matcher, matcher_for

log = logging.getLogger("tenancy")
EGRESS_CHOICES = ("flag", "block")
MARK = ":warning:"


class _StreamTap:
    """`response.stream` for SSE: every chunk goes to the client at once; a copy is kept for inspection."""

    def __init__(self) -> None:
        self.data = bytearray()

    def __call__(self, chunk: bytes) -> bytes:
        self.data += chunk
        return chunk


class Tenancy:
    """The tenancy addon. `script` is True for the instance `addons/tenancy.py` gives `mitmdump -s`: a bad
    `tenancy_registry` at startup is then one error line (mitmproxy exits on it) instead of the traceback
    mitmproxy prints for any exception a script raises; later `--set`s are rejected with OptionsError."""

    def __init__(self, *, script: bool = False) -> None:
        self.script = script
        self._running = False
        self.registry: registry.Registry | None = None
        self.matcher: Matcher | None = None
        self.findings: list[Finding] = []
        self.ledger: IO[bytes] | None = None
        self._ledger_failed = False  # once a line could not be written, nothing more is recorded
        self._stamp: tuple[int, int, int] | None = None
        self._path = Path()  # the registry file, once loaded
        #: The audit's current (scenario, phase), read from `tenancy_phase_file` when it changes.
        self._label: tuple[str | None, str | None] = (None, None)
        self._label_stamp: tuple[int, int, int] | None = None
        self._foreign_ports: set[int] = set()  # reverse listeners of no tenant, warned about once each
        #: The report of every request in flight, reused by `_finish` while the request is unchanged.
        self._inflight: dict[str, tuple[_RequestState, flows.RequestReport]] = {}

    def load(self, loader: Any) -> None:
        contentviews.add(TenancyContentview(lambda: self.matcher))
        loader.add_option(
            "tenancy_registry", str | None, None,
            "Path to the tenancy registry (registry.yaml): tenants, keys, models, routes, canaries.",
        )
        loader.add_option(
            "tenancy_ledger", str | None, None,
            "Append one JSON line per flow to this file (mode 0600); the proxy stops if it cannot be written.",
        )
        loader.add_option(
            "tenancy_egress", str, "flag",
            "What to do with a forward-mode request to a host no tenant owns: flag it, or block it with 403.",
            choices=EGRESS_CHOICES,
        )
        loader.add_option(
            "tenancy_phase_file", str | None, None,
            'A JSON file {"scenario": ..., "phase": ...} naming the audit\'s current phase; findings are labelled '
            "with it, so their fingerprints match the audit's (the harness writes it).",
        )

    def configure(self, updated: set[str]) -> None:
        if "tenancy_egress" in updated and ctx.options.tenancy_egress not in EGRESS_CHOICES:
            raise exceptions.OptionsError(
                f"tenancy_egress must be one of {', '.join(EGRESS_CHOICES)}, not {ctx.options.tenancy_egress!r}"
            )
        if "tenancy_registry" in updated:
            path = ctx.options.tenancy_registry
            if path:
                try:
                    self._load_registry(Path(path))
                except registry.RegistryError as exc:
                    if not (self.script and not self._running):
                        raise exceptions.OptionsError(f"tenancy_registry: {exc}") from None
                    log.error(f"tenancy: tenancy_registry: {exc}")  # at startup: mitmproxy exits on an error line
                    self.registry = self.matcher = self._stamp = None
                eager = getattr(ctx.options, "connection_strategy", "lazy") == "eager"
                if eager and any(t.host for t in self.registry or []):
                    log.warning("tenancy: forward tenants need --set connection_strategy=lazy "
                                "(their hostnames exist only inside the proxy)")
            else:
                self.registry = self.matcher = self._stamp = None
        if "tenancy_ledger" in updated:
            if self.ledger:
                self.ledger.close()
                self.ledger = None
            self._ledger_failed = False
            path = ctx.options.tenancy_ledger
            if path:
                try:
                    fd = os.open(os.path.expanduser(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                    self.ledger = os.fdopen(fd, "ab", buffering=0)  # a failed line is never left in a buffer
                except OSError as exc:
                    raise exceptions.OptionsError(f"tenancy_ledger: cannot open {path}: {exc.strerror}") from None

        if "tenancy_phase_file" in updated:
            self._label, self._label_stamp = (None, None), None

    def running(self) -> None:
        self._running = True

    def done(self) -> None:
        if self.ledger:
            self.ledger.close()
            self.ledger = None

    def _load_registry(self, path: Path) -> None:
        stamp = _stamp(path)
        reg = registry.load(path)
        self.registry, self.matcher, self._stamp = reg, matcher_for(reg), stamp
        self._path = path

    def _maybe_reload(self) -> None:
        """Pick up canaries minted mid-scenario; a broken new version keeps the old one in force."""
        path = self._path
        stamp = _stamp(path)
        if stamp == self._stamp:
            return
        try:
            self._load_registry(path)
            log.info(f"tenancy: reloaded registry {path}")
        except registry.RegistryError as exc:
            self._stamp = stamp
            log.error(f"tenancy: keeping the previous registry: {exc}")

    def _current_label(self) -> tuple[str | None, str | None]:
        """(scenario, phase) from `tenancy_phase_file` (re-read when it changes), or (None, None)."""
        path = ctx.options.tenancy_phase_file
        if not path:
            return None, None
        stamp = _stamp(Path(path))
        if stamp != self._label_stamp:
            self._label_stamp = stamp
            try:
                doc = json.loads(Path(path).read_bytes()) if stamp else {}
                self._label = (doc.get("scenario"), doc.get("phase"))
            except (OSError, ValueError, AttributeError) as exc:
                log.error(f"tenancy: cannot read the phase file {path}: {exc}")
                self._label = (None, None)
        return self._label

    def _stamp_label(self, flow: http.HTTPFlow) -> None:
        scenario, phase = self._current_label()
        flow.metadata["tenancy"].update(scenario=scenario, phase=phase)

    def http_connect(self, flow: http.HTTPFlow) -> None:
        """Block a CONNECT to a host no tenant owns before anything is dialled (when egress is `block`)."""
        if self.registry is None or ctx.options.tenancy_egress != "block":
            return
        self._maybe_reload()
        if flows.tenant_for(self.registry, host=flow.request.pretty_host) is None:
            self._block(flow)
            self._finish(flow)

    def request(self, flow: http.HTTPFlow) -> None:
        if self.registry is None or self.matcher is None or flow.response or flow.error:
            return
        self._maybe_reload()
        route = flows.route_of(flow)
        tenant, service = flows.endpoint_for(self.registry, listen_port=route.listen_port, host=route.host)
        if tenant is None and route.topology == "reverse" and route.listen_port not in self._foreign_ports:
            self._foreign_ports.add(route.listen_port)
            log.warning(f"tenancy: listener port {route.listen_port} belongs to no tenant of {self._path}: its flows "
                        "are recorded, not inspected (add `route: {listen: PORT}` to a tenant to audit them)")
        if route.topology == "forward":
            if tenant is None and ctx.options.tenancy_egress == "block":
                self._block(flow)
            elif tenant is not None and (upstream := tenant.upstream_of(service)):
                _route_to(flow.request, upstream)
        flow.request.headers[FLOW_HEADER] = flow.id  # a stub request without it bypassed the proxy
        report = flows.inspect_flow_request(self.registry, self.matcher, flow, route)
        self._inflight[flow.id] = (_request_state(flow, self.matcher), report)
        flow.metadata["tenancy"] = {"tenant": report.tenant, "route": report.route, "kind": report.kind}
        self._stamp_label(flow)
        if report.findings:
            flow.marked = MARK

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if self.registry is None or flow.response is None or flow.response.stream:
            return
        if "text/event-stream" in flow.response.headers.get("content-type", "").lower():
            flow.response.stream = _StreamTap()

    def response(self, flow: http.HTTPFlow) -> None:
        self._finish(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._finish(flow)

    def _finish(self, flow: http.HTTPFlow) -> None:
        inflight = self._inflight.pop(flow.id, None)
        if self.registry is None or self.matcher is None or "tenancy" not in flow.metadata:
            return
        if flow.response is not None and isinstance(flow.response.stream, _StreamTap):
            flow.response.data.content = bytes(flow.response.stream.data)  # saved flows keep the stream
            flow.response.stream = False
        known = inflight[1] if inflight and inflight[0] == _request_state(flow, self.matcher) else None
        report = flows.inspect_flow(self.registry, self.matcher, flow, request=known)
        report.label(flow.metadata["tenancy"].get("scenario"), flow.metadata["tenancy"].get("phase"))
        entry = report.ledger_entry()
        flow.metadata["tenancy"] = {k: v for k, v in entry.items() if k not in ("time", "flow")}
        if report.findings:
            self.findings += report.findings
            flow.marked = MARK
            first = report.findings[0].summary()
            more = f" (+{len(report.findings) - 1} more)" if len(report.findings) > 1 else ""
            flow.comment = f"tenancy: {first}{more}"
            for finding in report.findings:
                log.warning(f"tenancy: {finding.summary()}")
        self._record(flow, entry)

    def _record(self, flow: http.HTTPFlow, entry: dict[str, Any]) -> None:
        """Fail closed: once a flow cannot be recorded, it and every later flow are killed (nothing more is
        written, so a torn line stays the ledger's last) and the proxy shuts down."""
        if self.ledger is None:
            return
        if not self._ledger_failed:
            line = _ledger_line(entry)
            try:
                if self.ledger.write(line) != len(line):
                    raise OSError(f"short write ({len(line)} bytes)")
            except (OSError, ValueError) as exc:
                self._ledger_failed = True
                log.error(f"tenancy: cannot write the ledger {ctx.options.tenancy_ledger}: {exc}; shutting down")
                ctx.master.shutdown()
        if self._ledger_failed and flow.killable:
            flow.kill()

    def _block(self, flow: http.HTTPFlow) -> None:
        host = flow.request.pretty_host
        flow.metadata["tenancy"] = {"tenant": None, "route": f"host:{host}", "kind": "egress"}
        self._stamp_label(flow)
        flow.response = http.Response.make(
            403, f"tenancy-audit: egress to {host} blocked\n", {"content-type": "text/plain"}
        )

    @command.command("tenancy.findings")
    def findings_cmd(self) -> Sequence[str]:
        """The findings of this session so far, one summary line each."""
        lines = [f.summary() for f in self.findings]
        logging.log(ALERT, f"tenancy: {len(lines)} findings" + "".join(f"\n  {line}" for line in lines))
        return lines

    @command.command("tenancy.report")
    def report_cmd(self, path: mitmproxy.types.Path) -> None:
        """Write the findings of this session as JSON (mode 0600)."""
        doc = {"findings": [f.to_dict() for f in self.findings], "count": len(self.findings)}
        try:
            write_private(Path(os.path.expanduser(path)), json.dumps(doc, indent=2).encode() + b"\n")
        except OSError as exc:
            raise exceptions.CommandError(f"tenancy.report: cannot write {path}: {exc.strerror}") from None
        logging.log(ALERT, f"tenancy: wrote {len(self.findings)} findings to {path}")


_RequestState = tuple[Matcher, bytes | None, bytes, bytes, bytes, str, tuple[tuple[bytes, bytes], ...]]


def _request_state(flow: http.HTTPFlow, matcher: Matcher) -> _RequestState:
    """What a request report depends on: the matcher (a reloaded registry builds a new one), the body,
    method, path, host and headers. Comparing two states is cheap: the same body object is not read."""
    data = flow.request.data  # the raw fields: no decoding, no parsing (pretty_host would parse the Host)
    return matcher, data.content, data.method, data.path, data.authority, data.host, data.headers.fields


def _ledger_line(entry: dict[str, Any]) -> bytes:
    """One JSON line. orjson writes it where it can (five times faster); json takes what orjson refuses
    (a lone surrogate from a path or header read with surrogateescape, an integer past 64 bits)."""
    try:
        return orjson.dumps(entry, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:
        return json.dumps(entry, separators=(",", ":")).encode() + b"\n"


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def _route_to(request: http.Request, upstream: str) -> None:
    """Send a forward-mode request to its tenant's provider, keeping the Host it was addressed to."""
    url = urllib.parse.urlsplit(upstream)
    host_header = request.host_header or request.host
    request.scheme = url.scheme or "http"
    request.host = url.hostname or "127.0.0.1"
    request.port = url.port or (443 if request.scheme == "https" else 80)
    request.host_header = host_header

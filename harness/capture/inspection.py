"""The inspection part of the tenancy addon: inspect, record and flag every tenant flow of a tenancy audit.

Thin glue over `harness.detect.flows` (the detection core the offline reconciler uses too), which runs the
checks of `harness.detect.checks` in order; a websocket's messages go to `harness.detect.websocket` as they pass,
and the flow is recorded when its connection ends. A flow with a finding is marked, commented, logged at WARNING and
carries its findings in `flow.metadata["tenancy"]`; every flow is one line of the JSONL ledger. It reads the
registry `Routing` loads and keeps current, and runs after it in every hook, on the endpoint routing decided
for the flow (`harness.capture.addon.Tenancy` composes the two). See docs/addon.md.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson
from mitmproxy import contentviews, ctx, exceptions, http, tcp
from mitmproxy.log import ALERT

from harness.capture.contentview import TenancyContentview
from harness.capture.pool import SUPPORTED, Pool, default_workers
from harness.capture.watched import PhaseFile, RegistryFile
from harness.core.files import write_private
from harness.core.findings import Finding
from harness.core.registry import Registry
from harness.detect import flows
from harness.detect.engine.matcher import Matcher
from harness.detect.prefixes import Prefixes
from harness.detect.reports import ResponseReport
from harness.detect.routes import Endpoint
from harness.detect.websocket import Message, WebsocketScan

log = logging.getLogger("tenancy")
MARK = ":warning:"
#: A body this long or longer is scanned in the pool (when `tenancy_workers` > 0); a shorter one inline, where
#: its scan costs less than handing it to a worker.
POOLED_BYTES = 16 * 1024
#: A scan is handed to the pool only while this many other flows are in flight: the hand-over adds latency
#: (0.3 ms each way on 2 vCPUs), which only a loop with other flows to serve meanwhile wins back.
BUSY = 1
MAX_WORKERS = 64
#: Response types passed to the client chunk by chunk (a long-lived stream: SSE, and NDJSON such as ntfy's
#: subscription); each is kept whole too, and inspected when it ends.
STREAMED_TYPES = ("text/event-stream", "application/x-ndjson")


class _StreamTap:
    """`response.stream` for a streamed type (`STREAMED_TYPES`): every chunk goes to the client at once; a copy
    is kept for inspection."""

    def __init__(self) -> None:
        self.data = bytearray()

    def __call__(self, chunk: bytes) -> bytes:
        self.data += chunk
        return chunk


@dataclass
class _Socket:
    """A websocket (or raw TCP) connection in flight: its upgrade flow's report (a TCP flow's: its connection's),
    written to the ledger when the connection ends, the scan its messages are fed to, and the findings logged so
    far."""

    flow: http.HTTPFlow | tcp.TCPFlow
    report: flows.FlowReport
    scan: WebsocketScan
    matcher: Matcher
    logged: set[tuple[Any, ...]] = field(default_factory=set)


class Inspection:
    """Owns the options `tenancy_ledger`, `tenancy_phase_file` and `tenancy_workers`, the "Tenancy" content view
    and what the commands `tenancy.findings` and `tenancy.report` show; inspects against the registry in
    `tenants`. With workers, the scan of a long body runs in the pool (`harness.capture.pool`) and the hook
    returns an awaitable that mitmproxy awaits: the flow waits for it, the other flows go on."""

    def __init__(self, tenants: RegistryFile) -> None:
        self.tenants = tenants
        self.phase = PhaseFile()
        self.findings: list[Finding] = []
        self.ledger: IO[bytes] | None = None
        self._ledger_failed = False  # once a line could not be written, nothing more is recorded
        #: The report of every request in flight, reused by `finish` while the request is unchanged.
        self._inflight: dict[str, tuple[_RequestState, flows.RequestReport]] = {}
        #: Every websocket connection in flight, by its flow's id.
        self._sockets: dict[str, _Socket] = {}
        #: The request bodies inspected inline so far: a conversation's next request is scanned for what is new.
        self.prefixes = Prefixes()
        self.pool = Pool(0)
        self._running = False  # the pool is used only once mitmproxy runs its event loop

    def load(self, loader: Any) -> None:
        contentviews.add(TenancyContentview(lambda: self.tenants.matcher))
        loader.add_option(
            "tenancy_ledger", str | None, None,
            "Append one JSON line per flow to this file (mode 0600); the proxy stops if it cannot be written.",
        )
        loader.add_option(
            "tenancy_phase_file", str | None, None,
            'A JSON file {"scenario": ..., "phase": ...} naming the audit\'s current phase; findings are labelled '
            "with it, so their fingerprints match the audit's (the harness writes it).",
        )
        loader.add_option(
            "tenancy_workers", int, default_workers(),
            f"Worker processes that scan bodies of {POOLED_BYTES // 1024} KiB or more beside the event loop "
            "(0: every scan inline). Default: one per CPU beyond two, at most 4 (none on two CPUs).",
        )

    def configure(self, updated: set[str]) -> None:
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
            self.phase.reset()
        if "tenancy_workers" in updated:
            workers = ctx.options.tenancy_workers
            if not 0 <= workers <= MAX_WORKERS:
                raise exceptions.OptionsError(f"tenancy_workers must be 0 to {MAX_WORKERS}, not {workers}")
            if workers and not SUPPORTED:
                raise exceptions.OptionsError("tenancy_workers: scan workers need Linux (memfd); use 0")
            if workers != self.pool.size:
                self._stop_pool()
                self.pool = Pool(workers)

    def running(self) -> None:
        self._running = True

    def done(self) -> None:
        for flow_id in list(self._sockets):  # still open when the proxy stops: recorded as they are
            self._end(flow_id)
        self._stop_pool()
        if self.ledger:
            self.ledger.close()
            self.ledger = None

    def _stop_pool(self) -> None:
        for proc in self.pool.close():
            log.error(f"tenancy: scan worker {proc.pid} survived its pool")

    def _pooled(self, size: int) -> bool:
        """Whether a scan of `size` bytes goes to the pool (up, or now starting: it is then inline), the flow's
        own report no longer or not yet among those in flight."""
        return (self._running and size >= POOLED_BYTES and len(self._inflight) >= BUSY and self.pool.size > 0
                and self.pool.ready())

    def _stamp_label(self, flow: http.HTTPFlow | tcp.TCPFlow) -> None:
        scenario, phase = self.phase.label(ctx.options.tenancy_phase_file)
        flow.metadata["tenancy"].update(scenario=scenario, phase=phase)

    def http_connect(self, flow: http.HTTPFlow, endpoint: Endpoint | None) -> Awaitable[None] | None:
        """Record a CONNECT answered here (routing blocked it): no other hook of this flow follows."""
        return self.finish(flow, endpoint) if flow.response is not None else None

    def request(self, flow: http.HTTPFlow, endpoint: Endpoint) -> Awaitable[None] | None:
        """Inspect the request routing has attributed to `endpoint` (unless routing answered it itself); with a
        long body, the in-path checks here and the scan in the pool (awaitable)."""
        reg, matcher = self.tenants.registry, self.tenants.matcher
        if reg is None or matcher is None or flow.response or flow.error:
            return None
        raw = flows.raw_request(flow)
        if not self._pooled(len(raw.body or b"")):
            self._requested(flow, matcher, flows.check_request(reg, matcher, raw, endpoint, self.prefixes))
            return None
        _, report = flows.request_in_path(reg, matcher, raw, endpoint)
        self._requested(flow, matcher, report)
        return self._scan_request(flow, reg, matcher, flows.RequestScan.of(raw, endpoint, report))

    async def _scan_request(self, flow: http.HTTPFlow, reg: Registry, matcher: Matcher,
                            job: flows.RequestScan) -> None:
        """The request's scan in the pool; its report then replaces the in-path one."""
        report = await self.pool.run(reg, matcher, job)
        self._inflight[flow.id] = (self._inflight[flow.id][0], report)
        if report.findings:
            flow.marked = MARK

    def _requested(self, flow: http.HTTPFlow, matcher: Matcher, report: flows.RequestReport) -> None:
        """Keep the request's report for `finish`, attribute and label the flow, and mark it if flagged."""
        self._inflight[flow.id] = (_request_state(flow, matcher), report)
        flow.metadata["tenancy"] = {"tenant": report.tenant, "route": report.route, "kind": report.kind}
        self._stamp_label(flow)
        if report.findings:
            flow.marked = MARK

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if self.tenants.registry is None or flow.response is None or flow.response.stream:
            return
        content_type = flow.response.headers.get("content-type", "").lower()
        if any(t in content_type for t in STREAMED_TYPES):
            flow.response.stream = _StreamTap()

    def finish(self, flow: http.HTTPFlow, endpoint: Endpoint | None) -> Awaitable[None] | None:
        """Inspect the finished flow (response or error), flag it and write its ledger line. `endpoint` is whose
        routing decided the flow is; it is read when routing answered the request itself (no request report).
        A long response is scanned in the pool (awaitable). The registry is re-read first: a model stub mints the
        derived canary its answer carries just before the answer leaves, and `reconcile` finds it in this response."""
        if flow.id in self._sockets:  # an error after the upgrade: the connection is over
            self._end(flow.id)
            return None
        if self.tenants.registry is not None:
            self.tenants.refresh()
        inflight = self._inflight.pop(flow.id, None)
        reg, matcher = self.tenants.registry, self.tenants.matcher
        if reg is None or matcher is None or "tenancy" not in flow.metadata:
            return None
        if "phase" not in flow.metadata["tenancy"]:  # answered by routing before `request` saw it
            self._stamp_label(flow)
        if flow.response is not None and isinstance(flow.response.stream, _StreamTap):
            flow.response.data.content = bytes(flow.response.stream.data)  # saved flows keep the stream
            flow.response.stream = False
        if inflight is None:  # answered by routing: inspected on the endpoint it decided
            request = flows.inspect_flow_request(reg, matcher, flow, endpoint, self.prefixes)
        elif inflight[0] == _request_state(flow, matcher):
            request = inflight[1]
        else:  # a request changed since its report (an edit, a reloaded registry) is inspected afresh
            request = flows.inspect_flow_request(reg, matcher, flow, prefixes=self.prefixes)
        scan = flows.response_scan(flow, request)
        if scan is not None and self._pooled(len(scan.body or b"")):
            return self._scan_response(flow, (reg, matcher), request, scan)
        self._conclude(flow, flows.flow_report(flow, request, scan.run(reg, matcher) if scan else None))
        return None

    async def _scan_response(self, flow: http.HTTPFlow, tenants: tuple[Registry, Matcher],
                             request: flows.RequestReport, scan: flows.ResponseScan) -> None:
        """The response's scan in the pool, then the flow concluded as inline."""
        self._conclude(flow, flows.flow_report(flow, request, await self.pool.run(*tenants, scan)))

    def _conclude(self, flow: http.HTTPFlow, report: flows.FlowReport) -> None:
        """Label the flow's report, put it in the flow's metadata, flag the flow and write its ledger line; a flow
        upgraded to a websocket is recorded when the connection ends (`websocket_end`)."""
        report.label(flow.metadata["tenancy"].get("scenario"), flow.metadata["tenancy"].get("phase"))
        entry = report.ledger_entry()
        flow.metadata["tenancy"] = {k: v for k, v in entry.items() if k not in ("time", "flow")}
        self._flag(flow, report.findings)
        reg, matcher = self.tenants.registry, self.tenants.matcher
        if flow.websocket is not None and reg is not None and matcher is not None:
            scan = flows.websocket_scan(reg, matcher, flow, report.request)
            self._sockets[flow.id] = _Socket(flow, report, scan, matcher, {f.identity() for f in report.findings})
            return
        self.findings += report.findings
        self._record(flow, entry)

    def _flag(self, flow: http.HTTPFlow | tcp.TCPFlow, found: list[Finding],
              logged: set[tuple[Any, ...]] | None = None) -> None:
        """Mark a flow with findings, comment it with the first of those in its metadata, and log each of `found`
        not in `logged` (which then holds it too)."""
        if not found:
            return
        every = flow.metadata["tenancy"]["findings"]
        flow.marked = MARK
        flow.comment = f"tenancy: {Finding.from_dict(every[0]).summary()}" + (
            f" (+{len(every) - 1} more)" if len(every) > 1 else "")
        for finding in found:
            if logged is None or finding.identity() not in logged:
                log.warning(f"tenancy: {finding.summary()}")
                if logged is not None:
                    logged.add(finding.identity())

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        """Check the message that just passed with the stream before it; flag the flow at once if it leaks."""
        if flow.websocket is not None and flow.websocket.messages:
            message = flow.websocket.messages[-1]
            self._message(flow, Message(message.from_client, message.content))

    def tcp_start(self, flow: tcp.TCPFlow, endpoint: Endpoint) -> None:
        """A raw TCP connection on a listener routing attributed to `endpoint`: its messages are checked as a
        websocket's, as they pass and then whole when it ends (`tcp_end`), and it is then one ledger line."""
        reg, matcher = self.tenants.registry, self.tenants.matcher
        if reg is None or matcher is None:
            return
        report = flows.tcp_flow_report(reg, flow, endpoint)
        flow.metadata["tenancy"] = {"tenant": report.request.tenant, "route": report.request.route,
                                    "kind": report.request.kind, "findings": [], "flagged": False}
        self._stamp_label(flow)
        report.label(flow.metadata["tenancy"].get("scenario"), flow.metadata["tenancy"].get("phase"))
        self._sockets[flow.id] = _Socket(flow, report, flows.websocket_scan(reg, matcher, flow, report.request),
                                         matcher)

    def tcp_message(self, flow: tcp.TCPFlow) -> None:
        """Check what one side of a TCP connection just sent, as a websocket message is."""
        if flow.messages:
            self._message(flow, Message(flow.messages[-1].from_client, flow.messages[-1].content))

    def tcp_end(self, flow: tcp.TCPFlow) -> None:
        """A TCP connection closed (or failed): recorded with every finding of its messages."""
        sock = self._sockets.get(flow.id)
        if sock is None:
            return
        if flow.error is not None:
            sock.report.response = ResponseReport(None, None, error=flow.error.msg)
        self._end(flow.id)

    def _message(self, flow: http.HTTPFlow | tcp.TCPFlow, message: Message) -> None:
        """Feed one message to its connection's scan; flag the flow at once if it leaks."""
        sock = self._sockets.get(flow.id)
        if sock is None:
            return
        found = sock.scan.feed(message)
        if found:
            meta = flow.metadata["tenancy"]
            found = [f.labelled(meta.get("scenario"), meta.get("phase")) for f in found]
            meta["findings"] = [*meta["findings"], *(f.to_dict() for f in found)]
            meta["flagged"] = True
            self._flag(flow, found, sock.logged)

    def websocket_end(self, flow: http.HTTPFlow) -> None:
        if flow.id in self._sockets:
            self._end(flow.id)

    def _end(self, flow_id: str) -> None:
        """A websocket connection is over (or the proxy stops): its streams are scanned whole, and the flow is
        flagged and written to the ledger with every finding of its upgrade and its messages. Under a registry
        reloaded meanwhile, every message is checked again against it (as `reconcile` would)."""
        sock = self._sockets.pop(flow_id)
        flow, report = sock.flow, sock.report
        reg, matcher = self.tenants.registry, self.tenants.matcher
        if matcher is sock.matcher or reg is None or matcher is None:
            report.websocket = sock.scan.finish()
        else:
            report.websocket = flows.websocket_report(reg, matcher, flow, report.request)
        report.label(report.scenario, report.phase)
        entry = report.ledger_entry()
        flow.metadata["tenancy"] = {k: v for k, v in entry.items() if k not in ("time", "flow")}
        self._flag(flow, report.findings, sock.logged)
        self.findings += report.findings
        if report.websocket.not_inspected:
            log.warning(f"tenancy: {flow_id}: " + "; ".join(n.summary() for n in report.websocket.not_inspected))
        self._record(flow, entry)

    def _record(self, flow: http.HTTPFlow | tcp.TCPFlow, entry: dict[str, Any]) -> None:
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

    def summaries(self) -> Sequence[str]:
        """The findings of this session so far, one summary line each (logged at ALERT)."""
        lines = [f.summary() for f in self.findings]
        logging.log(ALERT, f"tenancy: {len(lines)} findings" + "".join(f"\n  {line}" for line in lines))
        return lines

    def write_report(self, path: str) -> None:
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

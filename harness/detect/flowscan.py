"""One message's leak scan: every canary in it that is not the tenant's own, as findings of one kind, with where
it was and in which encoding. The request and response checks (`harness.detect.checks`) scan with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from harness.core.findings import Finding
from harness.core.protocol import FLOW_HEADER
from harness.detect.decode import KEY_HEADERS, Body, Headers
from harness.detect.engine.containers import may_start
from harness.detect.engine.matcher import Hit, Matcher
from harness.detect.engine.stream import NotInspected, ScanHit, scan_bytes
from harness.detect.prefixes import Prefixes


def _label(body_encoding: str | None, hit: Hit | ScanHit) -> str:
    if not body_encoding:
        return hit.encoding
    return body_encoding if hit.encoding == "plain" else f"{body_encoding}+{hit.encoding}"


@dataclass
class FlowScan:
    """Collects leak findings of one message: every canary not owned by the channel's tenant."""

    matcher: Matcher
    flow_id: str
    tenant: str | None
    channel: str
    kind: str
    findings: list[Finding] = field(default_factory=list)
    seen: set[tuple[str, str]] = field(default_factory=set)
    not_inspected: list[NotInspected] = field(default_factory=list)

    def scan(
        self,
        data: bytes,
        part: str,
        *,
        encoding: str | None = None,
        skip: frozenset[tuple[str, str]] = frozenset(),
        offsets: bool = True,
        only_new: bool = False,
        shift: int = 0,
    ) -> None:
        """The canaries' forms in `data` (no layers); `shift`: where `data` starts in what the locations count
        from (a window of a longer stream)."""
        for hit in self.matcher.find(data, exclude=self.tenant):
            self._add(hit, data, part, encoding, skip, only_new, shift if offsets else None)

    def _add(self, hit: Hit, data: bytes, part: str, encoding: str | None, skip: frozenset[tuple[str, str]],
             only_new: bool, shift: int | None) -> None:
        """Record `hit` (found in `data`) as a finding, unless `skip` holds it or `only_new` and it was seen; located
        at its offset plus `shift` (None: not located by offset)."""
        ident = (hit.tenant, hit.kind)
        if ident in skip or (only_new and ident in self.seen):
            return
        self.seen.add(ident)
        self.findings.append(
            Finding(
                kind=self.kind,
                victim=hit.tenant,
                seen_in=self.tenant,
                canary=hit.kind,
                channel=self.channel,
                location=f"flow:{self.flow_id}:{part}" + (f"@{hit.start + shift}" if shift is not None else ""),
                encoding=_label(encoding, hit),
                evidence=self.matcher.snippet(data, hit),
            )
        )

    def headers(self, headers: Headers, prefix: str, skip: frozenset[tuple[str, str]] = frozenset()) -> None:
        """Scan every header line as if alone (`skip` applies to the credential headers): for the canaries' forms
        (`_forms`), then every line where a layer may start (a base64 block, a compressed stream in
        one, a hex or percent-encoded run) through its layers, for the canaries not already seen."""
        lines = [(name.lower(), f"{name}: {value}".encode("utf-8", "surrogateescape"))
                 for name, value in headers if name.lower() != FLOW_HEADER]
        self._forms(lines, prefix, skip)
        encoded = [line for _, line in lines]
        if not may_start(encoded, self.matcher.shortest):
            return
        for name, line in lines:
            if may_start([line], self.matcher.shortest):
                self.layered(line, f"{prefix}.headers.{name}", skip=skip if name in KEY_HEADERS else frozenset(),
                             only_new=True, offsets=False)

    def _forms(self, lines: list[tuple[str, bytes]], prefix: str, skip: frozenset[tuple[str, str]]) -> None:
        """The canaries' forms in every header line, each line scanned alone. One `may_find` over all lines
        first: a line's match holds a trigger, which the joined lines then hold too, so when they hold none no
        line is scanned (a request carrying its tenant's own key always holds one). A joined scan would not be the
        same as lines alone: a base64 form's edge at a line's end and a UTF-16 form's byte order depend on where
        the line starts."""
        if not self.matcher.may_find(b"\n".join(line for _, line in lines)):
            return
        for name, line in lines:
            self.scan(line, f"{prefix}.headers.{name}", skip=skip if name in KEY_HEADERS else frozenset(),
                      offsets=False)

    def layered(self, data: bytes, part: str, *, encoding: str | None = None,
                skip: frozenset[tuple[str, str]] = frozenset(), only_new: bool = False, offsets: bool = True,
                known: tuple[Prefixes, str] | None = None) -> None:
        """Scan `data` and every layer in it (base64 blocks, compressed streams, ...: `stream.scan_bytes`).
        `offsets`: locate a hit in the raw bytes at its offset (a hit in a layer always is). `known`: the bodies
        scanned before and this one's endpoint, to scan only what is new of a conversation (the same hits)."""
        where = f"flow:{self.flow_id}:{part}"
        skipped: list[NotInspected] = []
        if known is not None:
            hits = known[0].scan(data, self.matcher, (self.tenant, known[1]), not_inspected=skipped)
        else:
            hits = scan_bytes(data, self.matcher, headerless=False, not_inspected=skipped, exclude=self.tenant)
        for h in hits:
            ident = (h.tenant, h.kind)
            if ident in skip or (only_new and ident in self.seen):
                continue
            self.seen.add(ident)
            self.findings.append(Finding(
                kind=self.kind, victim=h.tenant, seen_in=self.tenant, canary=h.kind, channel=self.channel,
                location=h.location(where) if offsets or h.layers else where, encoding=_label(encoding, h),
                evidence=h.evidence,
            ))
        self.not_inspected += [replace(n, path=where + n.path.removeprefix("bytes")) for n in skipped]

    def body(self, body: Body, part: str, skip: frozenset[tuple[str, str]] = frozenset(),
             known: tuple[Prefixes, str] | None = None) -> None:
        self.layered(body.data, part, encoding=body.encoding, skip=skip, known=known)
        if body.partial:
            read = len(body.data) if body.note == "truncated" else 0
            self.not_inspected.append(NotInspected(f"flow:{self.flow_id}:{part}", f"body {body.note}", read))

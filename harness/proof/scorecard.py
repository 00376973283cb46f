"""One run of the scorecard: seed the cases of every channel, send the flow cases through a live mitmdump with the
addon, write the file cases into an evidence folder, reconcile the folder, and count what each reader saw."""

from __future__ import annotations

import random
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.capture.proxy import Proxy, bind_listener, port_of
from harness.core.files import FLOWS, REGISTRY, seal
from harness.core.findings import Finding
from harness.core.procs import ProcessSet
from harness.core.registry import Registry
from harness.detect.reconcile import read_flows
from harness.proof import folder, traffic
from harness.proof.cases import SERVICES, TENANTS, Case, Sample, mint, plan
from harness.proof.channels import BY_NAME, CHANNELS, FLOW_CHANNELS, LIVE, SAVED
from harness.proof.encodings import ENCODINGS, Encoding
from harness.proof.score import Scorecard

FULL, QUICK = Sample(positives=4, decoys=4), Sample(positives=1, decoys=1)


@dataclass(frozen=True)
class Options:
    """`seed`; `quick`: a smaller sample; `out`: keep the evidence folder there (else a temporary one);
    `channels` and `encodings`: only these (all by default)."""

    seed: int
    quick: bool = False
    out: Path | None = None
    channels: tuple[str, ...] = ()
    encodings: tuple[Encoding, ...] = ENCODINGS


def cases_of(rng: random.Random, opts: Options, registry: Registry) -> list[Case]:
    """Every case of the run, channel by channel (the same list for the same seed)."""
    cases: list[Case] = []
    for channel in CHANNELS:
        if opts.channels and channel.name not in opts.channels:
            continue
        cases += plan(rng, registry, channel, opts.encodings, QUICK if opts.quick else FULL, len(cases))
    return cases


def run(opts: Options, say: Callable[[str], None] = lambda _: None) -> Scorecard:
    """Seed, send, write, reconcile and count (`say`: progress)."""
    started = time.monotonic()
    out = opts.out or Path(tempfile.mkdtemp(prefix="tenancy-scorecard-"))
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        return _run(opts, out, say, started)
    finally:
        if opts.out is None:
            shutil.rmtree(out, ignore_errors=True)
        else:
            seal(out)  # evidence: every file 0600, every folder 0700


def _run(opts: Options, out: Path, say: Callable[[str], None], started: float) -> Scorecard:
    rng = random.Random(opts.seed)
    names = [*TENANTS, *(f"{t}.{s}" for t in TENANTS for s in SERVICES)]
    listeners = {name: bind_listener() for name in names}
    registry = mint(rng, {n: {"listen": port_of(s)} for n, s in listeners.items()})
    cases = cases_of(rng, opts, registry)
    flow_cases = [c for c in cases if c.channel in FLOW_CHANNELS]
    requests = [traffic.request_of(c, registry, rng) for c in flow_cases]
    say(f"scorecard: {len(cases)} cases ({sum(c.positive for c in cases)} positives), {len(requests)} flows")
    registry.save(out / REGISTRY)
    written = folder.write(out, registry, (c for c in cases if c.channel not in FLOW_CHANNELS))
    if requests:
        _send(registry, out, listeners, requests)
    else:
        for sock in listeners.values():
            sock.close()
    say("scorecard: flows sent; reconciling the evidence folder")
    card = Scorecard(opts.seed, opts.quick)
    _count(card, cases, out, registry, written)
    card.seconds = time.monotonic() - started
    return card


def _send(registry: Registry, out: Path, listeners: dict[str, socket.socket],
          requests: list[traffic.Request]) -> None:
    """Every request through a live mitmdump with the addon, in front of one upstream answering every case."""
    upstream = traffic.Upstream({r.case: r.answer for r in requests})
    url = upstream.start()
    for t in registry:
        t.upstream = url
        for s in t.services.values():
            s.upstream = url
    registry.save(out / REGISTRY)
    procs = ProcessSet()
    proxy = Proxy(registry, out / REGISTRY, out, procs, listeners=list(listeners.values()))
    try:
        proxy.start()
        traffic.send_all(requests)
    finally:
        proxy.stop()
        procs.close()
        upstream.stop()


def _count(card: Scorecard, cases: list[Case], out: Path, registry: Registry, written: folder.Written) -> None:
    """Judge every case by its channel's reader: the live ledger, the reconciled folder (its saved flows too)."""
    flows, _ = read_flows(out / FLOWS, empty_ok=True)
    case_of_flow = {f.id: f.request.query.get("case", "") for f in flows}
    live: dict[str, list[Finding]] = {}
    for flow_id, found in traffic.ledger(out / "ledger.jsonl").items():
        live.setdefault(case_of_flow.get(flow_id, ""), []).extend(Finding.from_dict(f) for f in found)
    saved: dict[str, list[Finding]] = {}
    units: dict[str, list[Finding]] = {}
    for f in folder.judge(out, registry, written.record):
        if f.location.startswith("flow:") and ":tool:" not in f.location:
            saved.setdefault(case_of_flow.get(f.location.split(":")[1], ""), []).append(f)
        else:
            units.setdefault(folder.case_in(f.location, written.rpc) or "", []).append(f)
    for case in cases:
        channel = BY_NAME[case.channel]
        if channel.reader == LIVE:
            card.judge(case, channel, live.get(case.id, []))
        else:
            card.judge(case, channel, units.get(case.id, []))
    for case in cases:
        if BY_NAME[case.channel].reader == LIVE:
            card.judge(case, SAVED, saved.get(case.id, []))

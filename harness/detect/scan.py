"""Canaries as findings: `file_leak`s in files, trees and paths (names and symlink targets too), and
`text_leak`s in logs and RPC streams, each scanned by `harness.detect.engine.stream`.

Names: `scan_tree` scans every path below the root (directories, files, symlinks and their targets) as
text; a canary in a name is a `file_leak` at `PATH:name@OFFSET` (encoding `name`, `name/url`, ...). Any
file not read (unreadable, a FIFO, a socket, a symlink not followed) is a `NotInspected` entry.

Which canaries count: with an `owner`, every canary of every other tenant; with no owner, the secrets
(`is_secret_kind`) of every tenant. Evidence, locations and paths are always redacted with the matcher of
the whole registry.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness.core.findings import Finding
from harness.core.registry import Registry, is_secret_kind
from harness.detect.engine.containers import may_start
from harness.detect.engine.hits import where
from harness.detect.engine.matcher import Hit, Matcher, matcher_for
from harness.detect.engine.stream import DEFAULT_LIMITS, Limits, NotInspected, ScanHit, scan_bytes, scan_file
from harness.detect.planted import Planted, names_planted
from harness.detect.tools import store_named


@dataclass
class TreeScan:
    """What a scan found; `unreadable` paths were not scanned and must be reported; `not_inspected` lists
    everything not read to its end; `notes` explain the rest (excluded homes)."""

    findings: list[Finding] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    not_inspected: list[NotInspected] = field(default_factory=list)
    files: int = 0
    bytes: int = 0
    #: The paths the owner's own probe planted (`detect.planted`): a home naming one of them in its files does not
    #: count.
    planted: Planted = frozenset()

    def __iter__(self) -> Iterator[list]:
        """`findings, unreadable = scan_paths(...)`."""
        return iter((self.findings, self.unreadable))

    def merge(self, other: TreeScan) -> None:
        self.findings += other.findings
        self.unreadable += other.unreadable
        self.notes += other.notes
        self.not_inspected += other.not_inspected
        self.files += other.files
        self.bytes += other.bytes

    def reasons(self) -> list[str]:
        """Why a verdict over this scan cannot be `clean`: every file read only in part."""
        return [f"not fully inspected: {n.summary()}" for n in self.not_inspected if n.partial]


# -- findings -----------------------------------------------------------------------------------------------


def _counts(hit: ScanHit | Hit, owner: str | None) -> bool:
    return hit.tenant != owner if owner is not None else is_secret_kind(hit.kind)


def _check_owner(registry: Registry, owner: str | None) -> None:
    if owner is not None and owner not in registry.tenants:
        raise ValueError(f"unknown tenant {owner!r}")


def _findings(hits: Iterable[ScanHit], owner: str | None, label: str, kind: str, channel: str,
              planted: Planted = frozenset()) -> list[Finding]:
    """One finding per hit that counts against `owner` and is no path of its `planted`, located `label` + the hit's
    place; a home in a text stream that a path into a tool's store continues names that store (`Finding.store`)."""
    return [
        Finding(
            kind=kind,
            victim=h.tenant,
            seen_in=owner,
            canary=h.kind,
            channel=channel,
            location=h.location(label),
            encoding=h.encoding,
            evidence=h.evidence,
            store=_store(h) if kind == "text_leak" else None,
        )
        for h in hits
        if _counts(h, owner) and not _planted(h, planted)
    ]


def _after_plain_home(hit: ScanHit) -> bytes | None:
    """The bytes after a home found in plain text (no layer, no encoding), or None for any other hit."""
    if hit.kind != "home" or hit.layers or hit.hit.encoding != "plain" or hit.snippet is None:
        return None
    return hit.snippet.following


def _planted(hit: ScanHit, planted: Planted) -> bool:
    """Whether a hit is a home in plain text that goes on into a path the owner's own probe planted."""
    following = _after_plain_home(hit) if planted else None
    return following is not None and names_planted(hit.tenant, following, planted)


def _store(hit: ScanHit) -> str | None:
    """The tool store a home found in plain text leads into (its path goes on there), or None."""
    following = _after_plain_home(hit)
    return None if following is None else store_named(following)


def scan_text(
    text: str | bytes,
    registry: Registry,
    owner: str | None,
    *,
    label: str,
    channel: str = "log",
    matcher: Matcher | None = None,
    not_inspected: list[NotInspected] | None = None,
) -> list[Finding]:
    """`text_leak` findings in a log or RPC stream (`channel` "log" or "rpc"), located `label@offset`, within the
    default limits. `matcher`: the registry's (`matcher_for(registry)` when not given)."""
    _check_owner(registry, owner)
    data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    matcher = matcher or matcher_for(registry)
    skipped: list[NotInspected] = []
    hits = scan_bytes(data, matcher, limits=DEFAULT_LIMITS, not_inspected=skipped, recipient=owner)
    if not_inspected is not None:
        not_inspected += [replace(n, path=label + n.path.removeprefix("bytes")) for n in skipped]
    return _findings(hits, owner, label, "text_leak", channel)


def scan_log(
    path: Path,
    registry: Registry,
    owner: str | None,
    *,
    label: str,
    matcher: Matcher | None = None,
    limits: Limits = DEFAULT_LIMITS,
    planted: Planted = frozenset(),
) -> TreeScan:
    """`text_leak` findings in a log file, read as a stream (never whole), located `label@offset`; `planted`: what
    the owner's own probe planted (`TreeScan.planted`)."""
    _check_owner(registry, owner)
    matcher = matcher or matcher_for(registry)
    result = TreeScan()
    try:
        hits = scan_file(path, matcher, limits=limits, not_inspected=result.not_inspected, label=label,
                         recipient=owner)
    except OSError as exc:
        result.unreadable.append(str(path))
        result.not_inspected.append(NotInspected(label, f"unreadable: {exc.strerror or exc}"))
        return result
    result.files, result.bytes = 1, path.stat().st_size
    result.findings = _findings(hits, owner, label, "text_leak", "log", planted)
    return result


def scan_tree(
    root: Path | str,
    registry: Registry,
    owner: str | None,
    *,
    exclude: Iterable[Path | str] = (),
    matcher: Matcher | None = None,
    limits: Limits = DEFAULT_LIMITS,
    planted: Planted = frozenset(),
) -> TreeScan:
    """`file_leak` findings for every file under `root` (a tenant home), locations relative to `root`.

    Every other tenant's `home` that lies under `root` is excluded automatically (a launch profile's home
    holding `profiles/<name>`), as is every path in `exclude`. Every name below `root` is scanned too.
    Symlinks are never followed: their targets' names are scanned, and those pointing out of the tree or
    nowhere are listed in `not_inspected` (not partial: what they point to is not in the tree). FIFOs,
    sockets and devices are listed too, never opened. `matcher`: the registry's (`matcher_for(registry)`
    when not given); `planted`: what the owner's own probe planted (`TreeScan.planted`).
    """
    _check_owner(registry, owner)
    root = Path(os.path.abspath(root))
    matcher = matcher or matcher_for(registry)
    excluded = {Path(os.path.abspath(p)) for p in exclude}
    excluded |= {Path(os.path.abspath(t.home)) for t in registry if t.home and t.name != owner}
    excluded.discard(root)
    result = TreeScan(planted=planted)

    def onerror(exc: OSError) -> None:
        label = redacted_path(matcher, Path(exc.filename).relative_to(root).as_posix()) if exc.filename else "?"
        result.unreadable.append(str(exc.filename))
        result.notes.append(f"unreadable directory {exc.filename}: {exc.strerror or exc}")
        result.not_inspected.append(NotInspected(label, f"unreadable directory: {exc.strerror or exc}"))

    for dirpath, dirnames, filenames in os.walk(root, onerror=onerror, followlinks=False):
        here = Path(dirpath)
        keep = []
        for d in sorted(dirnames):
            sub = here / d
            if sub in excluded:
                result.notes.append(f"excluded {sub} (another tenant's home)")
            elif sub.is_symlink():
                filenames.append(d)  # reported below, never followed
            else:
                _scan_name(sub.relative_to(root).as_posix(), matcher, owner, result)
                keep.append(d)
        dirnames[:] = keep
        for name in sorted(filenames):
            path = here / name
            if path in excluded:
                continue
            rel = path.relative_to(root).as_posix()
            _scan_name(rel, matcher, owner, result)
            _scan_entry(path, redacted_path(matcher, rel), root, matcher, owner, result, limits)
    return result


def redacted_path(matcher: Matcher, label: str) -> str:
    """A path as reports may show it: every canary in it replaced by `<tenant:kind>`."""
    return matcher.redact_text(label) if matcher.find(label.encode("utf-8", "surrogateescape")) else label


def _scan_name(rel: str, matcher: Matcher, owner: str | None, result: TreeScan, *, what: str = "name",
               text: str | None = None) -> None:
    """A canary in the last component of the path `rel` (or in `text`, a symlink's target): a `file_leak`
    at `PATH:name@OFFSET`, OFFSET in the path; one inside a layer of the component (a base64 block of a
    compressed stream, a hex run, ...) at `PATH:name@OFFSET:LAYER@...`. Earlier components were scanned as their
    own entries."""
    data = (rel if text is None else text).encode("utf-8", "surrogateescape")
    first = 0 if text is not None else len(rel) - len(rel.rsplit("/", 1)[-1])
    label = f"{redacted_path(matcher, rel)}:{what}"
    for hit in matcher.find(data):
        if hit.end <= first or not _counts(hit, owner):
            continue
        result.findings.append(Finding(
            kind="file_leak", victim=hit.tenant, seen_in=owner, canary=hit.kind, channel="file",
            location=f"{label}@{hit.start}",
            encoding=what if hit.encoding == "plain" else f"{what}/{hit.encoding}",
            evidence=matcher.snippet(data, hit),
        ))
    component = data[first:]
    if not may_start([component], matcher.shortest):
        return
    for layered in scan_bytes(component, matcher, headerless=False):
        if not layered.layers or not _counts(layered, owner):
            continue  # a form the matcher found above
        (name, at), *inner = layered.layers
        result.findings.append(Finding(
            kind="file_leak", victim=layered.tenant, seen_in=owner, canary=layered.kind, channel="file",
            location=f"{label}{where([(name, first + (at or 0)), *inner])}@{layered.offset}",
            encoding=f"{what}/{layered.encoding}", evidence=layered.evidence,
        ))


def _scan_entry(
    path: Path, label: str, root: Path | None, matcher: Matcher, owner: str | None, result: TreeScan,
    limits: Limits = DEFAULT_LIMITS,
) -> None:
    try:
        st = path.lstat()
    except OSError as exc:
        result.unreadable.append(str(path))
        result.notes.append(f"unreadable {path}: {exc.strerror or exc}")
        result.not_inspected.append(NotInspected(label, f"unreadable: {exc.strerror or exc}"))
        return
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path)
        _scan_name(label, matcher, owner, result, what="target", text=target)
        real = os.path.realpath(path)
        shown = redacted_path(matcher, target)
        if not os.path.exists(real):
            result.not_inspected.append(NotInspected(label, f"dangling symlink to {shown} (not followed)", 0, False))
        elif root is None or not Path(real).is_relative_to(root):
            result.not_inspected.append(NotInspected(
                label, f"symlink to {redacted_path(matcher, real)}, out of the tree (not followed)", 0, False))
        return
    if not stat.S_ISREG(st.st_mode):
        kind = ("fifo" if stat.S_ISFIFO(st.st_mode) else "socket" if stat.S_ISSOCK(st.st_mode)
                else "device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "special file")
        result.not_inspected.append(NotInspected(label, f"not a regular file ({kind}), not opened", 0, False))
        return
    try:
        hits = scan_file(path, matcher, limits=limits, not_inspected=result.not_inspected, label=label,
                         recipient=owner)
    except OSError as exc:
        result.unreadable.append(str(path))
        result.notes.append(f"unreadable {path}: {exc.strerror or exc}")
        result.not_inspected.append(NotInspected(label, f"unreadable: {exc.strerror or exc}"))
        return
    result.files += 1
    result.bytes += st.st_size
    result.findings += _findings(hits, owner, label, "file_leak", "file", result.planted)


def scan_copy(copy: Path, rel: str, matcher: Matcher, owner: str | None, limits: Limits = DEFAULT_LIMITS,
              planted: Planted = frozenset()) -> TreeScan:
    """A copy of a file that was at `rel` in `owner`'s home: its name and content, located as that file's."""
    result = TreeScan(planted=planted)
    _scan_name(rel, matcher, owner, result)
    _scan_entry(copy, redacted_path(matcher, rel), None, matcher, owner, result, limits)
    return result


def scan_paths(
    paths: Iterable[Path | str], registry: Registry, owner: str | None, *, matcher: Matcher | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> TreeScan:
    """Files and directories (as `tenancy-audit scan` gets them); unpacks as `findings, unreadable`."""
    _check_owner(registry, owner)
    matcher = matcher or matcher_for(registry)
    result = TreeScan()
    for p in paths:
        path = Path(os.path.realpath(p)) if os.path.exists(p) else Path(p)  # explicit paths are followed
        if path.is_dir():
            result.merge(scan_tree(path, registry, owner, matcher=matcher, limits=limits))
        elif not os.path.lexists(path):
            result.unreadable.append(str(p))
            result.notes.append(f"unreadable {p}: does not exist")
            result.not_inspected.append(NotInspected(str(p), "unreadable: does not exist"))
        else:
            _scan_entry(path, redacted_path(matcher, str(p)), None, matcher, owner, result, limits)
    return result

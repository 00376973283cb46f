"""The Python distributions a venv holds and the ones a lock file pins, and one line saying how they differ.

A lock (`locks/*.txt`, written by `./tenancy lock`, or made on a release's first install) is a requirements file of
`name==version` lines with their `--hash` options and environment markers. `lock_versions` keeps the lines whose
marker holds here; `installed` asks another venv's python what it holds (importlib.metadata, in a child process
with a timeout). Names are normalized (PEP 503) on both sides.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

from packaging.markers import InvalidMarker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from harness.core.procs import ProcessSet

#: What every venv holds besides its lock: the installer and its build backend, left out of every comparison.
TOOLS = frozenset({"pip", "setuptools"})
#: Seconds the child reading a venv's distributions may take.
READ_TIMEOUT = 60.0
#: Differences named in the one line before `(+N more)`.
SHOWN = 3
_READ = ("import importlib.metadata as m, json; "
         "print(json.dumps([[d.metadata['Name'], d.version] for d in m.distributions()]))")


class DistributionError(Exception):
    """A lock that cannot be read or a venv that cannot be asked; one line."""


def lock_digest(path: Path) -> str:
    """The sha256 of a lock file's bytes (hex): what keys a cached venv and stamps a bootstrapped one."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise DistributionError(f"cannot read the lock {path}: {exc.strerror or exc}") from None


def lock_versions(path: Path, environment: Mapping[str, str] | None = None) -> dict[str, str]:
    """Normalized name -> version of every line of the lock whose marker holds in `environment` (default: this
    interpreter's)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DistributionError(f"cannot read the lock {path}: {exc.strerror or exc}") from None
    versions: dict[str, str] = {}
    for line in text.replace("\\\n", " ").splitlines():
        spec = " ".join(w for w in line.split("#", 1)[0].split() if not w.startswith("--hash="))
        if not spec:
            continue
        try:
            req = Requirement(spec)
        except (InvalidRequirement, InvalidMarker):
            raise DistributionError(f"the lock {path} has a line that is not a requirement: {spec[:80]}") from None
        pins = [s.version for s in req.specifier if s.operator == "=="]
        if len(pins) != 1 or len(req.specifier) != 1:
            raise DistributionError(f"the lock {path} does not pin one version of {req.name}")
        if req.marker is None or req.marker.evaluate(dict(environment) if environment else None):
            versions[canonicalize_name(req.name)] = pins[0]
    return versions


def installed(python: Path, timeout: float = READ_TIMEOUT) -> dict[str, str]:
    """Normalized name -> version of every distribution the venv of `python` holds (isolated mode: no user site,
    no PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    procs = ProcessSet()
    try:
        rc, out, err = procs.run([str(python), "-I", "-c", _READ], env=env, cwd=None, timeout=timeout)
    except OSError as exc:
        raise DistributionError(f"cannot run {python}: {exc.strerror or exc}") from None
    finally:
        procs.close()
    if rc != 0:
        why = "timed out" if rc is None else (err.strip().splitlines() or [f"exit {rc}"])[-1][:200]
        raise DistributionError(f"cannot list the distributions of {python}: {why}")
    try:
        return {canonicalize_name(name): version for name, version in json.loads(out)}
    except (ValueError, TypeError):
        raise DistributionError(f"{python} listed its distributions in a form not understood") from None


def current() -> dict[str, str]:
    """Normalized name -> version of every distribution this interpreter's environment holds (the harness's)."""
    return {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}


def differences(found: Mapping[str, str], lock: Mapping[str, str], what: str = "the Hermes venv",
                ignore: frozenset[str] = TOOLS, against: tuple[str, str] = ("the lock", "lock")) -> str | None:
    """One line naming how the distributions `found` differ from the `lock` (both normalized name -> version),
    `ignore`d names left out; None when they are equal. `against`: what the lock is, in the line and per item."""
    whole, short = against
    items = []
    for name in sorted((found.keys() | lock.keys()) - ignore):
        have, want = found.get(name), lock.get(name)
        if have == want:
            continue
        if want is None:
            items.append(f"{name} {have} (not in {whole})")
        elif have is None:
            items.append(f"{name} missing ({short} {want})")
        else:
            items.append(f"{name} {have} ({short} {want})")
    if not items:
        return None
    more = f" (+{len(items) - SHOWN} more)" if len(items) > SHOWN else ""
    return f"{what} differs from {whole}: {', '.join(items[:SHOWN])}{more}"

"""The two files the tenancy addon re-reads whenever they change: the registry and the phase label.

Both are checked by their mtime, size and inode (one `stat` per look), never read again while unchanged.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from harness.core import registry, registry_file
from harness.detect.engine.matcher import Matcher, matcher_for

log = logging.getLogger("tenancy")

Stamp = tuple[int, int, int]


def stamp(path: Path) -> Stamp | None:
    """What tells one version of a file from the next: (mtime, size, inode), or None if it is gone."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class RegistryFile:
    """The registry of `tenancy_registry` and its matcher, shared by the routing and the inspection addon.
    `refresh` picks up canaries minted mid-scenario; a broken new version keeps the old one in force."""

    def __init__(self) -> None:
        self.registry: registry.Registry | None = None
        self.matcher: Matcher | None = None
        self.path = Path()  # the registry file, once loaded
        self._stamp: Stamp | None = None

    def load(self, path: Path) -> None:
        """Load `path`; a `registry.RegistryError` leaves the registry in force as it was."""
        new_stamp = stamp(path)
        reg = registry_file.load(path)
        self.registry, self.matcher, self._stamp, self.path = reg, matcher_for(reg), new_stamp, path

    def clear(self) -> None:
        self.registry = self.matcher = self._stamp = None

    def refresh(self) -> None:
        """Reload the file if it changed since it was last read."""
        new_stamp = stamp(self.path)
        if new_stamp == self._stamp:
            return
        try:
            self.load(self.path)
            log.info(f"tenancy: reloaded registry {self.path}")
        except registry.RegistryError as exc:
            self._stamp = new_stamp
            log.error(f"tenancy: keeping the previous registry: {exc}")


Label = tuple[str | None, str | None]


class PhaseFile:
    """The audit's current (scenario, phase), read from the JSON file `{"scenario": S, "phase": P}` the
    harness rewrites at every phase (`tenancy_phase_file`); findings are labelled with it."""

    def __init__(self) -> None:
        self._label: Label = (None, None)
        self._stamp: Stamp | None = None

    def reset(self) -> None:
        """Forget what was read: the option now names another file."""
        self._label, self._stamp = (None, None), None

    def label(self, path: str | None) -> Label:
        """(scenario, phase) from `path` (re-read when it changes), or (None, None) without one."""
        if not path:
            return None, None
        new_stamp = stamp(Path(path))
        if new_stamp != self._stamp:
            self._stamp = new_stamp
            try:
                doc = json.loads(Path(path).read_bytes()) if new_stamp else {}
                self._label = (doc.get("scenario"), doc.get("phase"))
            except (OSError, ValueError, AttributeError) as exc:
                log.error(f"tenancy: cannot read the phase file {path}: {exc}")
                self._label = (None, None)
        return self._label

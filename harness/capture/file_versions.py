"""Every version of every file in the tenant homes, kept while the run goes on.

The homes are scanned at the end of a run; a file written during a turn and emptied or removed before the
end (a checkpoint, a lock, a temporary export) would leave no evidence. `FileVersions` watches the homes
with inotify (`watchdog`) and copies each distinct content a file takes into `versions/` of the evidence
folder, with when it was seen; `sweep()` (called at every phase boundary) copies what changed since,
so a machine without inotify still keeps one version per phase. The detection core later scans the copies
(`harness.detect.file_versions`); the run then keeps only those that carried a finding.

Bounds, stated in the record: a version larger than `MAX_BYTES` is not copied (the end-of-run scan still
reads the file's last content in full); a file is copied at most once per `SETTLE` seconds (a database's
log rewritten a hundred times a second is copied a few times; the content it has at the end of each
stretch is), so a content that lives shorter than that, or than the watcher takes to read it, can be missed;
SQLite's shared-memory index (`-shm`: page numbers, no content) is not copied, nor an empty file (truncated to
be written again: its next content is copied as soon as it is seen, not `SETTLE` later). This widens what the
audit sees; it never proves a file was empty.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from harness.core.files import write_private
from harness.detect.file_versions import FOLDER, INDEX, read_index

#: A version larger than this is not copied (a database's every page write would be copied whole).
MAX_BYTES = 1 << 20
#: A file is copied at most once in this many seconds (its last content in each stretch).
SETTLE = 0.5
#: Files that never hold content: SQLite's shared-memory index.
NO_CONTENT = ("-shm",)

log = logging.getLogger(__name__)


class FileVersions:
    """Copies of every distinct content of every regular file under `roots`, into `out/versions/`."""

    def __init__(self, roots: Iterable[Path], out: Path) -> None:
        # a root inside another root is watched through the outer one (a launch profile's home holds the others)
        roots = sorted({Path(os.path.abspath(r)) for r in roots}, key=lambda p: len(p.parts))
        self.roots = [r for i, r in enumerate(roots) if not any(r.is_relative_to(o) for o in roots[:i])]
        self.out = out
        self.folder = out / FOLDER
        self.stats = {"versions": 0, "too_large": 0, "unreadable": 0, "events": 0}
        self.mode = "phase boundaries"
        self._last: dict[Path, tuple[int, int, str]] = {}  # path -> (mtime_ns, size, sha256) of its last copy
        self._copied: dict[Path, float] = {}  # path -> when it was last copied (monotonic)
        self._due: dict[Path, float] = {}  # path -> when to copy it next (monotonic)
        self._wake = threading.Condition()
        self._stopping = False
        self._lock = threading.Lock()
        self._observer: Any = None
        self._worker = threading.Thread(target=self._work, name="file-versions", daemon=True)

    def start(self) -> FileVersions:
        """Copy what is there now, then watch (inotify); without inotify, `sweep()` alone keeps versions."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.sweep()
        try:
            observer = Observer()
            handler = _Enqueue(self)
            for root in self.roots:
                observer.schedule(handler, str(root), recursive=True)
            observer.start()
        except OSError as exc:  # no inotify instance or watch left (fs.inotify.max_user_*)
            log.warning("file versions: inotify unavailable (%s); phase boundaries only", exc)
        else:
            self._observer = observer
            self.mode = "inotify"
        self._worker.start()
        return self

    def sweep(self) -> None:
        """Copy every file whose content changed since its last copy (a phase boundary; the fallback)."""
        for root in self.roots:
            for dirpath, _, filenames in os.walk(root, followlinks=False):
                for name in filenames:
                    self._copy(Path(dirpath) / name)

    def stop(self) -> dict[str, Any]:
        """Stop watching, copy what changed last, and return what was kept (for the run's record)."""
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=10)
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._worker.is_alive():
            self._worker.join(timeout=30)
        self.sweep()
        return {"mode": self.mode, "max_bytes": MAX_BYTES, "settle": SETTLE, **self.stats}

    def changed(self, path: str) -> None:
        """A file may have a new content: copy it now, or once `SETTLE` has passed since its last copy."""
        target = Path(path)
        if target.name.endswith(NO_CONTENT):
            return
        with self._wake:
            self.stats["events"] += 1
            if target not in self._due:
                self._due[target] = self._copied.get(target, -SETTLE) + SETTLE
                self._wake.notify()

    def _work(self) -> None:
        while True:
            with self._wake:
                while not self._stopping:
                    now = time.monotonic()
                    due = min(self._due.items(), key=lambda kv: kv[1], default=None)
                    if due is not None and due[1] <= now:
                        break
                    self._wake.wait(None if due is None else due[1] - now)
                if self._stopping:
                    return  # `stop` sweeps what is still due
                path = due[0]
                del self._due[path]
                self._copied[path] = time.monotonic()
            try:
                if self._copy(path) == 0:  # emptied to be written again: its next content is not held back
                    with self._wake:
                        self._copied.pop(path, None)
                        if path in self._due:
                            self._due[path] = time.monotonic()
            except Exception:  # a watcher that stops would silently narrow the audit: log, go on
                log.exception("file versions: copying %s failed", path)

    def _copy(self, path: Path) -> int | None:
        """Copy `path`'s content if it is new for that path (read once, hashed, written 0600); 0 when it is empty
        (a file truncated to be written again, as `write_text` does: nothing to keep, no canary fits in it)."""
        try:
            st = path.lstat()
            if not stat.S_ISREG(st.st_mode) or path.is_relative_to(self.folder) or path.name.endswith(NO_CONTENT):
                return None
            if st.st_size == 0:
                return 0
            with self._lock:
                last = self._last.get(path)
            if last is not None and last[:2] == (st.st_mtime_ns, st.st_size):
                return None
            if st.st_size > MAX_BYTES:
                self.stats["too_large"] += 1
                return None
            data = path.read_bytes()
        except FileNotFoundError:  # gone already (a temporary file renamed into place)
            return None
        except OSError:
            self.stats["unreadable"] += 1
            return None
        if not data:
            return 0
        digest = hashlib.sha256(data).hexdigest()
        with self._lock:
            if last is not None and last[2] == digest:
                self._last[path] = (st.st_mtime_ns, st.st_size, digest)
                return len(data)
            self._last[path] = (st.st_mtime_ns, st.st_size, digest)
            self.stats["versions"] += 1
            name = f"{self.stats['versions']:06d}"
            entry = {"id": name, "path": os.path.relpath(path, self.out), "time": time.time(), "size": len(data),
                     "sha256": digest}
            write_private(self.folder / name, data)
            with (self.folder / INDEX).open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(entry) + "\n")
        return len(data)


class _Enqueue(FileSystemEventHandler):
    """Every event that can leave a file with a new content queues that file (a rename: its new name)."""

    def __init__(self, versions: FileVersions) -> None:
        self.versions = versions

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory or event.event_type in ("deleted", "opened", "closed_no_write"):
            return
        path = event.dest_path if event.event_type == "moved" else event.src_path
        self.versions.changed(os.fsdecode(path))


def keep_only(out: Path, ids: set[str]) -> None:
    """Remove every version but `ids` (those that carried a finding), and their index lines."""
    entries = read_index(out)
    for e in entries:
        if e.id not in ids:
            (out / FOLDER / e.id).unlink(missing_ok=True)
    kept = "".join(json.dumps(asdict(e)) + "\n" for e in entries if e.id in ids)
    if kept:
        write_private(out / FOLDER / INDEX, kept.encode())
    else:
        (out / FOLDER / INDEX).unlink(missing_ok=True)
        if (out / FOLDER).is_dir() and not any((out / FOLDER).iterdir()):
            (out / FOLDER).rmdir()

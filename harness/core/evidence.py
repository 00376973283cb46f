"""The evidence folder: where each of its files is (the names of `core.files`), its permissions (folders 0700,
files 0600) and its preparation, for a run, for the reports of `reconcile --out` and for a matrix: the one place
an output folder is made."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from harness.core.files import (
    BASELINE_COPY,
    FLOWS,
    PHASE_FILE,
    POLICY_COPY,
    RECORD,
    REGISTRY,
    SERVICE_RECORDS,
    STUB_LOG,
    seal,
)
from harness.core.places import evidence_root


class UsageError(ValueError):
    """Bad options or output folder; one line, exit 2."""


@dataclass(frozen=True)
class EvidenceFolder:
    """An evidence folder and the paths of its files."""

    path: Path

    @property
    def registry(self) -> Path:
        return self.path / REGISTRY

    @property
    def flows(self) -> Path:
        return self.path / FLOWS

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def record(self) -> Path:
        return self.path / RECORD

    @property
    def stub_log(self) -> Path:
        return self.path / STUB_LOG

    @property
    def phase_file(self) -> Path:
        return self.path / PHASE_FILE

    @property
    def baseline_copy(self) -> Path:
        return self.path / BASELINE_COPY

    @property
    def policy_copy(self) -> Path:
        return self.path / POLICY_COPY

    @property
    def service_records(self) -> Path:
        return self.path / SERVICE_RECORDS

    @classmethod
    def for_run(cls, out: Path | None, force: bool) -> EvidenceFolder:
        """A run's folder: new (a time stamp under `evidence_root` when `out` is None), or empty, or (with
        --force) an earlier evidence folder emptied; mode 0700."""
        if out is None:
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
            out = evidence_root() / stamp
            n = 1
            while out.exists():
                out = evidence_root() / f"{stamp}-{n}"
                n += 1
        out = out.resolve()
        created = not out.exists()
        if not created:
            if not out.is_dir():
                raise UsageError(f"--out {out} exists and is not a directory")
            try:
                empty = not any(out.iterdir())
            except OSError as exc:
                raise UsageError(f"--out {out}: cannot list it ({exc.strerror or exc})") from None
            if not empty:
                if not force:
                    raise UsageError(f"--out {out} exists and is not empty (pass --force to replace it)")
                if not cls(out).registry.exists():
                    raise UsageError(f"--out {out} is not an evidence folder; refusing to empty it even with --force")
                try:
                    shutil.rmtree(out)
                except OSError as exc:
                    raise UsageError(f"--out {out}: cannot empty it ({exc.strerror or exc})") from None
        return cls.create(out, created)

    @classmethod
    def for_reports(cls, out: Path, evidence: Path | None) -> EvidenceFolder:
        """The folder `reconcile --out` writes the reports of `evidence` (never that folder itself) to."""
        if evidence is not None and out.resolve() == evidence.resolve():
            raise UsageError(f"reconcile: --out {out} is the evidence folder itself; pass another folder")
        if out.exists() and not out.is_dir():
            raise UsageError(f"reconcile: --out {out} exists and is not a directory")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"reconcile: cannot create --out {out}: {exc.strerror or exc}") from None
        return cls(out)

    @classmethod
    def create(cls, out: Path, created: bool) -> EvidenceFolder:
        """Create `out` with mode 0700 and prove it writable here and now (not a read-only or pseudo file system).
        On failure the folder is removed again if it is new (`created`), and the error is one line."""
        try:
            out.mkdir(parents=True, exist_ok=True)
            out.chmod(0o700)
            with tempfile.TemporaryFile(dir=out):
                pass
        except OSError as exc:
            if created:
                with contextlib.suppress(OSError):
                    out.rmdir()
            raise UsageError(f"--out {out}: cannot create a writable folder there ({exc.strerror or exc})") from None
        return cls(out)

    def subfolder(self, name: str = "") -> Path:
        """Make the folder `name` inside it (or itself) if it is not there yet, mode 0700."""
        path = self.path / name if name else self.path
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return path

    def discard(self) -> None:
        """A run that failed before it audited anything leaves no half-written evidence folder."""
        shutil.rmtree(self.path, ignore_errors=True)

    def seal(self) -> None:
        """Every file 0600, every folder 0700."""
        seal(self.path)

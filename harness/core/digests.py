"""The digests of a folder: every entry's SHA-256 by its path, and how two such lists differ, file by file.

A regular file is hashed as its bytes; a symlink (never followed) as its target's path; anything else (a fifo, a
socket, a device) as nothing, with its kind, so that one of them turning into another kind is a change too. Empty
folders carry no data and are not listed.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO


class ManifestError(ValueError):
    """A manifest or key that is missing, unreadable or malformed, or a file that cannot be read; one line, exit 2."""


@dataclass(frozen=True)
class Digest:
    """One entry of a folder: its SHA-256 (hex) and its kind (`file`, `symlink`, `fifo`, `socket`, `device`)."""

    sha256: str
    kind: str = "file"


def _open(path: Path) -> BinaryIO:
    """Open a file to hash it (a seam: the tests run as root, who reads a mode-0000 file)."""
    return path.open("rb")


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    return "socket" if stat.S_ISSOCK(mode) else "device"


def _entries(folder: Path, rel: str = "") -> Iterator[tuple[str, Path, os.stat_result]]:
    """(relative POSIX path, path, lstat) of every entry but folders, depth first, symlinks not followed."""
    try:
        with os.scandir(folder) as it:
            listed = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        raise ManifestError(f"cannot list {rel or '.'}: {exc.strerror or exc}") from None
    for entry in listed:
        name = f"{rel}/{entry.name}" if rel else entry.name
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            yield from _entries(Path(entry.path), name)
        else:
            yield name, Path(entry.path), st


def digest_of(path: Path, rel: str, mode: int) -> Digest:
    """The digest of one entry (`rel`: its name in errors)."""
    if stat.S_ISREG(mode):
        try:
            with _open(path) as fh:
                return Digest(hashlib.file_digest(fh, "sha256").hexdigest())
        except OSError as exc:
            raise ManifestError(f"cannot read {rel}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(mode):
        return Digest(hashlib.sha256(os.fsencode(os.readlink(path))).hexdigest(), "symlink")
    return Digest(hashlib.sha256(b"").hexdigest(), _kind(mode))


def folder_digests(folder: Path, leave_out: frozenset[str] = frozenset()) -> dict[str, Digest]:
    """Relative POSIX path -> digest of every entry under `folder` but those named in `leave_out`, in path order."""
    return {rel: digest_of(path, rel, st.st_mode) for rel, path, st in _entries(folder) if rel not in leave_out}


def differences(recorded: Mapping[str, Digest], found: Mapping[str, Digest]) -> list[str]:
    """One line per entry that differs, in path order: `changed: PATH`, `added: PATH` (not recorded) or
    `missing: PATH` (recorded, not there)."""
    lines = []
    for rel in sorted(recorded.keys() | found.keys()):
        if rel not in found:
            lines.append(f"missing: {rel}")
        elif rel not in recorded:
            lines.append(f"added: {rel}")
        elif recorded[rel] != found[rel]:
            lines.append(f"changed: {rel}")
    return lines

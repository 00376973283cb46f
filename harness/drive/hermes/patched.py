"""A copy of a Hermes install with a patch (or a series of them) applied, beside the original: what `patch-check`
and `mutants` audit.

The patch is a unified diff whose paths are relative to the install's site-packages (`a/gateway/...`,
`b/gateway/...`, as `diff -ru` of two site-packages writes them); it is applied with `git apply -p1`, checked
first, so a patch that does not apply leaves nothing behind, and its error names the first hunk that failed. The
copy hard-links every file of the venv but the ones the patch changes, which get files of their own before it is
applied: the original is never touched (a venv on another file system is copied instead).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
from pathlib import Path

from harness.core.evidence import UsageError

#: The files a unified diff changes: its `+++ b/PATH` lines (and `--- a/PATH` for a deletion).
_TARGET = re.compile(r"^(?:\+\+\+ b/|--- a/)(\S+)", re.MULTILINE)
#: A file's header line and a hunk's, in a unified diff.
_FILE = re.compile(r"^(?:\+\+\+ b/|--- a/)(\S+)")
_HUNK = re.compile(r"^(@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@)")
#: git apply's words for a hunk whose context is not found: the file and the hunk's first line.
_FAILED = re.compile(r"patch failed: (\S+):(\d+)")


def site_packages(venv: Path) -> Path:
    """The venv's site-packages (UsageError if it is not a venv)."""
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not (venv / "pyvenv.cfg").is_file() or not found:
        raise UsageError(f"{venv} is not a Python venv (no pyvenv.cfg or no lib/python3*/site-packages)")
    return found[0]


def targets(patch: Path) -> list[str]:
    """The paths a patch changes, relative to site-packages (UsageError if it is unreadable or changes none)."""
    try:
        text = patch.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"patch {patch} is not readable ({getattr(exc, 'strerror', None) or type(exc).__name__})"
                         ) from None
    paths = sorted({p for p in _TARGET.findall(text) if p != "/dev/null"})
    if not paths or any(".." in Path(p).parts or p.startswith("/") for p in paths):
        raise UsageError(f"patch {patch} names no file under site-packages (paths must be a/PATH, b/PATH)")
    return paths


class PatchError(UsageError):
    """A patch that does not apply: which one, and what failed (`failing_hunk`)."""

    def __init__(self, patch: Path, site: Path, failed: str) -> None:
        super().__init__(f"patch {patch} does not apply to {site}: {failed}")
        self.patch = patch
        self.failed = failed


def failing_hunk(text: str, stderr: str) -> str:
    """What `git apply` could not do, in a few words: `hunk @@ -L,N +L,N @@ of FILE` for a hunk whose context is
    not there (the hunk of the patch `text` it names), else git's first error."""
    failed = _FAILED.search(stderr)
    if failed:
        name, line, current = failed.group(1), failed.group(2), ""
        for row in text.splitlines():
            if (header := _FILE.match(row)) and header.group(1) != "/dev/null":
                current = header.group(1)
            elif (hunk := _HUNK.match(row)) and current == name and hunk.group(2) == line:
                return f"hunk {hunk.group(1)} of {name}"
    first = (stderr.strip().splitlines() or ["git apply failed"])[0]
    return first.removeprefix("error: ")


def _git_apply(site: Path, patch: Path, *, check: bool) -> None:
    argv = ["git", "apply", "-p1", *(["--check"] if check else []), str(patch.absolute())]
    # never inside a repository (a venv in a checkout): as GNU patch, relative to site-packages
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(site.parent)}
    done = subprocess.run(argv, cwd=site, env=env, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        failed = failing_hunk(patch.read_text(encoding="utf-8", errors="replace"), done.stderr)
        raise PatchError(patch, site, failed)


def _link(src: str, dst: str) -> None:
    """A hard link, or a copy when `dst` is on another file system."""
    try:
        os.link(src, dst)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        shutil.copy2(src, dst)


def patched_copy(python: Path, patches: Path | list[Path], dest: Path) -> Path:
    """Copy the venv of `python` to `dest` with `patches` applied in order (one patch, or a series: a fix on top of
    the fixes it needs); the copy's python. The first patch is checked against the original before anything is
    written, each next one against the copy as the ones before it left it (UsageError, and no copy left behind,
    if one does not apply)."""
    series = [patches] if isinstance(patches, Path) else list(patches)
    venv = python.parent.parent
    site = site_packages(venv)
    changed = sorted({rel for patch in series for rel in targets(patch)})
    _git_apply(site, series[0], check=True)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(venv, dest, symlinks=True, copy_function=_link)
    copy_site = dest / site.relative_to(venv)
    for rel in changed:  # a file of its own before a patch writes it: the original keeps its inode
        path = copy_site / rel
        if path.is_file():
            data = path.read_bytes()
            path.unlink()
            path.write_bytes(data)
    try:
        for patch in series:  # `git apply` writes all of a patch or none of it
            _git_apply(copy_site, patch, check=False)
    except PatchError:
        shutil.rmtree(dest)
        raise
    return dest / "bin" / python.name

"""The twin: a Hermes install with a fix series applied, built once and cached by the series' hash.

A series file lists patches (`drive.hermes.patched`'s kind: paths under site-packages), one a line, in the order they
apply, each on top of the ones before it; `#` starts a comment, and a name is relative to the series file's
folder (docs/fixes/series). The twin is `patched.patched_copy` of the install with every patch applied, kept in
the twin cache under a key hashed from the install's venv (its path and lock stamp) and every patch's name and
bytes, in order: another patch, order or install is another twin, and the same ones are never built twice. It is
built in a hidden temporary folder and renamed into place only once every patch applied, so a folder named after a
key is always a whole twin; a patch that does not apply leaves nothing in the cache (UsageError naming the patch and
its first failing hunk).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from harness.core.evidence import UsageError
from harness.core.files import write_private
from harness.core.places import CHECKOUT, cache_dir
from harness.drive.hermes.patched import PatchError, patched_copy, targets

#: Hex digits of the series' hash in the name of a cached twin.
KEY_DIGITS = 16
#: The file in a twin's venv that says what it was built from.
RECORD = "twin.json"
#: A hidden temporary folder older than this is the leftover of a killed build.
STALE_SECONDS = 3600.0


def cache_root() -> Path:
    """Where twins are kept: `.hermes-twins/` of the checkout (beside `.hermes-venv/`, so hard links work), else
    `$XDG_CACHE_HOME/tenancy-audit/twins`."""
    return CHECKOUT / ".hermes-twins" if CHECKOUT else cache_dir() / "twins"


def read_series(series: Path) -> list[Path]:
    """The patches a series file lists, in order (UsageError if it is unreadable, empty, names a patch twice or
    one that is not a file)."""
    try:
        lines = series.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"series {series} is not readable ({getattr(exc, 'strerror', None) or type(exc).__name__})"
                         ) from None
    names = [n for n in (line.split("#", 1)[0].strip() for line in lines) if n]
    if not names:
        raise UsageError(f"series {series} lists no patch")
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise UsageError(f"series {series} lists {twice} twice")
    patches = [series.parent / n for n in names]
    missing = next((p for p in patches if not p.is_file()), None)
    if missing is not None:
        raise UsageError(f"series {series} lists {missing.name}, which is not a file ({missing})")
    return patches


def changes_of(series: Path, rel: str) -> str:
    """Which patches of `series` change `rel` (a path under site-packages), in words: why a line of it may not be
    in the twin as it is in the install."""
    by = [p.name for p in read_series(series) if rel in targets(p)]
    return f"the series changes {rel} ({', '.join(by)})" if by else f"no patch of the series changes {rel}"


def series_key(python: Path, patches: list[Path]) -> str:
    """The twin's cache key: the install's venv (its real path and the lock stamp it was installed from) and every
    patch's name and bytes, in order."""
    venv = python.parent.parent
    digest = hashlib.sha256(f"twin 1\0{os.path.realpath(venv)}\0".encode())
    stamp = venv / ".stamp"
    digest.update(stamp.read_bytes() if stamp.is_file() else b"-")
    for patch in patches:
        digest.update(f"\0{patch.name}\0".encode())
        digest.update(hashlib.sha256(patch.read_bytes()).digest())
    return digest.hexdigest()[:KEY_DIGITS]


def _drop_stale(root: Path) -> None:
    for tmp in root.glob(".tmp-*"):
        if time.time() - tmp.stat().st_mtime > STALE_SECONDS:
            shutil.rmtree(tmp, ignore_errors=True)


def twin(python: Path, series: Path, say: Callable[[str], None], root: Path | None = None) -> Path:
    """The python of the twin of `python`'s install with `series` applied: the cached one, else built now (one
    progress line either way). UsageError, and nothing left in the cache, when a patch does not apply."""
    patches = read_series(series)
    root = root or cache_root()
    key = series_key(python, patches)
    final = root / key
    built = final / "bin" / python.name
    if (final / RECORD).is_file() and built.exists():
        say(f"twin: {series} ({len(patches)} patches) cached at {final}")
        return built
    started = time.monotonic()
    try:
        root.mkdir(parents=True, exist_ok=True)
        _drop_stale(root)
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".tmp-{key}-"))
    except OSError as exc:
        raise UsageError(f"cannot create the twin cache {root}: {exc.strerror or exc}") from None
    try:
        copy = tmp / "venv"
        try:
            patched_copy(python, patches, copy)
        except PatchError as exc:
            number = patches.index(exc.patch) + 1
            raise UsageError(f"series {series}: {exc.patch.name} (patch {number} of {len(patches)}) does not apply "
                             f"on top of the ones before it: {exc.failed}") from None
        record = {"series": str(series), "patches": [p.name for p in patches], "base": str(python.parent.parent)}
        write_private(copy / RECORD, json.dumps(record, indent=2).encode())
        try:
            copy.rename(final)
        except OSError:  # another run built it meanwhile
            if not (final / RECORD).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"twin: {series} ({len(patches)} patches) built in {time.monotonic() - started:.0f}s at {final}")
    return built


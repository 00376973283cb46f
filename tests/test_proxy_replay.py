"""bench/proxy_replay.py starts its mitmdumps side by side on one confdir: their CA must be there, whole, before the
first of them starts (each would otherwise write it while another reads it, and one read a half-written key)."""

from __future__ import annotations

import importlib.util
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest
from mitmproxy.certs import CertStore

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


def _load() -> ModuleType:
    """bench/proxy_replay.py as a module (it imports its siblings in bench/, so bench/ is on the path meanwhile)."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_proxy_replay", BENCH / "proxy_replay.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


proxy_replay = _load()


def test_every_proxy_of_a_round_starts_on_a_whole_ca(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with tarfile.open(ROOT / "tests" / "data" / "scenarios" / "oneshot.tar.xz") as archive:
        archive.extractall(tmp_path, filter="data")
    rec = proxy_replay.load(tmp_path / "oneshot", limit=1)
    root = tmp_path / "run"
    root.mkdir()
    (root / "recorded.yaml").write_bytes((tmp_path / "oneshot" / "registry.yaml").read_bytes())
    confdir = root / "confdir"
    keys: list[bytes] = []

    def spawn(procs: object, argv: list[str], ports: list[int], log: Path, env: object = None,
              cpus: object = None) -> object:
        assert f"confdir={confdir}" in argv
        store = CertStore.from_files(confdir / "mitmproxy-ca.pem", confdir / "mitmproxy-dhparam.pem")
        keys.append(store.default_ca.to_pem())
        return proxy_replay.Child(None, ports, log)

    monkeypatch.setattr(proxy_replay, "spawn", spawn)
    monkeypatch.setattr(proxy_replay, "ready", lambda children: None)
    trees = {"plain": None, "stream": None, "addon": ROOT}
    proxies = proxy_replay.start(None, rec, root, 9, trees, None, None)
    assert [p.name for p in proxies] == list(trees)
    assert len(keys) == 3 and len(set(keys)) == 1  # one CA, made before the first proxy started

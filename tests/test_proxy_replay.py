"""bench/proxy_replay.py starts its mitmdumps side by side on one confdir: their CA must be there, whole, before the
first of them starts (each would otherwise write it while another reads it, and one read a half-written key)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
from mitmproxy.certs import CertStore

from tests.bench_modules import load_bench

ROOT = Path(__file__).resolve().parent.parent
proxy_replay = load_bench("proxy_replay")


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

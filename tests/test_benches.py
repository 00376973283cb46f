"""Every bench under bench/ runs in its smoke mode and prints its figures, so a change to the harness that breaks a
bench fails here, not on the day someone needs its figures.

Each bench's `--smoke` takes seconds (its docstring says what it runs and proves); the benches that need real Hermes
(audit, repeat, soak_kill) run one small audit each. A run must exit 0 and print every figure its patterns name: each
pattern must match the bench's stdout, and every number a pattern captures must be positive. A module of bench/ that
no other module imports or names is a bench, and must have a smoke run here.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
SCENARIOS = ROOT / "tests" / "data" / "scenarios"
#: A smoke run takes seconds; this is a hang, not a slow machine.
TIMEOUT = 300
NUMBER = r"([0-9]+(?:\.[0-9]+)?)"


@dataclass(frozen=True)
class Smoke:
    """One smoke run: `bench/<bench>.py ARGS` (`{evidence}`: the recorded one-shot evidence folder), the patterns
    its stdout must match, and whether it runs Hermes. In a pattern `%N` is a figure that must be positive (every
    group a pattern captures is one), `%T` one that may print as zero on a fast machine (a time of milliseconds)."""

    bench: str
    args: tuple[str, ...]
    figures: tuple[str, ...]
    hermes: bool = False

    def patterns(self) -> list[re.Pattern[str]]:
        return [re.compile(p.replace("%N", NUMBER).replace("%T", r"\d+\.\d+"), re.MULTILINE) for p in self.figures]


SMOKES = {
    "scan": Smoke("scan", ("--smoke",), (
        r"^corpus: \d+ files \(bin, db, logs\)",
        r"^Matcher\.find \(1 thread\) +%N +1\.00x +%N hits",
        r"^naive data\.find loop \(1 MiB\) +%N +%Nx",
        r"^scan_tree \(streams \+ SQLite cells\) +%N +%Nx +%N secret findings .*peak RSS %N MiB",
        r"^ +8 +%N +\d+\.\d+ +%N +%N$",
        r"^  %N MB/s, peak RSS %N MiB, the key found$")),
    "scan --ref": Smoke("scan", ("--smoke", "--ref", "HEAD"), (
        r"^Matcher\.find +%N +%N +%Nx +\[%N, %N\] +(?P<hits>\d+)/(?P=hits)$",
        r"^scan_tree +%N +%N +%Nx +\[%N, %N\] +(?P<found>\d+)/(?P=found)$",
        r"^new/HEAD MB/s: %Nx$",
        r"the key found$")),
    "hooks": Smoke("hooks", ("--smoke",), (
        r"^json +%T +%T +%T +%T +%Nx +%T$",
        r"^sse +%T +%T +%T +%T +%Nx +%T$")),
    "loop": Smoke("loop", ("--smoke",), (r"^json +%N +%N +%N$", r"^sse +%N +%N +%N$")),
    "websocket": Smoke("websocket", ("--smoke",), (
        r"^hooks: %N s \(%N us/message; the end of the connection %T s of it\); without them: %T s$",
        r"^proxy, 100 messages each way: with the addon %N s, plain mitmdump %N s \(%Nx")),
    "proxy": Smoke("proxy", ("--smoke", "--workers", "1"), (
        r"^addon: 1 scan worker\(s\) each",
        r"^json +1KiB +1 +addon-fwd +%N +%N +%N$",
        r"^  json +1 KiB conc +1 +addon-rev +/ plain-rev +%Nx",
        r"^  sse +1 KiB conc +2 +addon-fwd +/ stream-fwd +%Nx",
        r"^  json +1 KiB conc +2 +stream-rev / plain-rev +%Nx",
        r"^addon-rev +%N +%N +[+-]\d+\.\d+ ms +[+-]\d+\.\d+ ms$",
        r"^the addons' scan workers used \d+\.\d s of CPU in all$",
        r"^addon ledgers: %N flows, 0 flagged")),
    "proxy --replay": Smoke("proxy", ("--replay", "{evidence}", "--smoke"), (
        r"^replay oneshot: 40 flows to %N listeners of %N tenants, \d+\.\d MB of requests",
        r"^  round 1: %N s; plain %T s \(%T s CPU\), stream %T s \(%T s CPU\), addon %T s \(%T s CPU\); "
        r"ledgers: addon 40 flows, \d+ flagged$",
        r"^  oneshot +addon +/ plain +throughput +%Nx \[%N, %N\] +CPU ",
        r"^  oneshot +addon +/ stream +throughput +%Nx")),
    "incidents": Smoke("incidents", ("{evidence}", "--smoke"), (
        r": %N findings, %N incidents, 1 rounds",
        r"^A reconcile +%N s$",
        r"^building the incidents +%T s +\(%T% of A\)$")),
    "detection": Smoke("detection", ("--smoke",), (
        r"^\| response\.sse \| %N \| 0 \| 0 \| %N \| 1\.0000 \| 0\.0000 \| 1\.0000 \|",
        r"^\| saved-flows \| %N \| 0 \| 0 \| %N \|",
        r"^\| \*\*overall\*\* \| %N \| 0 \| 0 \| %N \| 1\.0000 \| 0\.0000 \| 1\.0000 \|")),
    "audit": Smoke("audit", ("--smoke",), (
        r"^ +2 +0 +%N +%N +%Nx$",
        r"^ +hermes turns +%N s/run",
        r"^ +reconcile: scan_tree +\d+\.\d+ s/run",
        r"^  2 tenants: audit/bare %Nx \(audit %N s, bare %N s\)$"), hermes=True),
    "repeat": Smoke("repeat", ("--scenario", "oneshot", "--smoke"), (
        r"^ +1 +0 +clean +%N +-$",
        r"^verdict against baselines/oneshot\.json: the same in 1/1 runs \(exit 0, clean\)$"), hermes=True),
    "scale": Smoke("scale", ("--smoke",), (
        r"^ +2 +1 +%N +%N +%N +%T +%N +%N +%N +%N +%N +%N +\d+ +%N$",
        r"^plot: %N bytes$"), hermes=True),
    "soak_kill": Smoke("soak_kill", ("--smoke",), (
        r"^kill +1 SIGKILL processes at kill +%N +survivors 0 +all gone after +%Ns$",
        r"^soak: 1 kills, 0 survivors$"), hermes=True),
}


def _referred(path: Path, names: set[str]) -> set[str]:
    """The modules of bench/ (`names`) that `path` imports, or names as a file (a string that is the file's name
    or ends in `/` and it: a mitmdump script)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found |= {name for name in names if node.value.rsplit("/", 1)[-1] == f"{name}.py"}
    return found & names


def benches() -> set[str]:
    """The modules of bench/ that no other one imports or names: the benches (the rest are their parts)."""
    names = {path.stem for path in BENCH.glob("*.py")}
    helpers = {name for path in BENCH.glob("*.py") for name in _referred(path, names - {path.stem})}
    return names - helpers


def test_every_bench_has_a_smoke_run_and_says_what_it_does() -> None:
    assert benches() == {smoke.bench for smoke in SMOKES.values()}
    for name in benches():
        doc = ast.get_docstring(ast.parse((BENCH / f"{name}.py").read_text(encoding="utf-8"))) or ""
        assert "`--smoke`" in doc, f"bench/{name}.py: its docstring does not say what --smoke runs"


def test_the_discovery_tells_a_bench_from_its_parts(tmp_path: Path) -> None:
    names = {"runner", "part", "script", "lone"}
    (tmp_path / "runner.py").write_text('"""Like lone.py."""\nimport part\nSCRIPT = "bench/script.py"\n')
    assert _referred(tmp_path / "runner.py", names - {"runner"}) == {"part", "script"}
    (tmp_path / "lone.py").write_text('"""Not runner.py."""\nimport json\nprint("see bench/runner.py too")\n')
    assert _referred(tmp_path / "lone.py", names - {"lone"}) == set()


@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.e2e] if smoke.hermes else [])
                                  for name, smoke in SMOKES.items()])
def test_a_bench_runs_and_prints_its_figures(name: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    smoke = SMOKES[name]
    env = dict(os.environ)
    if smoke.hermes:
        env["TENANCY_HERMES_PYTHON"] = str(request.getfixturevalue("hermes_python"))
    args = list(smoke.args)
    if "{evidence}" in args:
        with tarfile.open(SCENARIOS / "oneshot.tar.xz") as archive:
            archive.extractall(tmp_path, filter="data")
        args = [str(tmp_path / "oneshot") if a == "{evidence}" else a for a in args]
    done = subprocess.run([sys.executable, str(BENCH / f"{smoke.bench}.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, f"bench/{smoke.bench}.py {' '.join(args)}: exit {done.returncode}\n" \
                                 f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    for pattern in smoke.patterns():
        match = pattern.search(done.stdout)
        assert match, f"bench/{smoke.bench}.py printed no line matching {pattern.pattern!r}:\n{done.stdout[-3000:]}"
        numbers = [float(g) for g in match.groups()]
        assert all(n > 0 for n in numbers), f"{pattern.pattern!r}: a figure is not positive in {match.group(0)!r}"
    if name == "incidents":  # the recorded folder's own counts
        expected = json.loads((SCENARIOS / "expected.json").read_text())["oneshot"]
        counts = re.search(r": (\d+) findings, (\d+) incidents", done.stdout)
        assert counts and [int(c) for c in counts.groups()] == [expected["findings"]["size"],
                                                                  expected["incidents"]["size"]]

"""The GitHub Actions workflows in docs/ci.md: valid YAML whose every shell step runs, as written, commands the
CLI accepts (each `run:` step is executed by bash with `./tenancy` and `.venv/bin/tenancy-audit` replaced by
a recorder; the recorded arguments then go through the real parser and the checks `run` and `matrix` make
before they start anything)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness import arguments
from harness.options import UsageError, check_matrix_options, check_options

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "ci.md"
RECORDER = """#!/bin/sh
printf '%s\\0' "$0" "$@" >> "$RECORD"; printf '\\n' >> "$RECORD"
"""
#: Values for the `${{ ... }}` expressions the workflows use.
EXPRESSIONS = {"matrix.shard": "2", "steps.audit.outputs.code": "0"}


def workflows(text: str | None = None) -> dict[str, dict]:
    blocks = re.findall(r"^```yaml\n(.*?)^```", text or DOC.read_text(), flags=re.M | re.S)
    return {(doc := yaml.safe_load(b))["name"]: doc for b in blocks}


def expand(script: str) -> str:
    def value(m: re.Match[str]) -> str:
        name = m.group(1).strip()
        if name not in EXPRESSIONS:
            raise AssertionError(f"docs/ci.md: no test value for the expression {name!r}")
        return EXPRESSIONS[name]
    return re.sub(r"\$\{\{(.*?)\}\}", value, script)


def run_steps(workflow: dict, job: str, tmp_path: Path) -> list[list[str]]:
    """Run a job's shell steps in a scratch folder with recorders; the recorded command lines."""
    tmp_path.mkdir(exist_ok=True)
    record = tmp_path / "record"
    for tool in ("tenancy", ".venv/bin/tenancy-audit"):
        (tmp_path / tool).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / tool).write_text(RECORDER)
        (tmp_path / tool).chmod(0o755)
    (tmp_path / ".hermes-venv" / "bin").mkdir(parents=True)  # what the bootstrap step makes
    (tmp_path / ".hermes-venv" / "bin" / "python").symlink_to(sys.executable)
    (tmp_path / "matrix").mkdir()
    (tmp_path / "matrix" / "matrix.md").write_text("matrix\n")
    env = {"PATH": os.environ["PATH"], "RECORD": str(record), "GITHUB_OUTPUT": str(tmp_path / "out"),
           "GITHUB_STEP_SUMMARY": str(tmp_path / "summary"), **{k: str(v) for k, v in workflow.get("env", {}).items()}}
    for step in workflow["jobs"][job]["steps"]:
        if "run" in step:
            done = subprocess.run(["bash", "-eo", "pipefail", "-c", expand(step["run"])], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=30)
            assert done.returncode == 0, f"{job}: step {step.get('name')!r} failed: {done.stderr}"
    lines = record.read_text().split("\0\n") if record.exists() else []
    return [line.split("\0") for line in lines if line]


def parse(argv: list[str]) -> object:
    """The namespace the real CLI makes of a recorded command line (`./tenancy audit` is `tenancy-audit run`),
    after the checks its command makes before it starts (SystemExit or UsageError for a bad one)."""
    tool, *args = argv
    if tool.endswith("/tenancy"):
        assert args[:1] == ["audit"], f"./tenancy takes audit or test, not {shlex.join(args)}"
        args = ["run", *args[1:]]
    if "--help" in args:
        return None
    parsed = arguments.parser().parse_args(args)
    if parsed.command == "run":
        check_options(arguments.run_options(parsed))
    elif parsed.command == "matrix":
        check_matrix_options(arguments.matrix_options(parsed))
    return parsed


def test_the_audit_workflow_runs_a_baselined_audit_and_passes_its_code_on(tmp_path):
    commands = run_steps(workflows()["tenancy-audit"], "audit", tmp_path)
    assert len(commands) == 1
    args = parse(commands[0])
    assert args.command == "run" and (REPO / args.baseline).is_file()
    assert (tmp_path / "out").read_text() == "code=0\n"


def test_the_matrix_workflow_runs_its_shard_and_merges_every_shard(tmp_path):
    flow = workflows()["tenancy-matrix"]
    shard = [parse(c) for c in run_steps(flow, "shard", tmp_path / "shard")]
    run = [a for a in shard if a is not None]
    assert len(shard) == 2 and len(run) == 1  # the bootstrap, then the shard
    assert run[0].command == "matrix" and run[0].shard == f"2/{flow['env']['SHARDS']}"
    releases = run[0].hermes.split(",")
    assert [r.split("=")[0] for r in releases] == flow["env"]["RELEASES"].split(",")
    assert releases[-1] == f"0.19.0={tmp_path / 'shard'}/.hermes-venv/bin/python"
    assert len(flow["jobs"]["shard"]["strategy"]["matrix"]["shard"]) == flow["env"]["SHARDS"]
    merged = [parse(c) for c in run_steps(flow, "merge", tmp_path / "merge")]
    assert [a.command for a in merged if a is not None] == ["merge"]
    assert (tmp_path / "merge" / "summary").read_text() == "matrix\n"


@pytest.mark.parametrize(("good", "bad"), [("--shard ", "--shards "), ("--fail-on never", "--fail-on no"),
                                            ("matrix --hermes", "matrix --hermes-python"),
                                            ("/$SHARDS", "/1"), ("--scenario all", "--scenario alll"),
                                            ("--runs 2", "--runs 0"), ("RELEASES: 0.16.0,", "RELEASES: 0.16,,")])
def test_a_command_the_cli_refuses_fails_the_check(tmp_path, good, bad):
    """Negative control: the matrix workflow with one mistyped option or value is refused by the check."""
    text = DOC.read_text()
    assert good in text
    flow = workflows(text.replace(good, bad))["tenancy-matrix"]
    with pytest.raises((SystemExit, UsageError)):
        for job in ("shard", "merge"):
            [parse(c) for c in run_steps(flow, job, tmp_path / job)]

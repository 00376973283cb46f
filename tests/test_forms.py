"""The argument and configuration forms the battery drives (`drive.forms`, `services.aux`): a relative path's result
that holds another tenant's data is a `wrong_path` the file tools' policy does not allow, while the same data
through an absolute path stays what they share by design; the plants only the right resolution passes; the run-time
forms of the auxiliary settings go to the second tenant only; the three mutants of these forms fit Hermes 0.19.0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from harness.capture.stubs.provider import ToolStep
from harness.core.registry import Registry, mint
from harness.detect.checks import RawRequest, check_request_leaks, request_facts
from harness.detect.engine.matcher import matcher_for
from harness.detect.routes import Route, endpoint_of
from harness.drive import battery, forms, services
from harness.drive.hermes.patched import site_packages
from harness.drive.services import aux
from harness.drive.surface import Where
from harness.proof.mutants import MUTANTS
from harness.report import policy


@pytest.fixture
def reg(tmp_path: Path) -> Registry:
    r = mint(["default", "alpha"], tmp_path / "work", {"default": {"listen": 44001}, "alpha": {"listen": 44002}})
    services.mint(r, ["aux"])
    for t in r:
        for kind, prefix in battery.KINDS.items():
            r.add_canary(t.name, kind, f"{prefix}-{t.name}-{t.canaries['soul'][-18:]}")
    return r


def _result_of(reg: Registry, step: ToolStep, content: str) -> list:
    """The findings of alpha's provider request whose conversation holds `step`'s call and `content` as its result."""
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {
                    "name": step.tool, "arguments": json.dumps(step.args)}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": content}]
    raw = RawRequest("f1", "POST", "/v1/chat/completions", [], json.dumps({"model": reg["alpha"].model,
                                                                           "messages": messages}).encode())
    req = request_facts(reg, matcher_for(reg), raw, endpoint_of(reg, Route("reverse", listen_port=44002)))
    report = req.report()
    check_request_leaks(req, report)
    return report.findings


def test_a_relative_path_answered_with_another_tenants_data_is_a_wrong_path_no_policy_allows(reg):
    """Plant: alpha's relative read answered with default's note (resolved against the process's cwd, where every
    tenant's note is). Near misses: its own note (the right resolution); default's note through an absolute path
    (the file tools' reach, allowed by the policy)."""
    theirs = reg["default"].canaries["relative_note"]
    [wrong] = _result_of(reg, ToolStep("read_file", {"path": forms.RELATIVE}), json.dumps({"content": theirs}))
    assert (wrong.kind, wrong.victim, wrong.seen_in, wrong.canary, wrong.tool) == (
        "wrong_path", "default", "alpha", "relative_note", "read_file")
    assert forms.RELATIVE in wrong.detail
    own = reg["alpha"].canaries["relative_note"]
    assert _result_of(reg, ToolStep("search_files", {"path": ".", "pattern": "x"}), json.dumps({"c": own})) == []
    absolute = _result_of(reg, ToolStep("read_file", {"path": f"/w/{forms.RELATIVE}"}), json.dumps({"c": theirs}))
    tilde = _result_of(reg, ToolStep("read_file", {"path": f"~/{forms.RELATIVE}"}), json.dumps({"c": theirs}))
    assert [(f.kind, f.tool) for f in absolute + tilde] == [("request_leak", "read_file")] * 2
    hermes = policy.load("hermes")
    kept, allowed = hermes.apply(absolute + tilde, "default")
    assert kept == [] and [f.scope for f in allowed] == ["allowed:hermes/read_file-1"] * 2
    assert hermes.apply([wrong], "default") == ([wrong], [])


def test_the_plants_only_the_right_resolution_passes(reg, tmp_path):
    """Each workdir holds its own note under the relative path, and its neighbour's where its own relative write
    goes; the process's cwd holds every tenant's note under the relative path."""
    class Ctx:  # what `lay_relative` reads of a run's context
        registry = reg
        sandbox = type("S", (), {"home": tmp_path / "home"})()
    Ctx.sandbox.home.mkdir()
    for t in reg:
        Path(t.canaries["workdir"]).mkdir(parents=True)
    forms.lay_relative(Ctx, {"default": "alpha", "alpha": "default"})  # type: ignore[arg-type]
    notes = {t.name: t.canaries["relative_note"] for t in reg}
    for t in reg:
        workdir = Path(t.canaries["workdir"])
        assert (workdir / forms.RELATIVE).read_text().split() == [notes[t.name]]
        assert (workdir / forms.RELATIVE_WRITTEN).read_text().split() == [notes["alpha" if t.name == "default"
                                                                               else "default"]]
    assert sorted((tmp_path / "home" / forms.RELATIVE).read_text().split()) == sorted(notes.values())
    assert [s.args["path"] for s in forms.relative_writes(reg["alpha"], "oneshot")] == [forms.RELATIVE_WRITTEN] * 2
    assert {s.args["path"] for s in forms.relative_reads()} == {forms.RELATIVE, forms.RELATIVE_WRITTEN, "."}


def test_the_second_tenant_sets_its_auxiliary_models_at_run_time(reg):
    """Every profile's environment names its own vision model; the launch profile's config does too (config wins),
    the second's does not (the environment's is used), and leaves its titles to its session's runtime."""
    first = aux.configure(reg["default"], Where("http://127.0.0.1:9"))
    second = aux.configure(reg["alpha"], Where("http://127.0.0.1:9", second=True))
    assert first.env[aux.VISION_MODEL_ENV] == reg["default"].canaries["aux_model"]
    assert second.env[aux.VISION_MODEL_ENV] == reg["alpha"].canaries["aux_model"]
    assert set(first.config["auxiliary"]) == {"title_generation", "vision"}
    assert first.config["auxiliary"]["vision"]["model"] == reg["default"].canaries["aux_model"]
    assert second.config["auxiliary"] == {"vision": {"provider": "custom", "base_url": "http://127.0.0.1:9/v1",
                                                     "key_env": "TENANCY_AUX_KEY"}}


def test_every_profile_passes_its_own_variable_to_its_scripts(reg, tmp_path):
    class Ctx:
        registry = reg
        sandbox = type("S", (), {"home_of": staticmethod(lambda name: tmp_path / name)})()
    for t in reg:
        (tmp_path / t.name).mkdir()
        (tmp_path / t.name / "config.yaml").write_text(yaml.safe_dump({"terminal": {"cwd": "/w"}}))
        (tmp_path / t.name / ".env").write_text("A=1\n")
    forms.lay_passthrough(Ctx)  # type: ignore[arg-type]
    for t in reg:
        cfg = yaml.safe_load((tmp_path / t.name / "config.yaml").read_text())
        assert cfg["terminal"] == {"cwd": "/w", "env_passthrough": [forms.PASSTHROUGH]}
        assert (tmp_path / t.name / ".env").read_text() == f"A=1\n{forms.PASSTHROUGH}={t.canaries['passthrough']}\n"


@pytest.mark.parametrize("name", ("relative-path", "aux-runtime-model", "script-env"))
def test_the_mutants_of_the_forms_fit_the_hermes_under_test(name, hermes_python):
    mutant = next(m for m in MUTANTS if m.name == name)
    patch = mutant.patch(site_packages(hermes_python.parent.parent))
    assert patch.count("\n-") == 1 and "tenancy-mutant" in patch

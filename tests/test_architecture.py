"""The shape of the code: no function of `harness` takes more than 7 parameters (self and cls aside) and every
module of `harness` and of bench/ is shorter than 400 lines, with no exception."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "harness"
BENCH = ROOT / "bench"
MAX_PARAMETERS = 7
MAX_LINES = 400


def modules() -> list[Path]:
    return sorted(HARNESS.rglob("*.py"))


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = node.args
    names = [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


def test_no_function_takes_more_than_7_parameters():
    over = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and len(parameters(node)) > MAX_PARAMETERS:
                over[f"{path.relative_to(HARNESS).as_posix()}:{node.name}"] = len(parameters(node))
    assert not over, over


def test_every_module_is_shorter_than_400_lines():
    over = {path.relative_to(ROOT).as_posix(): n for path in [*modules(), *sorted(BENCH.glob("*.py"))]
            if (n := len(path.read_text(encoding="utf-8").splitlines())) >= MAX_LINES}
    assert not over, over


def test_the_checks_see_a_long_signature():
    node = ast.parse("def f(self, a, b, /, c, *d, e, f, g, h, **i): pass").body[0]
    assert isinstance(node, ast.FunctionDef) and sorted(parameters(node)) == list("abcdefghi")

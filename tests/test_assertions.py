"""Every test can fail: each test function asserts, expects an exception (`pytest.raises`,
`pytest.warns`), or calls a function of its own module, or one named `assert_*` or `check_*`,
that does. A test that only runs code proves only that the code did not raise."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
EXPECTING = {"raises", "warns", "fail", "assert_close", "assert_equal"}  # pytest's and torch.testing's


def _called(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


def _asserts(node: ast.AST, functions: dict[str, ast.FunctionDef], seen: frozenset = frozenset()) -> bool:
    """Whether `node` asserts, raises, expects an exception or calls something that asserts."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Assert | ast.Raise):
            return True
        if isinstance(sub, ast.Call):
            name = _called(sub)
            if name in EXPECTING or name.lstrip("_").startswith(("assert", "check")):
                return True
            if name in functions and name not in seen and _asserts(functions[name], functions, seen | {name}):
                return True
    return False


def _tests_without_assertions(path: Path) -> list[str]:
    """ "line name" of each test function in the file at `path` that asserts nothing."""
    tree = ast.parse(path.read_text())
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    return [
        f"{node.lineno} {node.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and node.name.startswith("test")
        and not _asserts(node, functions)
    ]


def test_every_test_asserts_something():
    found = [
        f"{path.relative_to(TESTS.parent)}:{test}"
        for path in sorted(TESTS.rglob("test_*.py"))
        for test in _tests_without_assertions(path)
    ]
    assert found == [], "tests that assert nothing (check the outcome they are about): " + "; ".join(found)


def test_the_check_sees_a_test_that_only_runs_code(tmp_path):
    source = tmp_path / "test_example.py"
    source.write_text(
        "def helper():\n    assert True\n\n"
        "def test_runs():\n    sum([1, 2])\n\n"
        "def test_via_helper():\n    helper()\n\n"
        "def test_raises():\n    with pytest.raises(ValueError):\n        int('x')\n"
    )
    assert _tests_without_assertions(source) == ["4 test_runs"]

"""Each module keeps its private names to itself, across forge and the harness alike.

Read from the source (`ast`), not run. A name with a leading underscore is its module's own: the
module that defines it may change it freely. Another module that reads it (`other._name`,
`getattr(other, "_name")`), or writes it, depends on what it was promised nothing of; the import
tests (`tests/forge/test_structure.py`, `tests/harness/test_owners.py`) see `from x import _y`, this
sees the attribute. A private name defined nowhere in the tree is a library's (torch, triton, the
baselines' packages): reading one is that module's business with its library, not a reach into a
room of this house.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("forge", "harness")


def _trees() -> dict[str, ast.Module]:
    """Every module of the packages, by its path from the repository root."""
    return {
        path.relative_to(REPO).as_posix(): ast.parse(path.read_text())
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
    }


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(module names, member names): the private names a module defines at its top (functions,
    classes, `_X = ...`) and those it gives objects (methods and class attributes, `self._x = ...`,
    `module._x = ...`, `setattr(obj, "_x", ...)`)."""
    top, members = set(), set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            top.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            top.update(t.id for t in targets if isinstance(t, ast.Name))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    members.add(item.name)
                elif isinstance(item, ast.Assign | ast.AnnAssign):
                    targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                    members.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            members.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            members.update(_named_attribute(node))
    return {n for n in top if _private(n)}, {n for n in members if _private(n)}


def _imported(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names bound to this house's modules, names bound to a library's) by the module's imports."""
    house, library = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                (house if alias.name.split(".")[0] in PACKAGES else library).add(bound)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            ours = (node.module or "").split(".")[0] in PACKAGES
            (house if ours else library).update(a.asname or a.name for a in node.names)
    return house, library


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _named_attribute(call: ast.Call) -> list[str]:
    """The attribute a getattr/setattr/hasattr/delattr call names by a constant string."""
    if len(call.args) >= 2 and isinstance(call.args[1], ast.Constant) and isinstance(call.args[1].value, str):
        return [call.args[1].value]
    return []


def _own(node: ast.Attribute) -> bool:
    """`self._x`, `cls._x`, `super()._x`: the object's own (or its base class's) member."""
    value = node.value
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"


def _reaches(path: str, tree: ast.Module, house: tuple[set[str], set[str]]) -> list[str]:
    """Where `path` reads or writes a private name that another module of the house defines
    (`house`: every module's (module names, member names))."""
    own_top, own_members = _defined(tree)
    modules, libraries = _imported(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and not _own(node):
            root = _root(node.value)
            if isinstance(root, ast.Name) and root.id in libraries:
                continue  # a library's internals: torch.cuda._sleep
            if isinstance(node.value, ast.Name) and node.value.id in modules:
                names = [node.attr] if node.attr in house[0] - own_top else []  # convergence._ids
            else:
                names = [node.attr] if node.attr in house[1] - own_members else []  # layer._forge_fp8
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            accessors = ("getattr", "setattr", "hasattr", "delattr")
            named = _named_attribute(node) if node.func.id in accessors else []
            names = [n for n in named if _private(n) and n in house[1] - own_members]
        else:
            continue
        found += [f"{path}:{node.lineno}: {ast.unparse(node)}" for _ in names]
    return found


def test_no_module_reads_another_modules_private_names():
    trees = _trees()
    defined = [_defined(tree) for tree in trees.values()]
    house = (set().union(*(top for top, _ in defined)), set().union(*(members for _, members in defined)))
    found = [reach for path, tree in trees.items() for reach in _reaches(path, tree, house)]
    assert not found, "private names read outside the module that defines them:\n" + "\n".join(found)


def test_the_check_sees_what_it_refuses():
    """A reach into another module's private member is found, in either spelling; a module's own
    private members, and a library's, are not."""
    reader = ast.parse(
        "import torch\nfrom harness.run import convergence\nn = getattr(m, '_forge_fp8', False)\n"
        "t = convergence._ids(a)\nself._ok = 1\ns = self._ok\n"
        "x = torch.cuda._sleep(1)\ny = super()._warm_up()"
    )
    house = ({"_ids", "_sleep"}, {"_forge_fp8", "_ok", "_warm_up"})
    assert len(_reaches("harness/x.py", reader, house)) == 2

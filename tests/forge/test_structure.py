"""forge's structure: one owner per fact, modules that talk through public names, a thin optimizer.

Read from the source (`ast`), not run:
- every choice a caller makes (the rules, state dtypes, int8 groups, master-weight modes, FP8
  recipes) is declared by one module and read from it everywhere else, never restated;
- no module imports another's private name (`from forge.x import _y`) or reads another object's
  private member (`obj._y`, obj not self or cls), but for the few torch internals named below;
- `ForgeOptimizer` stays a thin torch.optim facade (its class at most 200 lines).
And run: a rule that differs from another only in its host half is added through the registry
alone, and trains.
"""

import ast
import copy
import dataclasses
from pathlib import Path

import pytest
import torch

import forge
import forge.rules

FORGE = Path(forge.__file__).parent


def _sources() -> dict[str, ast.Module]:
    """Every module of forge, by its path from the repository root (forge/...)."""
    root = FORGE.parent
    return {
        path.relative_to(root).as_posix(): ast.parse(path.read_text()) for path in sorted(FORGE.rglob("*.py"))
    }


SOURCES = _sources()


def _literal(node: ast.AST):
    """The constant members of a tuple, list or set literal (of a dict: its keys), else None."""
    if isinstance(node, ast.Dict):
        members = node.keys
    elif isinstance(node, ast.Tuple | ast.List | ast.Set):
        members = node.elts
    else:
        return None
    return [m.value for m in members if isinstance(m, ast.Constant)]


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the string constants that are docstrings (prose may name anything)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _assigned_name(tree: ast.Module, target: ast.AST) -> str | None:
    """The name a module-level assignment of the literal `target` binds, if it is one."""
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is target:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            return ast.unparse(targets[0])
    return None


# ---------------------------------------------------------------------- one owner per fact

RULE_OWNERS = {"forge/rules.py"}  # the host halves and the registry
RULE_DISPATCH = {"forge/kernels/rules.py"}  # the device halves, dispatched by name (`apply_rule`)
# transformers' own `optim` names, three of which are spelled as FORGE's rules ("sgd", "adagrad",
# "rmsprop"): lists of the Trainer's names, mapped to rules through `Rule.torch_class`.
HF_OPTIM_NAMES = {
    ("forge/integrations/transformers.py", "_OPTIMIZER_CLASS"),
    ("forge/integrations/transformers.py", "_TORCH_OPTIMS"),
}


def _names_a_rule(node: ast.AST) -> bool:
    """A comparison with a rule's name (`rule == "lion"`)."""
    sides = (node.left, *node.comparators) if isinstance(node, ast.Compare) else ()
    return any(isinstance(side, ast.Constant) and side.value in forge.RULES for side in sides)


def _rule_name_copies(path: str, tree: ast.Module) -> list[str]:
    """Lists of rule names and comparisons with one, outside the registry (see the test)."""
    if path in RULE_OWNERS:
        return []
    found = []
    for node in ast.walk(tree):
        members = _literal(node) or []
        listed = len(set(forge.RULES) & set(members)) >= 2
        if listed and (path, _assigned_name(tree, node)) not in HF_OPTIM_NAMES:
            found.append(_where(path, node))
        if path not in RULE_DISPATCH and _names_a_rule(node):
            found.append(_where(path, node))
    return found


def test_no_module_restates_the_rule_names():
    """A list of rule names outside `forge.rules` (a tuple, a set, a dict keyed by them) would be a
    second registry that a new rule must also be added to; a comparison with one rule's name, a
    fact about that rule kept outside its `Rule`."""
    found = [copy for path, tree in SOURCES.items() for copy in _rule_name_copies(path, tree)]
    assert not found, (
        "rule names restated outside forge/rules.py (read forge.RULES or the Rule):\n" + "\n".join(found)
    )


def _where(path: str, node: ast.AST, owner: str = "") -> str:
    return f"{path}:{node.lineno}: {ast.unparse(node)[:70]}" + (f"  ({owner})" if owner else "")


def _storage_copies(path: str, tree: ast.Module) -> list[str]:
    """Literals of the storage choices outside the module that declares each (see the test)."""
    found = []
    docstrings = _docstrings(tree)
    modes = {m for m in forge.MASTER_WEIGHTS if m is not None and m not in forge.STATE_DTYPES}
    for node in ast.walk(tree):
        members = None if isinstance(node, ast.Dict) else _literal(node)  # a table keyed by them is no copy
        if path != "forge/states.py" and members is not None:
            if set(forge.STATE_DTYPES) <= set(members):
                found.append(_where(path, node, "forge.STATE_DTYPES"))
            declared = _assigned_name(tree, node) is not None or _compared_with_in(tree, node)
            if set(members) == set(forge.INT8_GROUPS) and declared:  # not a tile shape in passing
                found.append(_where(path, node, "forge.INT8_GROUPS"))
        if not isinstance(node, ast.Constant) or id(node) in docstrings:
            continue
        if path != "forge/weights.py" and node.value in modes:
            found.append(_where(path, node, "forge.MASTER_WEIGHTS"))
        if path != "forge/fp8.py" and node.value in forge.FP8_RECIPES:
            found.append(_where(path, node, "forge.FP8_RECIPES"))
    return found


def _compared_with_in(tree: ast.Module, literal: ast.AST) -> bool:
    return any(
        isinstance(node, ast.Compare)
        and literal in node.comparators
        and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
        for node in ast.walk(tree)
    )


def test_storage_choices_are_declared_once():
    """The state dtypes and int8 group sizes (`forge.states`), the master-weight modes
    (`forge.weights`) and the FP8 recipes (`forge.fp8`) appear as literals in their own module
    only: a list of them elsewhere, a comparison with one, a string naming a mode. (A table keyed
    by state dtype, such as the kernels' configs per storage, is a fact of its own.)"""
    found = [copy for path, tree in SOURCES.items() for copy in _storage_copies(path, tree)]
    assert not found, "storage choices restated outside their owner:\n" + "\n".join(found)


def test_the_storage_choices_forge_exports_are_their_owners():
    """`forge`'s names are the owners' objects themselves, not copies."""
    import forge.fp8
    import forge.states
    import forge.weights

    assert forge.RULES is forge.rules.RULES
    assert forge.STATE_DTYPES is forge.states.STATE_DTYPES
    assert forge.INT8_GROUPS is forge.states.INT8_GROUPS
    assert forge.MASTER_WEIGHTS is forge.weights.MASTER_WEIGHTS
    assert forge.FP8_RECIPES is forge.fp8.RECIPES


# ---------------------------------------------------------------------- public names between modules

# torch's own internals forge needs, each where it needs them. Everything under the `torch` module
# name (torch._C's autograd engine queries, torch._scaled_mm) is torch's API to FORGE's one caller
# of each (forge.guards, forge.nn, forge.fp8); the rest are members of torch objects:
TORCH_PRIVATE = {
    "_execution_engine": "torch.autograd.Variable: work queued for the end of backward (forge.guards)",
    "_version": "a tensor's version counter: a cast kept while its input is unchanged (forge.fp8)",
    "_base": "the tensor a view was taken of, kept alive while a side stream reads it (forge.streams)",
}


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _private_accesses(path: str, tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("forge"):
            found += [
                f"{path}:{node.lineno}: from {node.module} import {a.name}"
                for a in node.names
                if a.name.startswith("_")
            ]
        if isinstance(node, ast.Import):
            found += [
                f"{path}:{node.lineno}: import {a.name}"
                for a in node.names
                if "._" in a.name and a.name.startswith("forge")
            ]
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        root = _root(node.value)
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        if isinstance(root, ast.Name) and root.id == "torch":
            continue
        if node.attr in TORCH_PRIVATE:
            continue
        found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_modules_use_each_others_public_names_only():
    """A module that reads another's private names depends on what that module may change freely;
    the optimizer's collaborators (clip, ops, head, attach...) reach it through `forge.interface`."""
    found = [access for path, tree in SOURCES.items() for access in _private_accesses(path, tree)]
    assert not found, "private names used across forge modules:\n" + "\n".join(found)


def test_the_checks_see_what_they_refuse():
    """The two walks above find what they are for (so that their silence means something)."""
    copied = ast.parse(
        'NAMES = ("adamw", "sgd")\nif x.rule == "lion":\n    pass\nGROUPS = (64, 128)\nW = "bf16+kahan"'
    )
    assert len(_rule_name_copies("forge/x.py", copied)) == 2
    assert len(_storage_copies("forge/x.py", copied)) == 2
    private = ast.parse(
        "from forge.distributed import _names\noptimizer._wiring.unwire(optimizer)\nself._ok = torch._C"
    )
    assert len(_private_accesses("forge/x.py", private)) == 2


# ---------------------------------------------------------------------- the optimizer is a facade


def test_forge_optimizer_is_a_thin_facade():
    """ForgeOptimizer keeps what torch.optim asks of an optimizer (param groups, state dicts) and
    hands the updates to `forge.updates`, `forge.functional` and `forge.steps`."""
    tree = SOURCES["forge/optim.py"]
    (cls,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "ForgeOptimizer"]
    lines = cls.end_lineno - cls.lineno + 1
    assert lines <= 200, (
        f"ForgeOptimizer is {lines} lines: move what is not torch.optim's surface to its owner"
    )


def test_forge_optimizer_wires_its_parts_without_lambdas():
    """Its parts look a parameter's group, rule and state up in one `forge.param_table.ParamTable`,
    not in callables made up where the optimizer is built."""
    tree = SOURCES["forge/optim.py"]
    (init,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    assert not [n for n in ast.walk(init) if isinstance(n, ast.Lambda)]


def test_the_fused_update_is_written_once():
    """`update_linear` has one signature, `forge.updates.Updates.update_linear`'s: the optimizer
    hands that bound method out, and the layers' Protocol (`forge.interface`) declares it by its
    operands alone (`**options`) without restating its options."""
    defined = [
        f"{path}:{node.lineno}"
        for path, tree in SOURCES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "update_linear" and node.args.kwonlyargs
    ]
    assert defined == [f"forge/updates.py:{_line_of('forge/updates.py', 'def update_linear(')}"]


def _line_of(path: str, text: str) -> int:
    return next(i for i, line in enumerate((FORGE.parent / path).read_text().splitlines(), 1) if text in line)


# ---------------------------------------------------------------------- a rule through the registry


def _device_dispatch() -> set[str]:
    """The rule names `forge.kernels.rules.apply_rule` dispatches on (its `RULE == name` tests)."""
    tree = SOURCES["forge/kernels/rules.py"]
    (apply_rule,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "apply_rule"]
    return {
        side.value
        for node in ast.walk(apply_rule)
        if isinstance(node, ast.Compare)
        for side in node.comparators
        if isinstance(side, ast.Constant)
    }


def test_every_rule_has_a_device_half_and_only_the_dispatch_names_them():
    """The registry (`forge.RULES`) and the device dispatch (`apply_rule`) agree: each rule's device
    half exists, and no other device half is left without a rule."""
    device = {rule.device_name for rule in forge.RULES.values()}
    assert device == _device_dispatch()


def test_a_rule_added_to_the_registry_alone_trains(monkeypatch):
    """A rule that differs from AdamW in its name only, reusing AdamW's device half, registered in
    `forge.RULES` and nowhere else: attach, train, save and compare with AdamW bit for bit."""
    twin = dataclasses.replace(
        forge.RULES["adamw"], name="adamw_twin", title="AdamW twin", device_half="adamw"
    )
    monkeypatch.setitem(forge.rules.RULES, "adamw_twin", twin)
    assert forge.RULES["adamw_twin"].state_count() == 2 and forge.RULES["adamw_twin"].title == "AdamW twin"
    assert isinstance(
        forge.torch_optimizer("adamw_twin", [torch.zeros(2, requires_grad=True)]), torch.optim.AdamW
    )

    model = torch.nn.Sequential(torch.nn.Linear(24, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 8))
    models = [model, copy.deepcopy(model)]
    opts = [
        forge.attach(model, rule, lr=1e-2, state_dtype="fp32")
        for model, rule in zip(models, ("adamw", "adamw_twin"))
    ]
    x = torch.randn(6, 24)
    for _ in range(2):
        for model in models:
            model(x).pow(2).mean().backward()
    for p, q in zip(*(model.parameters() for model in models)):
        assert torch.equal(p, q)
    assert opts[1].state_dict()["forge"]["rule"] == "adamw_twin"
    assert opts[1].options_of(models[1][0].weight).rule == "adamw"  # the device half it reuses


@pytest.mark.parametrize("name", sorted(forge.RULES))
def test_each_rule_states_its_facts(name):
    """What the harness and the docs read of a rule, for every rule: nothing to restate elsewhere."""
    rule = forge.RULES[name]
    assert rule.name == name and rule.title and rule.device_name in _device_dispatch()
    assert issubclass(rule.torch_class(), torch.optim.Optimizer)
    assert 0 <= rule.state_count() <= 3  # SGD without momentum keeps none


def test_every_rule_is_trained_against_its_torch_class():
    """Each element-wise rule has a case in `tests.helpers.RULE_CASES`, which
    `tests/forge/test_rules.py` trains against the rule's torch.optim class: a new rule's case is its
    test (docs/how-forge-works.md). A rule that finishes on the whole matrix (Muon) rounds its
    update through bf16 Newton-Schulz, past those tests' tolerances: its own file,
    tests/forge/test_<rule>.py, compares it with its torch.optim class."""
    from tests.helpers import RULE_CASES

    element_wise = {name for name, rule in forge.RULES.items() if not rule.whole_matrix}
    assert {case.split("-")[0] for case in RULE_CASES} == element_wise
    for name in set(forge.RULES) - element_wise:
        assert (Path(__file__).parent / f"test_{name}.py").is_file(), f"{name} has no test file of its own"

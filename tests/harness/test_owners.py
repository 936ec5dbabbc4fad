"""One owner per concept: what a contributor extends is declared in one place, and the harness's
modules keep to their side.

- A rule is forge's (`forge.RULES`): no table of rules in harness/, and a rule added to forge is
  validated and modelled by the harness with no edit there.
- A method is its `Method` class: a class defined anywhere is listed, validated, ordered, named
  and modelled through the registry alone, and no parallel table of methods exists.
- A GPU kind is its conf/gpu file: a file in a folder of the config search path is listed,
  composed, recognized and read for MFU, floors and capacity, and no table of GPUs exists.
- No harness module imports another's private name, the harness's imports form no circle, and
  the sweep's parent side never loads the worker's modules.
"""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

import forge
from harness.__main__ import main
from harness.report import expectations as ex
from harness.report import names, plots
from harness.run import env, gpus, hardware, methods, runner
from harness.run.config import ConfigError, compose_config
from harness.run.methods import base
from harness.run.methods.footprint import separate

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "harness"
TINY = ["model=tiny-llama", "device=cpu", "gpu=cpu", "seq_len=16"]


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(HARNESS.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _trees() -> dict[str, ast.Module]:
    return {name: ast.parse(path.read_text()) for name, path in MODULES.items()}


TREES = _trees()


# ---------------------------------------------------------------------------------------------
# No copies of a rule, method or GPU table


def _strings(node: ast.AST) -> list[str]:
    """The string constants a collection literal holds (a dict's keys)."""
    items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", [])
    return [item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)]


def _tables(names: set[str] | object) -> list[str]:
    """Every collection literal in harness/ holding two or more of `names` (or, given a function,
    of the strings it accepts), as module:line; a tuple assigned name by name (FLOOR, BASELINE =
    ...) names roles, not a table, and is left out."""
    accepts = names if callable(names) else names.__contains__
    found = []
    for module, tree in TREES.items():
        unpacked = {
            id(node.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Tuple) for t in node.targets)
        }
        for node in ast.walk(tree):
            collection = (
                isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Dict) and id(node) not in unpacked
            )
            if collection and sum(map(accepts, _strings(node))) >= 2:
                found.append(f"{module}:{node.lineno}")
    return found


def test_no_table_of_rules_outside_forge():
    """The one collection of rule names in harness/ is the kernel lab's choice of which rules it
    times, at which hyperparameters (`layers.TIMED_RULES`, checked against forge.RULES by
    `layers.timed_rules`): a choice, not a copy."""
    assert _tables(set(forge.RULES)) == [_line_of("harness.kernels.layers", "TIMED_RULES = ")]


def _line_of(module: str, prefix: str) -> str:
    lines = MODULES[module].read_text().splitlines()
    return f"{module}:{next(i for i, text in enumerate(lines, 1) if text.startswith(prefix))}"


def test_no_table_of_methods_or_gpus():
    """The collections of method names are the paper's own figures, keyed by the method each quotes
    (`harness.report.paper.T3`, its capacity figures, and `REFERENCE_README`, its code's README
    table): the paper's data, not tables of methods."""
    assert _tables(set(methods.registry())) == [
        _line_of("harness.report.paper", "T3 = "),
        _line_of("harness.report.paper", "REFERENCE_README = "),
    ]
    kinds = [kind for kind in gpus.kinds().values() if kind.device_name]
    # a name a table is keyed by (one word: "H200", "A100-SXM4-80GB"), not prose that mentions a card
    card = lambda text: " " not in text and any(gpus.matches(kind, text) for kind in kinds)
    assert _tables(card) == []


def test_the_old_tables_are_gone():
    """Names of the tables that restated a method, a rule or a GPU beside its owner."""
    gone = {"METHOD_ORDER", "METHOD_NAMES", "SUMMARIES", "REGISTRY", "RULE_STATES", "PEAK_TFLOPS"}
    gone |= {"KNOWN_CAPACITY_GIB", "CHUNKED_HEAD_REFUSED", "SEPARATE_UPDATES", "PERSISTENT_GRADIENTS"}
    found = [
        f"{module}:{node.lineno} {node.id}"
        for module, tree in TREES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and (node.id in gone or node.id.startswith("H200_"))
    ]
    assert found == []


# ---------------------------------------------------------------------------------------------
# A rule: forge's alone


@pytest.fixture
def new_rule(monkeypatch):
    """A rule forge gains (Lion's, under another name): what the harness must take unchanged."""
    monkeypatch.setitem(forge.rules.RULES, "lion2", dataclasses.replace(forge.RULES["lion"], name="lion2"))
    return "lion2"


def test_a_rule_added_to_forge_needs_nothing_in_the_harness(new_rule):
    methods.validate("forge", {"rule": new_rule})
    methods.validate("torch_rule", {"rule": new_rule})
    fp = ex.footprint("forge", {"rule": new_rule, "state_dtype": "int8", "int8_group": 128})
    assert fp.states == forge.state_bytes("int8", 128) == 1 + 2 / 128  # one state tensor, as Lion
    with pytest.raises(ConfigError, match="rule='nope' is not valid; choose one of: adamw.*lion2"):
        methods.validate("forge", {"rule": "nope"})


# ---------------------------------------------------------------------------------------------
# A method: its class


@pytest.fixture
def toy_method(monkeypatch):
    """A method defined outside harness/run/methods, registered by defining it (and forgotten after)."""
    monkeypatch.setattr(base, "_REGISTERED", dict(base._REGISTERED))

    @dataclass
    class ToyOptions:
        momentum: float = 0.9

        def __post_init__(self) -> None:
            if not 0 <= self.momentum < 1:
                raise ValueError(f"momentum={self.momentum} is not valid: 0 <= momentum < 1")

    class ToySGD(base.StepOptimizerMethod):
        name = "toy_sgd"
        title = "toy SGD"
        summary = "torch.optim.SGD with momentum, defined in a test"
        order = 85  # after every method of the harness's own (FORGE is 9, torch_rule 10)
        Options = ToyOptions
        requires = ("pytest",)

        @classmethod
        def footprint(cls, options, weights):
            return separate(weights, weights, weights)  # one momentum buffer in the weights' dtype

    return ToySGD


def test_a_method_is_listed_validated_ordered_and_modelled_from_its_class(toy_method, capsys):
    assert main(["list", "implementation"]) == 0
    out = capsys.readouterr().out
    assert "toy_sgd" in out and "torch.optim.SGD with momentum, defined in a test" in out
    assert methods.get("toy_sgd") is toy_method
    toy = [*TINY, "method=no_optimizer", "method.name=toy_sgd", "method.label=toy"]
    cfg = compose_config([*toy, "+method.options.momentum=0.5"])
    assert methods.make_options(cfg.method.name, dict(cfg.method.options)).momentum == 0.5
    with pytest.raises(ConfigError, match="momentum=1.5 is not valid"):
        compose_config([*toy, "+method.options.momentum=1.5"])
    with pytest.raises(ConfigError, match="unknown option.*bogus"):
        methods.validate("toy_sgd", {"bogus": 1})
    assert names.method_label("toy_sgd") == "toy SGD"
    assert names.method_rank("forge") < names.method_rank("toy_sgd") < names.method_rank("not_a_method")
    assert ex.footprint("toy_sgd", {}).total == 6.0  # bf16 weights, gradient, momentum
    assert "pytest" in methods.packages() and env.versions()["pytest"]


def test_a_name_is_one_methods():
    with pytest.raises(TypeError, match="method name 'forge' is taken by harness.run.methods.forge:Forge"):
        type("Impostor", (base.Method,), {"name": "forge"})


# ---------------------------------------------------------------------------------------------
# A GPU kind: its conf/gpu file

TOY_GPU = """\
# A Toy-9000 card, measured as it is (no memory cap).
name: toy9000
memory_cap_gib: null
device_name: TOY-?9000
memory_gib: 20.5
peak_tflops: 100.0
matmul_tflops: 80
copy_tbps: 1.5
"""


@pytest.fixture
def toy_gpu(tmp_path):
    folder = tmp_path / "conf"
    (folder / "gpu").mkdir(parents=True)
    (folder / "gpu" / "toy9000.yaml").write_text(TOY_GPU)
    return f"hydra.searchpath=[file://{folder}]"


def test_a_gpu_kind_is_one_file(toy_gpu, capsys):
    assert main(["list", "gpu", toy_gpu]) == 0
    assert "toy9000    A Toy-9000 card, measured as it is (no memory cap)." in capsys.readouterr().out
    cfg = compose_config([toy_gpu, "gpu=toy9000", "model=tiny-llama"])
    assert gpus.recognize("Toy-9000 (rev 2)", [toy_gpu]).name == "toy9000"
    toy = {"gpu_name": "TOY-9000", "gpu_count": 1, "gpu_memory_gib": 20.5, "host_memory_gib": 64.0}
    h200 = {"gpu_name": "NVIDIA H200", "gpu_count": 1, "gpu_memory_gib": 139.8, "host_memory_gib": 64.0}
    assert hardware.hardware_problem(cfg.gpu, "auto", 1, toy) is None
    assert "it is for an NVIDIA TOY9000 (gpu=toy9000)" in hardware.hardware_problem(cfg.gpu, "auto", 1, h200)
    assert runner.peak_tflops(cfg, "TOY-9000") == 100.0
    record = {"gpu": "toy9000", "gpu_name": "TOY-9000", "config": {"gpu": dict(cfg.gpu)}}
    assert ex.ceilings([record]) == ex.Ceilings("TOY9000", 80.0, 1.5)
    assert plots.capacity_gib(record) == 20.5


def test_a_real_card_must_say_how_it_is_named(toy_gpu):
    path = Path(toy_gpu.split("file://")[1].rstrip("]")) / "gpu" / "toy9000.yaml"
    path.write_text(TOY_GPU.replace("device_name: TOY-?9000\n", ""))
    with pytest.raises(ConfigError, match="must say how the card names itself: add device_name"):
        compose_config([toy_gpu, "gpu=toy9000", "model=tiny-llama"])


def test_an_old_record_takes_what_it_lacks_from_its_kinds_file():
    old = {"gpu": "h200", "gpu_name": "NVIDIA H200", "config": {"gpu": {"name": "h200", "peak_tflops": None}}}
    kind = gpus.of_record(old)
    assert (kind.peak_tflops, kind.memory_gib, kind.matmul_tflops) == (989.4, 139.8, 800)
    assert plots.capacity_gib(old) == 139.8
    emulated = {"gpu": "a100_40gb", "memory_cap_gib": 40.0, "gpu_name": "NVIDIA H200"}
    assert gpus.ran_on(emulated).name == "h200" and plots.capacity_gib(emulated) == 40.0


# ---------------------------------------------------------------------------------------------
# Imports


def test_no_module_imports_a_private_name_of_another():
    found = [
        f"{module}: from {node.module} import {alias.name}"
        for module, tree in TREES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("harness", "forge")
        for alias in node.names
        if alias.name.startswith("_")
    ]
    assert found == []


def _forge_imports(lab: bool) -> set[str]:
    """The forge modules the kernel lab's modules (or, `lab` false, all the others) import from."""
    found = set()
    for module, tree in TREES.items():
        if module.startswith("harness.kernels") != lab:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.split(".")[0] == "forge"}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "forge":
                found.add(node.module)
    return found


def test_the_kernel_lab_imports_exactly_the_forge_modules_it_names():
    from harness.kernels import FORGE_MODULES

    assert _forge_imports(lab=True) == set(FORGE_MODULES)


def test_the_rest_of_the_harness_imports_forge_public_modules():
    """Outside the kernel lab: `forge` (attach, RULES, the storage lists, torch_optimizer), and the
    documented modules forge.head (the chunked loss), forge.fp8 (which layers take FP8),
    forge.data_parallel (the reducer's MAX_IN_FLIGHT), forge.muon (Muon's split of a model and
    its defaults), forge.newton_schulz (the `newton_schulz=` choices a caller of attach makes) and
    forge.states (how a state dtype stores a value: the fidelity measurement's states' error)."""
    public = {"forge", "forge.head", "forge.fp8", "forge.data_parallel", "forge.muon", "forge.newton_schulz"}
    public.add("forge.states")
    assert _forge_imports(lab=False) <= public


def _imports(module: str, tree: ast.Module) -> set[str]:
    """The harness modules `module` imports anywhere in it, and the packages each import loads."""
    named = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            named |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    found = set()
    for name in (n for n in named if n.split(".")[0] == "harness"):
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        while name:  # importing a.b.c runs a/__init__ and a/b/__init__ first
            found.add(name)
            name = name.rpartition(".")[0]
    # a module's own packages are imported before it, whatever it imports: no edge of its choosing
    own = {module.rsplit(".", i)[0] for i in range(module.count(".") + 1)}
    return found - own


def test_the_imports_form_no_circle():
    graph = {module: _imports(module, tree) for module, tree in TREES.items()}
    index, low, stack, circles = {}, {}, [], []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                circles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert circles == []


# The sweep's parent side, and the worker's modules it must never load (harness/run/__init__.py).
PARENT = ("sweep", "local", "slurm", "launch", "grid", "hardware", "summary")
WORKER = ("worker", "runner", "measure", "models", "peak_pools", "convergence", "branches")
WORKER += ("branch_reference", "graphs", "main_grad", "chunked_loss")


def test_the_parent_side_names_no_worker_module():
    worker = {f"harness.run.{name}" for name in WORKER}
    found = {p: _imports(f"harness.run.{p}", TREES[f"harness.run.{p}"]) & worker for p in PARENT}
    assert {p: names for p, names in found.items() if names} == {}


def test_a_sweeps_parent_loads_no_worker_module(tmp_path):
    """Composing, checking and planning a sweep, and recording a point that cannot run here, in a
    fresh process: none of the worker's modules is ever imported."""
    script = textwrap.dedent(f"""
        import sys
        from harness.run import env, local, sweep
        from harness.run.grid import make_point
        overrides = ["+exp=smoke", "results_dir={tmp_path}", "sweep.scratch=true"]
        sweep.plan(overrides)
        point = make_point([*overrides, "method=adamw8bit_torchao", "model=tiny-llama"])
        record = local.run_here(point, env.git_info())
        assert record["status"] == "unavailable", record
        local.crash_record(point, {{}}, "error", "worker exited with code 9")
        loaded = sorted(m for m in sys.modules if m.removeprefix("harness.run.") in {WORKER!r})
        print(loaded)
    """)
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"

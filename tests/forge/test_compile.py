"""FORGE under torch.compile: ForgeLinear traced as the custom ops of `forge.ops`.

A compiled model trains as the eager one. With backend="aot_eager" (Dynamo and AOTAutograd, the
graph run op by op) the updates are bit-identical: the same kernels on the same operands, the
update ops functionalized and written back. Inductor (a GPU test) fuses the rest of the model into
kernels of its own, whose sums run in another order: its weights and states are compared against
the update's size, as the torch.optim comparisons are (`tests.forge.exactness`).

Graph breaks: none, and one graph over all steps. Each ForgeLinear becomes a forge::linear node of
the one graph (its optimizer found at trace time, its states read as graph inputs, nothing that
changes from step to step guarded). Through the eager autograd.Function instead, whose backward
calls a `torch.compiler.disable`d function, every ForgeLinear breaks the graph: 2 breaks in the
MLP, 19 in the tiny Llama.
"""

import copy

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

import forge
from forge.nn import COMPILE_OPS
from tests.forge.exactness import TRANSFORMER_FP32, update_error
from tests.helpers import lm_batch, lm_loss, mlp, regression_batches, tiny_llama

# torch < 2.11 compiles FORGE through ForgeLinearFunction instead, a graph break per linear: what
# these tests check is the custom-op path (on torch 2.11, with the weight left out of the backward
# op's declared mutations: `forge.ops.WEIGHT_LISTED`).
pytestmark = pytest.mark.skipif(not COMPILE_OPS, reason="torch < 2.11 compiles FORGE without its custom ops")

STEPS = 3


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch and counts only its own graphs and breaks."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _train(model, batches, loss_fn, backend=None, schedule=None, **options):
    """STEPS backward passes (each one FORGE step), compiled with `backend` unless None."""
    opt = forge.attach(model, "adamw", lr=1e-3, weight_decay=0.1, **options)
    run = model if backend is None else torch.compile(model, backend=backend)
    scheduler = None if schedule is None else torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    for batch in batches:
        loss_fn(run, batch).backward()
        opt.step()  # nothing to do, as in any training loop: before the scheduler's step
        if scheduler is not None:
            scheduler.step()
    return opt


def _pair(base, batches, loss_fn, backend, **options):
    """(eager model, its optimizer, compiled model, its optimizer), trained on the same batches."""
    eager, compiled = copy.deepcopy(base), copy.deepcopy(base)
    opt_eager = _train(eager, batches, loss_fn, **options)
    opt_compiled = _train(compiled, batches, loss_fn, backend, **options)
    return eager, opt_eager, compiled, opt_compiled


def _assert_same_training(eager, opt_eager, compiled, opt_compiled, base=None, tol=None):
    """Weights, states and step counts: equal (tol None) or within `tol` of the update's size."""
    initial = dict(base.named_parameters()) if base is not None else {}
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
        assert opt_compiled.state[q]["step"] == opt_eager.state[p]["step"] == STEPS, name
        for key, value in opt_eager.state[p].items():
            other = opt_compiled.state[q][key]
            if not isinstance(value, torch.Tensor):
                assert other == value, f"{name} {key}"
            elif tol is None:
                assert torch.equal(other, value), f"{name} {key} differs from eager"
            else:  # fp32 states, which start at zero: relative to their size
                assert update_error(other, value, torch.zeros_like(value)) <= tol, f"{name} {key}"
        if tol is None:
            assert torch.equal(p, q), f"{name} differs from eager"
        else:
            assert update_error(q, p, initial[name]) <= tol, f"{name} differs from eager"


def _assert_one_graph():
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 1  # and no recompile over the steps


def _regression_loss(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).mean()


@pytest.mark.parametrize(
    "weight_dtype, state_dtype",
    [
        (torch.float32, "fp32"),
        (torch.bfloat16, "int8"),
    ],
    ids=["fp32-fp32", "bf16-int8"],
)
def test_compiled_mlp_trains_exactly_as_eager(weight_dtype, state_dtype):
    base = mlp().to(weight_dtype)
    batches = [(x.to(weight_dtype), y.to(weight_dtype)) for x, y in regression_batches(STEPS)]
    trained = _pair(base, batches, _regression_loss, "aot_eager", state_dtype=state_dtype)
    _assert_same_training(*trained)
    _assert_one_graph()


@pytest.mark.gpu
def test_inductor_llama_trains_as_eager():
    """GPU: a tiny LlamaForCausalLM (transformers, one decoder layer, fp32) compiled by Inductor, as
    users compile (Triton kernels for the rest of the model): its 8 linears fused, its embedding and
    RMSNorms updated in post-accumulate-grad hooks, the whole forward one graph. On the CPU, Inductor's
    C++ build takes longer than the suite's budget allows; the aot_eager tests above check the ops."""
    base = tiny_llama().cuda()
    batches = [{k: v.cuda() for k, v in lm_batch().items()} for _ in range(STEPS)]
    trained = _pair(base, batches, lm_loss, "inductor", state_dtype="fp32")
    _assert_same_training(*trained, base=base, tol=TRANSFORMER_FP32)
    _assert_one_graph()


def test_an_lr_scheduler_takes_effect_under_compile():
    """The lr is read when the update op runs, not baked in when it is traced: a scheduler that
    changes it at every step gives eager's weights, without a recompile."""
    base, batches = mlp(), regression_batches(STEPS)
    halve = dict(schedule=lambda step: 0.5**step, state_dtype="fp32")
    trained = _pair(base, batches, _regression_loss, "aot_eager", **halve)
    _assert_same_training(*trained)
    _assert_one_graph()
    constant = copy.deepcopy(base)
    _train(constant, batches, _regression_loss, state_dtype="fp32")
    assert not torch.equal(constant[0].weight, trained[2][0].weight)  # the schedule mattered


def test_dx_comes_from_the_weights_before_the_update():
    """The input gradient of a compiled step is plain autograd's on the weights the forward used."""
    base = mlp()
    x, y = regression_batches(1)[0]
    x_ref, x_forge = x.clone().requires_grad_(), x.clone().requires_grad_()
    _regression_loss(copy.deepcopy(base), (x_ref, y)).backward()  # no FORGE
    _train(copy.deepcopy(base), [(x_forge, y)], _regression_loss, "aot_eager", state_dtype="fp32")
    assert torch.equal(x_forge.grad, x_ref.grad)


def test_update_ops_declare_what_they_mutate():
    import forge.ops  # noqa: F401  (registers the ops)

    for op, mutated in (
        (torch.ops.forge.linear_backward, {"weight", "states"}),
        (torch.ops.forge.linear_backward_unlisted_weight, {"states"}),  # torch 2.11's
        (torch.ops.forge.elementwise_update, {"param", "states"}),
        (torch.ops.forge.linear, set()),
    ):
        schema = op.default._schema
        assert {a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write} == mutated
    assert torch.Tag.cudagraph_unsafe in torch.ops.forge.linear_backward.default.tags


def test_a_stateless_update_whose_outputs_go_unused_still_runs():
    """Plain SGD keeps no state, and a bias-free first layer fed an input without grad needs
    neither dx nor db: the update op's outputs go unused, and it still runs (an op that declared
    no mutation would be dropped as dead code, and its update with it)."""
    compiled = nn.Linear(8, 4, bias=False)
    initial, eager = compiled.weight.detach().clone(), copy.deepcopy(compiled)
    x = torch.randn(16, 8)
    for model, backend in ((eager, None), (compiled, "aot_eager")):
        forge.attach(model, "sgd", lr=0.1)
        run = model if backend is None else torch.compile(model, backend=backend)
        for _ in range(STEPS):
            run(x).square().mean().backward()
    assert not torch.equal(compiled.weight, initial)
    assert torch.equal(compiled.weight, eager.weight)
    _assert_one_graph()


def test_elementwise_op_is_update_elementwise():
    """forge::elementwise_update (for hooks traced by compiled autograd) is the optimizer's step."""
    from forge.ops import elementwise_update_op

    a, b = nn.Linear(40, 24), nn.Linear(40, 24)  # a weight: int8 states (a vector's are bf16)
    b.load_state_dict(a.state_dict())
    opt_a = forge.ForgeOptimizer(a.parameters(), "adamw", state_dtype="int8")
    opt_b = forge.ForgeOptimizer(b.parameters(), "adamw", state_dtype="int8")
    for _ in range(STEPS):
        grad = torch.randn(24, 40)
        opt_a.update_elementwise(a.weight, grad)
        elementwise_update_op(opt_b, b.weight, grad)
    assert torch.equal(a.weight, b.weight)
    state_a, state_b = opt_a.state[a.weight], opt_b.state[b.weight]
    assert state_a["step"] == state_b["step"] == STEPS
    for key in ("exp_avg", "exp_avg_absmax", "exp_avg_sq", "exp_avg_sq_absmax"):
        assert torch.equal(state_a[key], state_b[key]), key


def test_second_backward_through_a_retained_graph_is_refused_under_compile():
    """The update is a declared mutation of the weight, so autograd's saved-tensor check refuses."""
    model = mlp()
    forge.attach(model, "adamw")
    loss = _regression_loss(torch.compile(model, backend="aot_eager"), regression_batches(1)[0])
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_a_linear_called_twice_is_refused_while_compiling():
    """AOTAutograd sees the second use's backward read a weight the first one's update wrote."""
    layer = nn.Linear(8, 8)
    forge.attach(layer, "sgd")
    twice = torch.compile(lambda x: layer(layer(x)), backend="aot_eager")
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        twice(torch.randn(3, 8)).sum().backward()


def _compiled_autograd_step(model, batch):
    loss = _regression_loss(model, batch)
    with torch._dynamo.compiled_autograd._enable(torch.compile(backend="aot_eager")):
        loss.backward()


def test_compiled_autograd_trains_fused_weights():
    """Compiled autograd traces the backward of forge::linear: its update op runs at every step."""
    base = nn.Sequential(nn.Linear(24, 40, bias=False), nn.GELU(), nn.Linear(40, 5, bias=False))
    batches = regression_batches(STEPS)
    eager, compiled = copy.deepcopy(base), copy.deepcopy(base)
    opt_eager = _train(eager, batches, _regression_loss, state_dtype="fp32")
    opt_compiled = forge.attach(compiled, "adamw", lr=1e-3, weight_decay=0.1, state_dtype="fp32")
    run = torch.compile(compiled, backend="aot_eager")
    for batch in batches:
        _compiled_autograd_step(run, batch)
    _assert_same_training(eager, opt_eager, compiled, opt_compiled)
    assert counters["compiled_autograd"]["captures"] == 1


def test_compiled_muon_trains_exactly_as_eager():
    """Muon's whole-matrix half runs inside the compiled backward's update op, on the copies the op
    is handed (`forge.functional.Launcher`'s `into`): the same weights and momentum as eager, in one graph."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(23, 41, bias=False), nn.Tanh(), nn.Linear(41, 9, bias=False))
    batches = [(torch.randn(7, 23), torch.randn(7, 9)) for _ in range(STEPS)]
    trained = []
    for backend in (None, "aot_eager"):
        model = copy.deepcopy(base)
        opt = forge.attach(model, "muon", lr=0.02, state_dtype="fp32")
        run = model if backend is None else torch.compile(model, backend=backend)
        for batch in batches:
            _regression_loss(run, batch).backward()
        trained += [model, opt]
    _assert_same_training(*trained)
    _assert_one_graph()

"""The warp-specialized configs FP8 operands take on Hopper (`forge.kernels.fp8_warp_specialized`):
64-row tiles (one MMA warpgroup, 8 epilogue warps) where the update bounds the kernel, 128-row
tiles (two MMA warpgroups, 4 epilogue warps) where the GEMM does. Which is faster where was
measured on an H200 (`forge.kernels.configs` names the records); this pins what ships."""

import pytest

from forge.kernels import fp8_warp_specialized


@pytest.mark.parametrize("T", [256, 1024, 2048, 4096, 16384])
def test_fp8_operands_take_64_row_tiles_where_the_update_bounds_the_kernel(T):
    bf16, int8, fp32 = (fp8_warp_specialized(T, s) for s in ("bf16", "int8", "fp32"))
    assert (bf16.block_n, bf16.num_warps) == ((64, 8) if T <= 1024 else (128, 4))
    assert bf16.epilogue_rows == (32 if T <= 1024 else 16)
    assert (int8.block_n, int8.num_warps) == (64, 8)  # int8's epilogue issues twice bf16's instructions
    assert int8.overlap_promotion and not bf16.overlap_promotion and not fp32.overlap_promotion
    assert (fp32.block_n, fp32.num_warps) == (128, 4) and not fp32.fast_epilogue  # the exact epilogue
    for config in (bf16, int8, fp32):
        assert config.warp_specialized and config.block_t == 128  # a multiple of the FP8 MMA's 32-deep step
    assert bf16.fast_epilogue and int8.fast_epilogue


def test_states_the_kernel_does_not_know_take_no_warp_specialized_config():
    assert fp8_warp_specialized(1024, "fp16") is None


@pytest.mark.parametrize(
    "T, N, K, state_dtype, expected",
    [
        (8192, 14336, 4096, "bf16", (128, 128)),  # Llama-3.1-8B's gate: 3,584 tiles
        (8192, 2048, 1024, "bf16", (128, 128)),  # 128 tiles on 132 multiprocessors
        (16384, 1024, 1024, "bf16", (128, 64)),  # 64 tiles of 128 x 128: twice as many
        (8192, 1024, 1024, "bf16", None),  # under the host-bound FLOPs: the Triton kernel
        (8192, 2048, 1024, "int8", None),  # small grids with int8 states were not timed
        (8192, 4096, 1024, "fp32", None),  # 256 tiles, under fp32's 4 a multiprocessor
    ],
)
def test_the_warp_specialized_kernel_takes_small_grids_with_bf16_states(
    monkeypatch, T, N, K, state_dtype, expected
):
    """On a Hopper of 132 multiprocessors: which problems the warp-specialized kernel takes, in
    which tiles (the choice does not depend on a CUDA-graph capture, so replays equal eager steps)."""
    import torch

    from forge.kernels import configs

    monkeypatch.setattr(configs, "_can_run_warp_specialized", lambda *a: True)
    monkeypatch.setattr(configs, "_multiprocessors", lambda device: 132)
    dy = torch.empty(T, N, dtype=torch.bfloat16)
    x = torch.empty(T, K, dtype=torch.bfloat16)
    config = configs._warp_specialized_config(T, N, K, state_dtype, dy, x, on_interpreter=False)
    assert (config and (config.block_n, config.block_k)) == expected


def _fed_plan(monkeypatch, state_dtype="bf16", K=4096, kahan=False, **fields):
    """`configs.plan` of a fed ping-pong config on a Hopper of 132 multiprocessors (stubbed: CPU tensors)."""
    import dataclasses

    import torch

    from forge.kernels import PINGPONG_FED_CONFIGS, configs

    monkeypatch.setattr(configs, "_can_run_warp_specialized", lambda *a: True)
    monkeypatch.setattr(configs, "_multiprocessors", lambda device: 132)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.int8}[state_dtype]
    w = torch.empty(1000, K, dtype=torch.bfloat16)
    states = (torch.empty(1000, K, dtype=dtype), torch.empty(1000, K, dtype=dtype), None)
    dy, x = torch.empty(512, 1000, dtype=torch.bfloat16), torch.empty(512, K, dtype=torch.bfloat16)
    config = dataclasses.replace(PINGPONG_FED_CONFIGS["bf16"], **fields)
    return configs.plan(
        w, states, (True, False, False), dy, x, rule="adamw", flags={"momentum": False, "centered": False},
        state_dtype=state_dtype, stochastic_rounding=True, int8_group=64, config=config,
        steps_in_memory=False, kahan=kahan,
    )  # fmt: skip


@pytest.mark.parametrize("state_dtype", ["bf16", "fp32"])
def test_a_fed_pingpong_config_plans_the_fed_pingpong_kernel(monkeypatch, state_dtype):
    """`KernelConfig.update_stages` with `pingpong` takes `forge.kernels.wgrad_update_pingpong_fed`:
    its ring depths as compile-time arguments, the piece from the descriptors (no ROWS, no
    overlapped slices), one program a multiprocessor, the 12-warp register cap."""
    fields = dict(num_stages=4, pingpong_cols=16) if state_dtype == "fp32" else {}  # fp32 pieces: more bytes
    plan = _fed_plan(monkeypatch, state_dtype, **fields)
    assert plan.kernel == "pingpong_fed" and plan.grid == (min(132, 8 * 32),)
    assert plan.constexprs["UPDATE_STAGES"] == 2 and plan.constexprs["STAGES"] == fields.get("num_stages", 5)
    assert plan.constexprs["IN_SLOT"] is False  # the update in a blocked layout, stored from registers
    assert not {"ROWS", "OVERLAP_SLICES", "OVERLAP_PROMOTION", "PIECE_COLS"} & set(plan.constexprs)
    assert plan.options == dict(num_warps=4, maxnreg=168)
    assert _fed_plan(monkeypatch, state_dtype, update_in_slot=True, **fields).constexprs["IN_SLOT"] is True


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(state_dtype="int8"), "int8 states"),
        (dict(kahan=True), "compensated weights"),
        (dict(pingpong=False), "option of the ping-pong kernel"),
        (dict(K=4100), "multiple of 16 bytes"),
        (dict(update_stages=3), "power of 2"),
        (dict(pingpong_cols=8), "one of"),
        (dict(state_dtype="fp32"), "shared memory"),  # 5 stages and 2 x 2 fp32 pieces of 32 columns: 249 KiB
        (dict(num_stages=6), "shared memory"),  # 6 stages and 2 x 2 bf16 pieces of 32 columns: 249 KiB
        (dict(update_stages=0, update_in_slot=True), "option of the fed ping-pong kernel"),
    ],
)
def test_a_fed_pingpong_config_it_cannot_run_is_refused_saying_why(monkeypatch, fields, match):
    with pytest.raises(ValueError, match=match):
        _fed_plan(monkeypatch, **fields)


def test_the_fed_pingpong_launch_passes_every_argument_of_its_kernel(monkeypatch):
    """`wgrad_update_pingpong_fed.arguments` and the plan's compile-time arguments name each of the
    kernel's parameters once; W and each state get a descriptor of one 64-row piece, a slot the
    rule lacks W's again."""
    import torch

    from forge.kernels import wgrad_update_pingpong_fed as fed
    from forge.kernels.update_tile import slot_arguments, step_arguments

    plan = _fed_plan(monkeypatch)
    w = torch.empty(1000, 4096, dtype=torch.bfloat16)
    m, v = torch.empty_like(w), torch.empty_like(w)
    dy, x = torch.empty(512, 1000, dtype=torch.bfloat16), torch.empty(512, 4096, dtype=torch.bfloat16)
    args = fed.arguments(
        plan, w, slot_arguments(w, (m, v, None), (None,) * 3), dy, x, step_arguments(w, (0.0,) * 9, 0, None)
    )
    names = fed.wgrad_update_pingpong_fed_kernel.arg_names
    assert len(args) + len(plan.constexprs) == len(names)
    assert set(plan.constexprs) == set(names[len(args) :])  # passed by name
    w_desc, s1_desc, s2_desc, s3_desc = args[8:12]
    assert [d.block_shape for d in (w_desc, s1_desc, s2_desc)] == [[64, 32]] * 3
    assert s1_desc.base is m and s2_desc.base is v and s3_desc is w_desc


@pytest.mark.parametrize(
    "T, N, K, state_dtype, pingpong",
    [
        (4096, 14336, 4096, "bf16", True),  # Llama-3.1-8B's gate: 27 tiles a multiprocessor
        (16384, 4096, 4096, "bf16", True),  # q: 7.8 tiles a multiprocessor
        (2048, 14336, 4096, "bf16", False),  # under 4,096 tokens: not measured to win
        (1024, 14336, 4096, "bf16", False),  # the update bounds the kernel: 1.29-1.37x
        (8192, 1024, 4096, "bf16", False),  # k and v: 256 tiles, under 4 a multiprocessor
        (8192, 14336, 4096, "fp32", False),  # fp32 and int8 states were not timed
        (8192, 14336, 4096, "int8", False),
    ],
)
def test_the_pingpong_schedule_is_chosen_where_it_measured_faster(
    monkeypatch, T, N, K, state_dtype, pingpong
):
    """On a Hopper of 132 multiprocessors, bf16 operands: the ping-pong kernel from 4,096 tokens with
    bf16 states on grids of at least 4 tiles a multiprocessor, the warp-specialized one elsewhere."""
    import torch

    from forge.kernels import PINGPONG_CONFIGS, configs

    monkeypatch.setattr(configs, "_can_run_warp_specialized", lambda *a: True)
    monkeypatch.setattr(configs, "_multiprocessors", lambda device: 132)
    dy, x = torch.empty(T, N, dtype=torch.bfloat16), torch.empty(T, K, dtype=torch.bfloat16)
    config = configs._warp_specialized_config(T, N, K, state_dtype, dy, x, on_interpreter=False)
    assert config.pingpong == pingpong and not config.update_stages  # the fed kernel: measured slower
    if pingpong:
        assert config == PINGPONG_CONFIGS[state_dtype]


def test_a_pingpong_config_plans_the_pingpong_kernel_with_every_argument_of_it(monkeypatch):
    """`KernelConfig.pingpong` takes `forge.kernels.wgrad_update_pingpong`: its piece width as a
    compile-time argument (no ROWS), one program a multiprocessor, 12 warps' register cap; the
    launch's arguments and the plan's compile-time ones name each of the kernel's parameters once."""
    import torch

    from forge.kernels import PINGPONG_CONFIGS, configs
    from forge.kernels.wgrad_update_pingpong import wgrad_update_pingpong_kernel

    monkeypatch.setattr(configs, "_can_run_warp_specialized", lambda *a: True)
    monkeypatch.setattr(configs, "_multiprocessors", lambda device: 132)
    w = torch.empty(1000, 4096, dtype=torch.bfloat16)
    states = (torch.empty_like(w), torch.empty_like(w), None)
    dy, x = torch.empty(512, 1000, dtype=torch.bfloat16), torch.empty(512, 4096, dtype=torch.bfloat16)
    plan = configs.plan(
        w, states, (True, False, False), dy, x, rule="adamw", flags={"momentum": False, "centered": False},
        state_dtype="bf16", stochastic_rounding=True, int8_group=64, config=PINGPONG_CONFIGS["bf16"],
        steps_in_memory=False,
    )  # fmt: skip
    assert plan.kernel == "pingpong" and plan.grid == (132,)
    assert plan.options == dict(num_warps=4, maxnreg=168)
    assert plan.constexprs["PIECE_COLS"] == 32 and plan.constexprs["STAGES"] == 6
    assert not {"ROWS", "OVERLAP_PROMOTION"} & set(plan.constexprs)
    names = wgrad_update_pingpong_kernel.arg_names
    runtime = 8 + 2 + 4 + 10 + 2  # W, states, scales, residual; dy and x; T, N, K, groups; step; two pointers
    assert len(names) == runtime + len(plan.constexprs)
    assert set(plan.constexprs) == set(names[runtime:])

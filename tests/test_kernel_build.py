"""The fused kernel still builds for Hopper on a machine without a GPU (`harness.kernel_build`).

Triton compiles to a cubin with the toolchain it ships; `cuobjdump` reads its registers, stack and
shared memory. This catches a kernel change that breaks the GPU build (the interpreter runs the
same source without compiling it) before any device time is spent.
"""

import dataclasses

import pytest

from forge.kernels.wgrad_update import KernelConfig, _pick_config
from harness import kernel_build


def test_the_shipped_config_is_the_first_candidate():
    shipped = dataclasses.asdict(_pick_config(8192, 14336, 4096, "bf16", on_interpreter=False))
    first = dataclasses.asdict(KernelConfig(**kernel_build.candidates()[0]))
    assert first == shipped


@pytest.mark.parametrize("state_dtype", ["bf16", "fp32", "int8"])
@pytest.mark.parametrize("T", [1024, 8192])
def test_every_shipped_config_builds_two_programs_per_sm(state_dtype, T):
    """What `_pick_config` launches on Hopper, for small and large T, fits two programs per SM."""
    shipped = dataclasses.asdict(_pick_config(T, 14336, 4096, state_dtype, on_interpreter=False))
    (r,) = kernel_build.resources([shipped], arch=90, state_dtype=state_dtype)
    assert 0 < r["registers"] <= 128 and r["programs_per_sm"] == 2


def test_gemms_shorter_than_their_launch_read_by_pointers():
    """Llama-3.1-8B's k_proj at T = 1024 (8.6e9 FLOPs) skips the TMA descriptors' host cost; its
    q_proj (3.4e10) and anything larger keep the bulk copies."""
    assert _pick_config(1024, 1024, 4096, "bf16", on_interpreter=False).tma == "none"
    assert _pick_config(1024, 4096, 4096, "bf16", on_interpreter=False).tma == "host"
    assert _pick_config(8192, 1024, 4096, "int8", on_interpreter=False).tma == "host"


def test_the_build_specializes_integers_as_a_launch_does():
    """A unit stride becomes a constant and a multiple of 16 is marked divisible, as Triton's JIT
    does for a real call: it decides whether the epilogue's memory accesses are vectorized."""
    ones, divisible = kernel_build.launch_specialization(dict(T=2048, K=4096, stride=1, odd=4097))
    assert ones == ["stride"] and divisible == ["T", "K"]


def test_the_elementwise_kernel_builds_for_hopper():
    (r,) = kernel_build.resources([kernel_build.ELEMENTWISE], arch=90, state_dtype="bf16")
    assert 0 < r["registers"] <= 255 and r["programs_per_sm"] >= 1


def test_a_persistent_config_builds_and_fits_two_programs():
    persistent = [c for c in kernel_build.candidates() if c.get("programs_per_sm") == 2]
    (r,) = kernel_build.resources(persistent[:1])
    assert r["programs_per_sm"] == 2 and r["stack_bytes"] < 1024


def test_programs_per_multiprocessor():
    assert kernel_build.programs_per_multiprocessor(128, 96 * 1024, 256) == 2  # registers and shared
    assert kernel_build.programs_per_multiprocessor(255, 0, 256) == 1  # registers
    assert kernel_build.programs_per_multiprocessor(64, 160 * 1024, 128) == 1  # shared memory


@pytest.mark.parametrize("T", [1024, 8192])
def test_int8_groups_of_128_build_two_programs_per_sm(T):
    """The shipped int8 configs with `int8_group=128` (half the scales) still fit two per SM."""
    shipped = dataclasses.asdict(_pick_config(T, 14336, 4096, "int8", on_interpreter=False))
    (r,) = kernel_build.resources([dict(shipped, int8_group=128)], arch=90, state_dtype="int8")
    assert 0 < r["registers"] <= 128 and r["programs_per_sm"] == 2


@pytest.mark.parametrize("state_dtype", ["fp32", "bf16", "int8"])
def test_the_shipped_configs_fit_two_programs_per_sm_without_spilling(state_dtype):
    """What `_pick_config` ships on Hopper at T = 1024 and 8192 builds at 128 registers with no
    spills: the spill-free 16-row slices ran faster than the spilling 32-row ones on 23 of the 24
    fp32 and int8 points tuned (docs/perf-notes.md, twelfth session). Up to 8 bytes of
    stack allowed: triton 3.9 spills one register in the int8 64-row tile where 3.6 spills none."""
    shipped = [
        dataclasses.asdict(_pick_config(T, 14336, 4096, state_dtype, on_interpreter=False))
        for T in (1024, 8192)
    ]
    for config, r in zip(shipped, kernel_build.resources(shipped, arch=90, state_dtype=state_dtype)):
        assert r["registers"] <= 128 and r["programs_per_sm"] == 2, config
        assert r["stack_bytes"] <= 8 and r["spill_stores"] <= 1, (config, r)


def test_candidates_come_in_named_groups_with_the_shipped_configs_first():
    groups = kernel_build.candidate_groups()
    only_wide = kernel_build.candidates(["wide"])
    assert only_wide == groups["shipped"] + groups["wide"]
    assert len(kernel_build.candidates()) == sum(map(len, groups.values()))
    with pytest.raises(ValueError, match="unknown candidate groups"):
        kernel_build.candidates(["prefech"])


def test_the_cheaper_launch_candidates_build_and_fit_two_programs_per_sm():
    """`KernelConfig.tma`: "none" (group "pointers", masked loads) and "device" (group
    "device_tma", descriptors built by each program) both launch with plain pointers; both build
    for Hopper at two programs per SM (spills depend on the Triton version: triton 3.9 spills 8 bytes
    on the pointer path where 3.6 spills none)."""
    groups = kernel_build.candidate_groups()
    pointers, device = groups["pointers"][1], groups["device_tma"][1]
    assert (pointers["tma"], device["tma"]) == ("none", "device")
    for r in kernel_build.resources([pointers, device]):
        assert r["tma"] in ("none", "device") and r["registers"] <= 128 and r["programs_per_sm"] == 2


@pytest.mark.parametrize("state_dtype", ["bf16", "int8"])
def test_overlapped_slices_put_two_slices_of_loads_in_flight(state_dtype):
    """`overlap_slices` (group "overlap"): the epilogue issues the next slice's loads before the
    first slice's stores, where slice order loads one slice at a time; on 64-row tiles (shipped
    that way for int8 states at T <= 2048) it still fits two programs per SM (spill-free with
    triton 3.6)."""
    shipped = kernel_build.candidate_groups()["shipped"][2]  # 64 x 128, four 16-row slices
    assert shipped["overlap_slices"]
    plain, overlapped = kernel_build.resources(
        [dict(shipped, overlap_slices=False), shipped], state_dtype=state_dtype
    )
    assert (
        overlapped["epilogue_loads_before_first_store"] == 2 * plain["epilogue_loads_before_first_store"] > 0
    )
    assert overlapped["registers"] <= 128 and overlapped["programs_per_sm"] == 2


@pytest.mark.parametrize("state_dtype", ["bf16", "fp32", "int8"])
def test_the_warp_specialized_kernel_builds_for_hopper(state_dtype):
    """`forge.kernels.wgrad_update_ws` (Gluon; shipped on Hopper for every state dtype) builds for
    sm_90 at 8 and 4 epilogue warps, on 256-row tiles with two MMA warpgroups and on 64-column
    tiles: no spills (up to 8 bytes where slices overlap: triton 3.9 spills that much for fp32
    states), the register cap its warps fit under, one program per multiprocessor with its ring and
    staging buffer in shared memory."""
    from forge.kernels.wgrad_update_ws import max_registers

    groups = kernel_build.candidate_groups()
    configs = groups["warp_specialized"] + groups["narrow"]
    built = kernel_build.resources(configs, arch=90, state_dtype=state_dtype)
    for config, r in zip(configs, built):
        assert r["registers"] == max_registers(config["num_warps"], config["block_n"]), config
        if state_dtype == "fp32" and config.get("fast_epilogue") and config.get("overlap_slices"):
            continue  # a candidate for bf16 states; fp32 states' wider loads spill 80 bytes there
        allowed = 8 if config.get("overlap_slices") else 0
        assert r["stack_bytes"] <= allowed and r["spill_stores"] <= allowed // 4, (config, r)
        assert r["programs_per_sm"] == 1 and r["shared_bytes"] <= 227 * 1024, config
    # the fast epilogue (approximate sqrt and division, hardware bf16 rounding) issues fewer
    # instructions than the exact one at the same warps: 2648 against 5256 for bf16 states at 8 warps
    # (int8: 5376 against 9208; its quantization divides by reciprocals of the group maxima; triton 3.6)
    plain = [(c, r) for c, r in zip(configs, built) if not c.get("overlap_slices")]
    exact = {(c["num_warps"], c["block_n"]): r["instructions"] for c, r in plain if not c["fast_epilogue"]}
    fast = {(c["num_warps"], c["block_n"]): r["instructions"] for c, r in plain if c["fast_epilogue"]}
    assert all(fast[key] < 0.8 * exact[key] for key in exact), (exact, fast)


def test_the_fast_epilogue_is_an_option_of_the_warp_specialized_kernel_only():
    import torch

    from forge.kernels.wgrad_update import KernelConfig, wgrad_update
    from forge.rules import get_rule, resolve_hparams

    rule = get_rule("sgd")
    h = resolve_hparams(rule, dict(lr=0.1))
    w = torch.zeros(32, 64, dtype=torch.bfloat16)
    dy, x = torch.randn(16, 32, dtype=torch.bfloat16), torch.randn(16, 64, dtype=torch.bfloat16)
    config = KernelConfig(block_n=32, block_k=64, block_t=16, num_warps=4, fast_epilogue=True)
    with pytest.raises(ValueError, match="warp-specialized"):
        wgrad_update(
            w, (None,) * 3, (None,) * 3, (False,) * 3, dy, x, rule.coefficients(h, 1, {}), 0,
            rule="sgd", flags=rule.flags(h), state_dtype="bf16", stochastic_rounding=False, config=config,
        )  # fmt: skip


def test_a_warp_specialized_config_where_it_cannot_run_says_why():
    """On the CPU (and for fp32 operands, other GPUs) the warp-specialized kernel
    cannot run: asking for it by config is an error that names what it needs."""
    import torch

    from forge.kernels.wgrad_update import KernelConfig, wgrad_update
    from forge.rules import get_rule, resolve_hparams

    rule = get_rule("sgd")
    h = resolve_hparams(rule, dict(lr=0.1))
    w = torch.zeros(128, 128, dtype=torch.bfloat16)
    dy, x = torch.randn(64, 128, dtype=torch.bfloat16), torch.randn(64, 128, dtype=torch.bfloat16)
    config = KernelConfig(**kernel_build.candidate_groups()["warp_specialized"][0])
    with pytest.raises(ValueError, match="needs a Hopper GPU"):
        wgrad_update(
            w,
            (None,) * 3,
            (None,) * 3,
            (False,) * 3,
            dy,
            x,
            rule.coefficients(h, 1, {}),
            0,
            rule="sgd",
            flags=rule.flags(h),
            state_dtype="bf16",
            stochastic_rounding=False,
            config=config,
        )


def test_forge_launches_the_warp_specialized_kernel_where_it_measured_faster(monkeypatch):
    """On Hopper (faked here), unasked: bf16 and int8 states on grids of at least one tile per SM,
    fp32 states on four, take the warp-specialized kernel (0.71-0.95x the Triton kernel on the H200
    at T <= 2048) with 8 epilogue warps and overlapped slices, bf16 and int8 states with the fast
    epilogue; smaller grids, GEMMs shorter than their launch and FORGE_WARP_SPECIALIZED=0 keep the
    Triton one."""
    import torch

    from forge.kernels import wgrad_update as w

    monkeypatch.setattr(w, "_can_use_tma", lambda t: True)
    monkeypatch.setattr(w, "_is_hopper", lambda device: True)
    monkeypatch.setattr(w, "_multiprocessors", lambda device: 132)

    def chosen(state_dtype, T, N, K):
        dy, x = torch.empty(T, N, dtype=torch.bfloat16), torch.empty(T, K, dtype=torch.bfloat16)
        config = w._warp_specialized_config(T, N, K, state_dtype, dy, x, on_interpreter=False)
        return config and (
            config.num_warps,
            config.fast_epilogue,
            config.overlap_slices,
            config.epilogue_rows,
        )

    assert chosen("fp32", 1024, 14336, 4096) == (8, False, True, 16)  # gate at T = 1024
    assert chosen("fp32", 4096, 4096, 4096) == (8, False, True, 16)  # q at T = 4096
    assert chosen("bf16", 1024, 14336, 4096) == (8, True, True, 32)  # the fast epilogue
    assert chosen("bf16", 8192, 4096, 4096) == (8, True, True, 32)
    assert chosen("fp32", 4096, 1024, 4096) is None  # k: 256 tiles for 132 SMs
    assert chosen("bf16", 4096, 1024, 4096) == (8, True, True, 32)
    assert chosen("int8", 16384, 1024, 5120) == (8, True, True, 32)  # Qwen3-14B's k: 320 tiles
    assert chosen("bf16", 4096, 1024, 1024) is None  # 64 tiles
    assert chosen("fp32", 256, 4096, 4096) is None  # 8.6e9 FLOPs: shorter than its launch
    assert chosen("int8", 1024, 14336, 4096) == (8, True, True, 32)
    monkeypatch.setenv("FORGE_WARP_SPECIALIZED", "0")
    assert chosen("fp32", 1024, 14336, 4096) is None
    assert chosen("bf16", 1024, 14336, 4096) is None

"""The fused kernel still builds for Hopper on a machine without a GPU (`harness.kernels.build`).

Triton compiles to a cubin with the toolchain it ships; `cuobjdump` reads its registers, stack and
shared memory. This catches a kernel change that breaks the GPU build (the interpreter runs the
same source without compiling it) before any device time is spent. A build process takes seconds
to start, so each state dtype's configs are built together, once (`built`).
"""

import dataclasses
import json

import pytest

from forge.kernels import (
    PINGPONG_CONFIGS,
    WARP_SPECIALIZED_DEFAULTS,
    KernelConfig,
    pick_config,
    ws_max_registers,
)
from forge.kernels.configs import fp8_config, fp8_warp_specialized
from harness.kernels import build as kernel_build


def _shipped(T: int, state_dtype: str) -> dict:
    """The config `pick_config` ships on Hopper for Llama-3.1-8B's gate at T tokens."""
    return dataclasses.asdict(pick_config(T, 14336, 4096, state_dtype, on_interpreter=False))


def _fp8(T: int) -> dict:
    """The config FP8 operands take on Hopper at T tokens (`forge.kernels.configs.fp8_config`)."""
    return dict(dataclasses.asdict(fp8_config(pick_config(T, 14336, 4096, "bf16", False), False)), fp8=True)


def _fp8_warp_specialized(state_dtype: str, T: int = 4096) -> dict:
    """The warp-specialized config FP8 operands take on Hopper with `state_dtype` states at T tokens."""
    return dict(dataclasses.asdict(fp8_warp_specialized(T, state_dtype)), fp8=True)


def _fp8_candidates() -> list[dict]:
    """The FP8 kernel lab's warp-specialized candidates (`harness.kernels.fp8.CANDIDATES`)."""
    from harness.kernels.fp8 import CANDIDATES

    return [dict(c, fp8=True) for c in CANDIDATES.values() if c.get("warp_specialized")]


def _warp_specialized(state_dtype: str) -> list[dict]:
    """The warp-specialized configs built per state dtype: every candidate for bf16 states; the
    shipped one for fp32; for int8 also the exact and the fast epilogue in plain slice order."""
    groups = kernel_build.candidate_groups()
    if state_dtype == "bf16":
        return groups["warp_specialized"] + groups["narrow"][1:]  # narrow[0] is a warp_specialized one
    shipped = [dataclasses.asdict(WARP_SPECIALIZED_DEFAULTS[state_dtype])]
    return shipped if state_dtype == "fp32" else groups["warp_specialized"][:2] + shipped


def _planned(state_dtype: str) -> list[dict]:
    """Every config the tests below build with `state_dtype`."""
    groups = kernel_build.candidate_groups()
    configs = [_shipped(T, state_dtype) for T in (1024, 8192)]
    configs += [_fp8(1024), _fp8_warp_specialized(state_dtype, 1024), _fp8_warp_specialized(state_dtype)]
    if state_dtype == "int8":
        configs.append(dict(_shipped(1024, "int8"), int8_group=128))
    if state_dtype in ("bf16", "int8"):
        overlapped = groups["shipped"][2]
        configs += [dict(overlapped, overlap_slices=False), overlapped]
    if state_dtype == "bf16":
        configs += [groups["pointers"][1], kernel_build.ELEMENTWISE, kernel_build.FP8_CAST]
        configs += _fp8_candidates()
    return configs + _warp_specialized(state_dtype) + _pingpong(state_dtype) + _fed(state_dtype)


def _pingpong(state_dtype: str) -> list[dict]:
    """The ping-pong kernel's config for `state_dtype` states (`PINGPONG_CONFIGS`)."""
    return [dataclasses.asdict(PINGPONG_CONFIGS[state_dtype])]


def _fed(state_dtype: str) -> list[dict]:
    """The fed ping-pong kernel's candidates for `state_dtype` states: the fast epilogue's for bf16
    states, the exact one's for fp32 states (`candidate_groups()["pingpong_fed"]`)."""
    fed = kernel_build.candidate_groups()["pingpong_fed"]
    fast = {"bf16": True, "fp32": False}.get(state_dtype)
    return [c for c in fed if c["fast_epilogue"] == fast]


def _key(config: dict, state_dtype: str) -> tuple[str, str]:
    """The same build whichever KernelConfig defaults a config spells out."""
    if "kernel" not in config:
        fields = {k: v for k, v in config.items() if k not in ("int8_group", "fp8")}
        config = dict(config, **dataclasses.asdict(KernelConfig(**fields)))
    return json.dumps(config, sort_keys=True), state_dtype


_BUILT: dict[tuple[str, str], dict] = {}
STATE_DTYPES = ("bf16", "fp32", "int8")


def built(configs: list[dict], state_dtype: str = "bf16") -> list[dict]:
    """`kernel_build.resources` of `configs` for sm_90. The first call builds every state dtype's
    `_planned` configs, one process per dtype, all at once; later calls read what they built."""
    if not _BUILT:
        plans = {d: list({_key(c, d): c for c in _planned(d)}.values()) for d in STATE_DTYPES}
        started = {d: kernel_build.start_resources(plan, 90, d) for d, plan in plans.items()}
        for d, process in started.items():
            for config, r in zip(plans[d], kernel_build.collect(process)):
                _BUILT[_key(config, d)] = r
    missing = [c for c in configs if _key(c, state_dtype) not in _BUILT]
    if missing:
        for config, r in zip(missing, kernel_build.resources(missing, 90, state_dtype)):
            _BUILT[_key(config, state_dtype)] = r
    return [_BUILT[_key(c, state_dtype)] for c in configs]


def test_the_shipped_config_is_the_first_candidate():
    shipped = dataclasses.asdict(pick_config(8192, 14336, 4096, "bf16", on_interpreter=False))
    first = dataclasses.asdict(KernelConfig(**kernel_build.candidates()[0]))
    assert first == shipped


def test_gemms_shorter_than_their_launch_read_by_pointers():
    """Llama-3.1-8B's k_proj at T = 1024 (8.6e9 FLOPs) skips the TMA descriptors' host cost; its
    q_proj (3.4e10) and anything larger keep the bulk copies."""
    assert pick_config(1024, 1024, 4096, "bf16", on_interpreter=False).tma == "none"
    assert pick_config(1024, 4096, 4096, "bf16", on_interpreter=False).tma == "host"
    assert pick_config(8192, 1024, 4096, "int8", on_interpreter=False).tma == "host"


def test_the_build_specializes_integers_as_a_launch_does():
    """A unit stride becomes a constant and a multiple of 16 is marked divisible, as Triton's JIT
    does for a real call: it decides whether the epilogue's memory accesses are vectorized."""
    ones, divisible = kernel_build.launch_specialization(dict(T=2048, K=4096, stride=1, odd=4097))
    assert ones == ["stride"] and divisible == ["T", "K"]


def test_the_elementwise_kernel_builds_for_hopper():
    (r,) = built([kernel_build.ELEMENTWISE])
    assert 0 < r["registers"] <= 255 and r["programs_per_sm"] >= 1


def test_the_fp8_cast_builds_for_hopper_without_spilling():
    """`forge.kernels.fp8_cast`'s cast (bf16 to e4m3, row-major and transposed, the FP8 rounding in
    integer operations) compiles for sm_90 with no spills."""
    (r,) = built([kernel_build.FP8_CAST])
    assert 0 < r["registers"] <= 255 and r["spill_stores"] == 0, r


def test_programs_per_multiprocessor():
    assert kernel_build.programs_per_multiprocessor(128, 96 * 1024, 256) == 2  # registers and shared
    assert kernel_build.programs_per_multiprocessor(255, 0, 256) == 1  # registers
    assert kernel_build.programs_per_multiprocessor(64, 160 * 1024, 128) == 1  # shared memory


def test_int8_groups_of_128_build_two_programs_per_sm():
    """The shipped int8 config with `int8_group=128` (half the scales) still fits two per SM, on
    the 64-row tile with overlapped slices (T <= 2048), where the registers are tightest."""
    (r,) = built([dict(_shipped(1024, "int8"), int8_group=128)], "int8")
    assert 0 < r["registers"] <= 128 and r["programs_per_sm"] == 2


@pytest.mark.parametrize("state_dtype", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("T", [1024, 8192])
def test_the_shipped_configs_fit_two_programs_per_sm_without_spilling(state_dtype, T):
    """What `pick_config` ships on Hopper at T = 1024 and 8192 builds at 128 registers with no
    spills: the spill-free 16-row slices ran faster than the spilling 32-row ones on 23 of the 24
    fp32 and int8 points tuned. Up to 8 bytes of stack allowed: triton 3.9 spills one register in
    the int8 64-row tile where 3.6 spills none."""
    config = _shipped(T, state_dtype)
    (r,) = built([config], state_dtype)
    assert 0 < r["registers"] <= 128 and r["programs_per_sm"] == 2, config
    assert r["stack_bytes"] <= 8 and r["spill_stores"] <= 1, (config, r)


@pytest.mark.parametrize("state_dtype", ["fp32", "bf16", "int8"])
def test_the_fp8_config_builds_on_fp8_tensor_cores_without_spilling(state_dtype):
    """FP8 dy and x (T-major, `forge.fp8`) build to Hopper's FP8 MMA (QGMMA in the SASS, no 16-bit
    HGMMA) with no spills and at least two programs per SM, for every state dtype."""
    (r,) = built([_fp8(1024)], state_dtype)
    assert r["tensor_core_mmas"]["QGMMA"] > 0 and r["tensor_core_mmas"]["HGMMA"] == 0, r
    assert r["spill_stores"] == 0 and r["programs_per_sm"] >= 2, r


@pytest.mark.parametrize("T", [1024, 4096])
@pytest.mark.parametrize("state_dtype", ["fp32", "bf16", "int8"])
def test_the_fp8_warp_specialized_kernel_builds_on_fp8_tensor_cores_without_spilling(state_dtype, T):
    """The warp-specialized kernel on FP8 operands, as shipped for each state dtype at T tokens
    (128-row tiles: two 64-row MMA warpgroups, each with the accumulator and the FP8 MMA's partial
    one; 64-row tiles: one), builds to QGMMA alone, with no spills, under the register cap of its
    warps, one program per SM within shared memory."""
    config = _fp8_warp_specialized(state_dtype, T)
    (r,) = built([config], state_dtype)
    assert r["tensor_core_mmas"]["QGMMA"] > 0 and r["tensor_core_mmas"]["HGMMA"] == 0, r
    assert r["registers"] == ws_max_registers(config["num_warps"], config["block_n"], fp8=True), r
    assert r["spill_stores"] == 0 and r["stack_bytes"] == 0, r
    assert r["programs_per_sm"] == 1 and r["shared_bytes"] <= 227 * 1024, r
    assert not r["mmas_serialized"], r


def test_the_fp8_kernel_labs_warp_specialized_candidates_build_without_spilling():
    """What `python -m harness kernels --fp8` times beside FORGE's choice builds for sm_90 (bf16
    states): 16-row slices, and 64-row tiles whose single MMA warpgroup leaves 8 epilogue warps,
    with the promotion overlapped too. None of their MMAs is serialized by ptxas: with the
    promotion overlapped, a copy of a partial tile still being written would serialize them all."""
    configs = _fp8_candidates()
    assert any(c["block_n"] == 64 and c["num_warps"] == 8 for c in configs)
    assert any(c.get("overlap_promotion") for c in configs)
    for config, r in zip(configs, built(configs)):
        assert r["tensor_core_mmas"]["QGMMA"] > 0 and r["spill_stores"] == 0, (config, r)
        assert r["registers"] == ws_max_registers(config["num_warps"], config["block_n"], fp8=True), r
        assert not r["mmas_serialized"], (config, r)


def test_candidates_come_in_named_groups_with_the_shipped_configs_first():
    groups = kernel_build.candidate_groups()
    only_wide = kernel_build.candidates(["wide"])
    assert only_wide == groups["shipped"] + groups["wide"]
    assert len(kernel_build.candidates()) == sum(map(len, groups.values()))
    with pytest.raises(ValueError, match="unknown candidate groups"):
        kernel_build.candidates(["prefech"])


def test_the_pointer_candidates_build_and_fit_two_programs_per_sm():
    """`KernelConfig(tma="none")` (group "pointers": masked loads, a launch of plain pointers)
    builds for Hopper at two programs per SM (spills depend on the Triton version: triton 3.9
    spills 8 bytes on the pointer path where 3.6 spills none)."""
    pointers = kernel_build.candidate_groups()["pointers"][1]
    assert pointers["tma"] == "none"
    (r,) = built([pointers])
    assert r["tma"] == "none" and r["registers"] <= 128 and r["programs_per_sm"] == 2


def test_every_candidate_is_a_kernel_config():
    """The tuner builds each candidate as a KernelConfig: no candidate names a field it lacks, and
    the config holds each field as the candidate gives it."""
    for fields in kernel_build.candidates():
        config = dataclasses.asdict(KernelConfig(**fields))
        assert {name: config[name] for name in fields} == fields


@pytest.mark.parametrize("state_dtype", ["bf16", "int8"])
def test_overlapped_slices_put_two_slices_of_loads_in_flight(state_dtype):
    """`overlap_slices` (group "overlap"): the epilogue issues the next slice's loads before the
    first slice's stores, where slice order loads one slice at a time; on 64-row tiles (shipped
    that way for int8 states at T <= 2048) it still fits two programs per SM (spill-free with
    triton 3.6)."""
    shipped = kernel_build.candidate_groups()["shipped"][2]  # 64 x 128, four 16-row slices
    assert shipped["overlap_slices"]
    plain, overlapped = built([dict(shipped, overlap_slices=False), shipped], state_dtype)
    assert (
        overlapped["epilogue_loads_before_first_store"] == 2 * plain["epilogue_loads_before_first_store"] > 0
    )
    assert overlapped["registers"] <= 128 and overlapped["programs_per_sm"] == 2


@pytest.mark.parametrize("state_dtype", ["bf16", "fp32", "int8"])
def test_the_warp_specialized_kernel_builds_for_hopper(state_dtype):
    """The warp-specialized Gluon kernel (shipped on Hopper for every state dtype) builds for sm_90
    as shipped and, with bf16 states, as every candidate: 8 and 4 epilogue warps, 256-row tiles with
    two MMA warpgroups, 64-column tiles. No spills (up to 8 bytes where slices overlap: triton 3.9
    spills that much for fp32 states), the register cap its warps fit under, one program per
    multiprocessor with its ring and staging buffer in shared memory."""
    configs = _warp_specialized(state_dtype)
    results = built(configs, state_dtype)
    for config, r in zip(configs, results):
        assert r["registers"] == ws_max_registers(config["num_warps"], config["block_n"]), config
        if state_dtype == "fp32" and config.get("fast_epilogue") and config.get("overlap_slices"):
            continue  # a candidate for bf16 states; fp32 states' wider loads spill 80 bytes there
        allowed = 8 if config.get("overlap_slices") else 0
        assert r["stack_bytes"] <= allowed and r["spill_stores"] <= allowed // 4, (config, r)
        assert r["programs_per_sm"] == 1 and r["shared_bytes"] <= 227 * 1024, config
    # the fast epilogue (approximate sqrt and division, hardware bf16 rounding) issues fewer
    # instructions than the exact one at the same warps: 2648 against 5256 for bf16 states at 8 warps
    # (int8: 5376 against 9208; its quantization divides by reciprocals of the group maxima; triton 3.6)
    if state_dtype == "fp32":
        return
    plain = [(c, r) for c, r in zip(configs, results) if not c.get("overlap_slices")]
    exact = {(c["num_warps"], c["block_n"]): r["instructions"] for c, r in plain if not c["fast_epilogue"]}
    fast = {(c["num_warps"], c["block_n"]): r["instructions"] for c, r in plain if c["fast_epilogue"]}
    assert exact and all(fast[key] < 0.8 * exact[key] for key in exact), (exact, fast)


def test_the_shipped_warp_specialized_configs_are_candidates():
    """The tuner times what ships: each state dtype's warp-specialized default is a candidate."""
    candidates = [_key(c, "") for c in kernel_build.candidate_groups()["warp_specialized"]]
    for config in WARP_SPECIALIZED_DEFAULTS.values():
        assert _key(dataclasses.asdict(config), "") in candidates, config


def test_the_fast_epilogue_is_an_option_of_the_warp_specialized_kernel_only():
    import torch

    from forge.kernels import wgrad_update
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

    from forge.kernels import wgrad_update
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


@pytest.mark.parametrize("state_dtype", ["bf16", "fp32"])
def test_the_fed_pingpong_kernel_reads_w_and_the_states_by_bulk_copies_only(state_dtype):
    """`forge.kernels.wgrad_update_pingpong_fed` builds for sm_90 as every candidate and as
    `PINGPONG_FED_CONFIGS` has it: the ping-pong kernel's 12-warp register cap, no spills, the MMAs
    asynchronous (16 wgmma), one program per multiprocessor, the shared memory that `shared_bytes`
    counts (within its 1 KiB allowance), and not one load into registers from global memory: W and
    the states arrive by bulk tensor copies (the ping-pong kernel's SASS holds 96 global loads,
    triton 3.9). The exact epilogue of fp32 states spills 24 bytes under triton 3.9 in
    16-column pieces (0 under 3.6; 80 in 32-column ones): a stack frame bounded here, as the kernel is
    an option FORGE never launches unasked."""
    from forge.kernels import PINGPONG_FED_CONFIGS
    from forge.kernels.wgrad_update_pingpong_fed import SHARED_BYTES, max_registers, shared_bytes

    configs = _fed(state_dtype)
    assert dataclasses.asdict(PINGPONG_FED_CONFIGS[state_dtype]) in [_full(c) for c in configs]
    size = {"bf16": 2, "fp32": 4}[state_dtype]
    stack = {"bf16": 0, "fp32": 24}[state_dtype]
    for config, r in zip(configs, built(configs, state_dtype)):
        assert r["registers"] == max_registers() == 168, config
        assert r["stack_bytes"] <= stack and (stack or r["spill_stores"] == 0), (config, r)
        assert r["programs_per_sm"] == 1 and not r["mmas_serialized"], config
        assert r["tensor_core_mmas"]["HGMMA"] == 16, r["tensor_core_mmas"]
        counted = shared_bytes(KernelConfig(**config), 2, (size, size))
        assert counted - 1024 <= r["shared_bytes"] <= counted <= SHARED_BYTES, (config, r["shared_bytes"])
        assert r["global_loads"] == 0 and r["bulk_tensor_loads"] > 0, (config, r)


def _full(config: dict) -> dict:
    """A config with every KernelConfig field spelled out."""
    return dataclasses.asdict(KernelConfig(**config))


@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
def test_the_pingpong_kernel_builds_for_hopper_without_spilling(state_dtype):
    """`forge.kernels.wgrad_update_pingpong` builds for sm_90 as `PINGPONG_CONFIGS` has it: two
    consumers at 240 registers beside the loader under the 12-warp cap, no spills, the MMAs
    asynchronous (each consumer's two 64-row wgmma per 16 tokens: 16 in all for 64-token stages),
    and one program per multiprocessor holding 6 stages of dy and x (192 KiB) and no staging buffer.
    Beside the ring: the barriers, and each consumer's scratch for converting a 32-row fp32 piece to
    the epilogue's layout, at most the piece's bytes; int8 pieces hold whole groups (64 columns at
    the build's int8_group of 64, where the others take `pingpong_cols`, 32), so int8's scratch is
    twice the others' (200.1 KiB in all against 196.1 KiB, triton 3.9)."""
    from forge.kernels.wgrad_update_pingpong import PIECE_ROWS, max_registers

    configs = _pingpong(state_dtype)
    for config, r in zip(configs, built(configs, state_dtype)):
        assert r["registers"] == max_registers() == 168, config
        assert r["stack_bytes"] == 0 and r["spill_stores"] == 0, (config, r)
        assert r["programs_per_sm"] == 1 and not r["mmas_serialized"], config
        assert r["tensor_core_mmas"]["HGMMA"] == 16, r["tensor_core_mmas"]
        stages = config["num_stages"] * 2 * config["block_t"] * config["block_n"] * 2
        group = config.get("int8_group", 64) if state_dtype == "int8" else 0
        scratch = 2 * PIECE_ROWS.value * max(config["pingpong_cols"], group) * 4  # 2 fp32 pieces
        assert stages <= r["shared_bytes"] <= stages + scratch + 1024, (config, r["shared_bytes"])


def test_a_pingpong_config_the_kernel_cannot_run_is_refused_by_name():
    """FP8 operands, another tile or warp count, or another design's options beside `pingpong`:
    an error naming the option, before anything is built."""
    from forge.kernels.configs import _check_pingpong

    config = PINGPONG_CONFIGS["bf16"]
    _check_pingpong(config, "bf16", 64, fp8=False)
    with pytest.raises(ValueError, match="FP8 operands take the warp-specialized kernel"):
        _check_pingpong(config, "bf16", 64, fp8=True)
    wrong = (
        dict(num_warps=8),
        dict(block_n=256),
        dict(overlap_promotion=True),
        dict(pingpong_cols=48),
        dict(pingpong_cols=16),  # the pieces of registers' loads: 32 or 64 columns
    )
    for bad in wrong:
        with pytest.raises(ValueError, match="KernelConfig.pingpong"):
            _check_pingpong(dataclasses.replace(config, **bad), "bf16", 64, fp8=False)
    with pytest.raises(ValueError, match="int8 groups of 128"):
        _check_pingpong(dataclasses.replace(config, block_k=64), "int8", 128, fp8=False)

"""The kernel lab: measure, build and tune FORGE's kernels one at a time, outside a training run.

    bench             the fused kernel against the GEMM + fused AdamW it replaces, per linear shape
                      and token count (`python -m harness kernels`); `--tune` times launch configs
    regress_suite     the regression check's kernel suite: a few shapes, per-repeat samples
                      (`python -m harness kernels --regress --output FILE`)
    build             the kernels compiled for Hopper on any machine, with their registers, spills
                      and shared memory (`python -m harness.kernels.build`; CPU)
    clip_norms        the ways of taking a layer's dW norm for clipping (`--clip-norms --output FILE`)
    fp8               the FP8 fused kernel against the FP8 GEMM and the FP8 GEMM + fused AdamW
                      (`python -m harness kernels --fp8 --output FILE`)
    shape_records     the per-(shape, T) record writer those two share
    layers            the models' linear shapes and the layers the benchmarks build (FORGE's, the
                      baseline's eager and graphed), shared by bench, regress_suite and the report
    tuning            which launch config wins where, from the records of `--tune` (CPU)
    profile           where one training step's time goes, per method (GPU; a CPU dry run)
    compare_profiles  two such profiles side by side, kernel by kernel (CPU)
    launch_breakdown  what one FORGE layer costs the host, layer by layer down the launch path (GPU)
    elementwise       the element-wise update (norms, embeddings) at other block shapes (GPU)
    tp_exactness      tensor-parallel FORGE against torch.optim at a real size (2 GPUs, torchrun)

Each tool is a module with a `main` (or a `--flag` of bench); README.md in this folder says what
each answers.

What the lab reads of forge. It builds, times and compiles forge's kernels one at a time, so beyond
forge's public API (`forge`, as the rest of the harness uses it) it reaches the modules that hold
them and their launch path, and only these (`FORGE_MODULES`; a test checks every import of the
lab against it, and that none imports a name forge keeps private, one starting with `_`): a
change to one of them is a change the lab follows.
"""

FORGE_MODULES = (
    "forge",  # attach, ForgeOptimizer, RULES, STATE_DTYPES, state_bytes, fp8, functional
    "forge.rules",  # get_rule, resolve_hparams: a rule's kernel coefficients (launch_breakdown)
    "forge.functional",  # the fused, element-wise and vector launches, the dW norm (clip_norms)
    "forge.steps",  # step_rows, step_row_words: the vector kernel's step rows (launch_breakdown)
    "forge.clip",  # GlobalNormClip, gram, norm_method: the ways of taking a dW norm (clip_norms)
    "forge.distributed",  # local, save_optimizer, load_optimizer (tp_exactness)
    "forge.kernels",  # the kernels, KernelConfig, pick_config, configs, the epilogue's arguments
    "forge.kernels.launch",  # FP_FUSION: the compile options every launch passes (build)
    "forge.kernels.update_tile",  # slot_arguments, step_arguments (overlap)
    "forge.kernels.wgrad_tile",  # tile_origin (overlap's probe kernels)
    "forge.kernels.wgrad_update_ws",  # the warp-specialized kernel and mma_warps (build, overlap)
    "forge.kernels.wgrad_update_pingpong",  # the ping-pong kernel, its consumers' main loop (build, overlap)
    "forge.kernels.wgrad_update_pingpong_fed",  # the fed ping-pong kernel and its parts (build, overlap)
    "forge.kernels.fp8_cast",  # cast_kernel, MAX_PARTIALS: the FP8 cast (build)
)

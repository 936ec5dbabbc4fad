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
each answers. The lab uses forge's public API only (`forge`, `forge.kernels`), like the rest of the
harness.
"""

"""Sweeps: from an experiment's config to one JSONL record per point.

One job per module:

    config          typed Hydra configs (dataclasses), composition and validation (`errors`)
    sweep           a sweep from config to records: grid or capacity search, resume, progress
    grid            the points of a sweep: their axes, ids and composed configs
    hardware        refuse what this machine cannot run, keep each machine's records apart
    local           one point in a fresh worker subprocess here (launcher=local)
    slurm           the points as Slurm jobs through submitit (launcher=slurm)
    summary         the table a sweep ends with
    launch          the worker's command line: python, or torchrun for tensor parallelism
    worker          the subprocess entry point around runner
    runner          one point in this process: build, train, measure, check, make a record
    methods/        one module per training method (fused AdamW, FORGE, the baselines)
    models          transformers models from architecture configs, random init
    measure         step timers, memory peaks (torch and NVML), the memory breakdown
    graphs          a whole training step captured once in a CUDA graph and replayed
    tensor_parallel the Megatron layout over DTensor for points with gpus > 1
    convergence     the training loop of convergence runs (real text, every step's loss)
    data            the convergence runs' corpora and tokenizer (`python -m harness data`)
    env             versions, GPU and git commit stamped on every record
"""

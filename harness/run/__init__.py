"""Sweeps: from an experiment's config to one JSONL record per point.

A sweep runs in two kinds of process: the sweep's parent (the command you typed, or a Slurm job
on its node), which composes and checks the points and writes their records, and one fresh
worker per point, which builds, trains and measures it. The parent never imports the worker's
modules; what both need is shared. One job per module:

  the sweep's parent
    sweep           a sweep from config to records: grid or capacity search, resume, progress
    grid            the points of a sweep: their axes, ids and composed configs
    hardware        refuse what this machine cannot run, keep each machine's records apart
    local           one point in a fresh worker subprocess here (launcher=local)
    slurm           the points as Slurm jobs through submitit (launcher=slurm)
    launch          the worker's command line: python, or torchrun for several GPUs
    summary         the table a sweep ends with

  shared by both
    config          typed Hydra configs (dataclasses), composition and validation (`errors`)
    record          a point's record (harness.results.Record) from its config; a failed point's,
                    the ranks' merged
    methods/        one module per training method (fused AdamW, FORGE, the baselines), each class
                    declaring what it is; the registry
    gpus            the GPU kinds of conf/gpu/ and their facts
    architecture    a conf/model entry as transformers sees it, and its size
    env             versions, GPU and git commit stamped on every record; the device
    data_parallel, tensor_parallel
                    the DDP/FSDP2 wrappers and the Megatron layout over DTensor (gpus > 1)
    data            the convergence runs' corpora and tokenizer (`python -m harness data`)

  the worker
    worker          the subprocess entry point around runner
    runner          one point in this process: build, train, measure, check, fill its record
    models          transformers models from architecture configs, random init
    measure         step timers, memory peaks (torch and NVML), the memory breakdown
    peak_pools      the memory pools at the peak of one recorded step
    graphs          a whole training step captured once in a CUDA graph and replayed
    main_grad       the fp32 main_grad buffers of the fp32-gradient baselines
    chunked_loss    the causal-LM loss in chunks
    convergence     the training loop of convergence runs (real text, every step's loss)
    branches, branch_reference
                    branched fidelity runs and their fp32 reference trajectory

tests/harness/test_owners.py checks the split: no parent module imports a worker module, and a
sweep's parent process loads none.
"""

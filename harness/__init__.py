"""forge-bench's sweep engine: run FORGE and its rivals point by point, measure, record.

`python -m harness sweep +exp=NAME` expands the grid of `conf/exp/NAME.yaml`, validates every
point's config, then runs each point in a fresh subprocess (`harness.worker`) and appends one
JSONL record per point to `results/<sweep>.jsonl` (`harness.results`). Modules, one job each:

    config     typed Hydra configs (dataclasses), composition and validation
    models     transformers models from architecture configs, random init
    methods/   one module per training method (fused AdamW, FORGE, the baselines), one interface
    measure    step timers, memory peaks (torch and NVML), the memory breakdown
    runner     one point in this process: build, train a few steps, measure, check, make a record
    worker     the subprocess entry point around runner
    sweep      the grid or capacity search, isolation, resume, progress
    env        versions, GPU and git commit stamped on every record
    results    the record format, atomic appends, `load()` into pandas
"""

"""forge-bench's harness: measure FORGE and its rivals point by point, report, check for regressions.

`python -m harness VERB` (harness/__main__.py) is the command line. The packages follow the jobs:

    run/        sweeps: configs, the grid, one fresh worker process per point, methods, models,
                measuring; writes one JSONL record per point to results/<sweep>.jsonl
    report/     results in, reports/ out: tables (Markdown, LaTeX), plots, reports/README.md
    regress.py  one run against a baseline: step-time, kernel-time and memory regressions
    kernels/    the kernel lab: the fused kernel's benchmark and regression suite, its build, tuner

and the modules they share, which read and write records:

    results     the record format, atomic appends, `load()` into pandas
    records     results files in, plain records out (the report's and regress's reader)
    points      what identifies a point (its configuration key) and how to name it
    stats       step-time statistics, and the change between two runs with its interval
    slowdown    a deliberate GPU delay of a known length (to show the regression check works)
    quiet       the four log lines torchao's import prints on a CPU, filtered (installed here)

A sweep, start to end: `run.config` composes and validates the experiment, `run.sweep` expands
its points (`run.grid`), checks the machine (`run.hardware`) and runs each in `python -m
harness.run.worker` (`run.local`), whose `run.runner` builds the model (`run.models`) and the
method (`run.methods`), times the steps (`run.measure`) and returns the record, which
`results.append` writes. `report.report` reads it back through `records`.
"""

from harness import quiet

quiet.install()

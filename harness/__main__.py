"""The command line: `python -m harness VERB [ARGS]`, one verb per job of the harness.

Each verb is a `Verb`: the line `python -m harness --help` shows for it, and the function that
runs it with the rest of the command line. The verbs that take Hydra overrides (sweep, run) carry
their own `--help` text, answered here before Hydra sees the arguments (Hydra would read `--help`
as an override and fail), and `sweep --dry-run` is taken off the line the same way; the others
hand their arguments, `--help` included, to the module that does the job, whose argparse answers.

Exit status: 0 when the harness did its job (a failed point is a result, not a failure), 2 for a
bad command line or config, 1 when the harness itself broke, 130 when interrupted.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass

PROG = "python -m harness"
DESCRIPTION = """\
The FORGE benchmark harness: sweep FORGE and its rivals over models, batch sizes and GPUs (one
fresh process per point), render the results into reports/, check a run for regressions against
a baseline, and benchmark the fused kernel."""
OVERRIDES = """\
OVERRIDE is a Hydra override of conf/config.yaml: +exp=NAME picks an experiment (exp=NAME works
too), GROUP=NAME a file of conf/GROUP/ (method=, model=, gpu=, launcher=), KEY=VALUE any
field (batch_size=2, seq_len=512, device=cpu, sweep.methods=[fused_adamw,forge_bf16]).
`python -m harness list` says what each experiment, method, model, GPU and launcher is."""

SWEEP_HELP = f"""\
usage: {PROG} sweep [OVERRIDE ...] [--dry-run]

Run or resume a sweep. The experiment's grid (methods x models x batch sizes x sequence lengths)
is expanded and every point's config validated first; then each point runs in a fresh
subprocess and appends one record to results/<sweep>.jsonl. Points already recorded there are
skipped, so the same command resumes a stopped sweep; add sweep.rerun=true to run them again.
It ends with a table of its points.
launcher=slurm runs each point as a Slurm job instead (conf/launcher/slurm.yaml's options,
launcher.partition=NAME and the rest); --dry-run prints the points or jobs it would start, with
their sbatch parameters, and starts nothing.

{OVERRIDES}

examples:
  {PROG} sweep +exp=smoke                      # every CPU method on tiny models, minutes on a CPU
  {PROG} sweep +exp=llama8b_h200               # Table 1: every method on Llama-3.1-8B, one GPU
  {PROG} sweep +exp=smoke sweep.methods=[fused_adamw,forge_bf16] sweep.models=[tiny-llama]
  {PROG} sweep +exp=capacity_a100_40gb sweep.max_batch_size=32
  {PROG} sweep +exp=llama8b_h200 launcher=slurm launcher.partition=gpu --dry-run
"""

RUN_HELP = f"""\
usage: {PROG} run [OVERRIDE ...]

Run one point in a fresh subprocess, print its record, and keep it in results/adhoc/ (scratch:
not committed). The point is conf/config.yaml with the overrides applied.

{OVERRIDES}

examples:
  {PROG} run model=tiny-llama gpu=cpu device=cpu seq_len=32 method=forge_bf16
  {PROG} run method=forge_int8 model=qwen3-0.6b batch_size=2 seq_len=1024
"""

LIST_HELP = f"""\
usage: {PROG} list [GROUP ...] [hydra.searchpath=[file://DIR]]

Say what each experiment (conf/exp/), method (conf/method/), model (conf/model/), GPU
(conf/gpu/) and launcher (conf/launcher/) is, one line each, and which method implementations a
conf/method file can name. GROUP is one of: exp, method, model, gpu, launcher, implementation
(default: all of them). A hydra.searchpath override lists the configs of DIR's groups too, as a
sweep given it composes them.

examples:
  {PROG} list
  {PROG} list exp method
"""


@dataclass(frozen=True)
class Verb:
    """One verb of the command line."""

    summary: str  # its line in `python -m harness --help`
    run: Callable[[list[str]], int]
    help: str | None = None  # its --help text; None: the module it hands over to answers --help


def _overrides(argv: list[str]) -> list[str]:
    return ["+" + a if a.startswith("exp=") else a for a in argv]


def cmd_sweep(argv: list[str]) -> int:
    from harness.run import sweep
    from harness.run.summary import summary_table

    overrides = _overrides([a for a in argv if a != "--dry-run"])  # ours, not an override for Hydra
    if "--dry-run" in argv:
        print(sweep.plan(overrides))
        return 0
    done = sweep.execute(overrides)
    print(summary_table(done.records, done.path))
    if done.skipped:
        print(sweep.skipped_note(done.skipped, len(done.records), done.path, overrides))
    return 0


def cmd_run(argv: list[str]) -> int:
    from harness import results
    from harness.run import env, grid, hardware, local, sweep
    from harness.run import record as point_record
    from harness.run.config import compose_config
    from harness.run.summary import summary_table

    overrides = ["results_dir=results/adhoc", "sweep.scratch=true", *_overrides(argv)]
    cfg = compose_config(overrides)
    hardware.check_hardware([cfg], _overrides(argv), env.machine(), verb="run")  # before any work
    point = grid.make_point(overrides)
    path = sweep.results_path(cfg)
    record = {**local.run_isolated(point, env.git_info()), **point_record.job_fields("local")}
    results.append(path, record)
    print(json.dumps({k: v for k, v in record.items() if k not in ("config", "env", "losses")}, indent=1))
    print(summary_table([record], path))
    return 0


LIST_GROUPS = {
    "exp": "experiments",
    "method": "methods",
    "model": "models",
    "gpu": "GPUs",
    "launcher": "launchers",
}
LIST_HOW = {
    "exp": "+exp=NAME",
    "method": "method=NAME",
    "model": "model=NAME",
    "gpu": "gpu=NAME",
    "launcher": "launcher=NAME",
}


def _rows(entries: dict[str, str]) -> list[str]:
    width = max(map(len, entries), default=0)
    return [f"  {name:<{width}}  {text}" for name, text in entries.items()]


def cmd_list(argv: list[str]) -> int:
    from harness.run.config import SEARCH_PATH_OVERRIDE, describe_choice, group_choices

    overrides = [a for a in argv if a.startswith(SEARCH_PATH_OVERRIDE)]
    wanted = [a for a in argv if a not in overrides] or [*LIST_GROUPS, "implementation"]
    unknown = [g for g in wanted if g not in LIST_GROUPS and g != "implementation"]
    if unknown:
        print(f"{PROG} list: unknown group {unknown[0]!r}\n\n{LIST_HELP}", file=sys.stderr, end="")
        return 2
    blocks = []
    for group in (g for g in LIST_GROUPS if g in wanted):
        entries = {name: describe_choice(group, name, overrides) for name in group_choices(group, overrides)}
        heading = f"{LIST_GROUPS[group]} (conf/{group}/, {LIST_HOW[group]}):"
        blocks.append("\n".join([heading, *_rows(entries)]))
    if "implementation" in wanted:
        from harness.run.methods import registry

        heading = "method implementations (the `name:` of a conf/method file):"
        summaries = {name: cls.summary or "(no summary given)" for name, cls in registry().items()}
        blocks.append("\n".join([heading, *_rows(summaries)]))
    print("\n\n".join(blocks))
    return 0


def _delegate(target: str) -> Callable[[list[str]], int]:
    """A verb that hands its arguments to `module:function(argv)`."""
    module, function = target.split(":")

    def run(argv: list[str]) -> int:
        return getattr(importlib.import_module(module), function)(argv)

    return run


VERBS = {
    "sweep": Verb("run or resume a sweep of points: sweep +exp=smoke", cmd_sweep, SWEEP_HELP),
    "run": Verb("run one point, print its record, keep it in results/adhoc/", cmd_run, RUN_HELP),
    "list": Verb("what each experiment, method, model, GPU and launcher config is", cmd_list, LIST_HELP),
    "report": Verb(
        "render results/ into reports/ (tables, plots, README) and the docs' generated tables",
        _delegate("harness.report.command:main"),
    ),
    "regress": Verb(
        "compare a run with a baseline: step-time and memory regressions", _delegate("harness.regress:main")
    ),
    "kernels": Verb(
        "benchmark the fused kernel against cuBLAS, or tune its launch configs",
        _delegate("harness.kernels.bench:main"),
    ),
    "data": Verb(
        "prepare the text corpora and tokenizers of the convergence runs", _delegate("harness.run.data:main")
    ),
}


def usage() -> str:
    """What `python -m harness --help` prints."""
    width = max(map(len, VERBS))
    verbs = "\n".join(f"  {name:<{width}}  {verb.summary}" for name, verb in VERBS.items())
    return (
        f"usage: {PROG} VERB [ARGS]\n\n{DESCRIPTION}\n\nverbs:\n{verbs}\n\n"
        f"Run `{PROG} VERB --help` for a verb's arguments and examples."
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        print(usage(), file=sys.stderr)
        return 2
    name, rest = argv[0], argv[1:]
    if name in ("-h", "--help") or (name == "help" and not rest):
        print(usage())
        return 0
    if name == "help":
        name, rest = rest[0], ["--help"]
    if name not in VERBS:
        print(f"{PROG}: unknown verb {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    verb = VERBS[name]
    if verb.help is not None and any(a in ("-h", "--help") for a in rest):
        print(verb.help, end="")
        return 0
    from harness.run.errors import ConfigError

    try:
        return verb.run(rest)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: the same command resumes (recorded points are skipped)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

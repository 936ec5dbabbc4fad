"""The command line: `python -m harness SUBCOMMAND [ARGS]`.

    sweep [OVERRIDES]     run or resume a sweep: python -m harness sweep +exp=smoke
    run [OVERRIDES]       one point, isolated, printed and kept in results/adhoc/
    list                  methods, models, GPUs and experiments
    report [ARGS]         tables and plots from results/        (harness.report)
    regress BASE CUR      step-time and memory regressions      (harness.regress)
    kernels [ARGS]        kernel micro-benchmarks               (harness.kernels)

OVERRIDES are Hydra overrides on conf/config.yaml (`method=forge_int8 batch_size=2`,
`+exp=NAME`; `exp=NAME` is accepted too). Exit codes: 0 when the harness did its job (failed
points are results, not failures), 2 for a bad config, 1 when the harness itself broke.
"""

from __future__ import annotations

import importlib
import json
import sys

USAGE = __doc__.split("\n\n")[1]


def _overrides(argv: list[str]) -> list[str]:
    return ["+" + a if a.startswith("exp=") else a for a in argv]


def cmd_sweep(argv: list[str]) -> int:
    from harness import sweep

    path = sweep.run_sweep(_overrides(argv))
    print(f"results: {path}")
    return 0


def cmd_run(argv: list[str]) -> int:
    from harness import sweep

    overrides = ["results_dir=results/adhoc", "sweep.scratch=true", *_overrides(argv)]
    cfg = sweep.compose_config(overrides)
    point = sweep.make_point(overrides)
    path = sweep.results_path(cfg)
    record = sweep.run_isolated(point, sweep.env.git_info())
    sweep.results.append(path, record)
    print(json.dumps({k: v for k, v in record.items() if k not in ("config", "env", "losses")}, indent=1))
    print(sweep.summary(record))
    return 0


def cmd_list(argv: list[str]) -> int:
    from harness.config import group_choices
    from harness.methods import REGISTRY

    print("method implementations:", ", ".join(REGISTRY))
    for group in ("method", "model", "gpu", "exp"):
        print(f"{group}:", ", ".join(group_choices(group)))
    return 0


def _delegate(module: str, issue: str):
    def run(argv: list[str]) -> int:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            print(f"{module} is not part of this checkout yet ({issue})", file=sys.stderr)
            return 1
        return mod.main(argv)

    return run


COMMANDS = {
    "sweep": cmd_sweep,
    "run": cmd_run,
    "list": cmd_list,
    "report": _delegate("harness.report", "issue 5"),
    "regress": _delegate("harness.regress", "issue 6"),
    "kernels": _delegate("harness.kernels", "the kernel benchmark"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help") or argv[0] not in COMMANDS:
        print(USAGE, file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help", "help") else 2
    from harness.config import ConfigError

    try:
        return COMMANDS[argv[0]](argv[1:])
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: the same command resumes (recorded points are skipped)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""Mutation score of FORGE's numeric core: how many one-line bugs its tests catch.

cosmic-ray (the `test` extra) makes every mutant of a file: each number moved by one, each
arithmetic operator swapped for another, each comparison changed, each condition negated, each
`and` made `or`, each decorator dropped, each loop emptied. Every mutant is written into a private
copy of the tree and the file's curated tests (`TARGETS`: those that exercise it, fastest first)
run against it, stopping at the first failure: a failing test kills the mutant, tests that all
pass let it survive. Workers (one per core) import torch and Triton once, then fork one child per
mutant, which imports `forge` from the mutated copy (no bytecode is written, so no stale `.pyc` can
stand for the source) and runs pytest in-process: a mutant costs its tests, not a Python start.
A mutant whose tests outlast `TIMEOUT_FACTOR` times the unmutated run's (an endless loop) counts
as killed, as cosmic-ray counts it.

Left out, as cosmic-ray's operators-filter leaves out operators: replacements that only move an
operator out of its type's domain (bitwise and shift operators, floor division, modulo and powers
in place of float arithmetic; identity and membership tests in place of number comparisons; `~`
on a float). On this code they fail with a TypeError or are killed by any test that runs the line.

    python scripts/mutation_score.py                          # the six files, 2 workers
    python scripts/mutation_score.py forge/clip.py --workers 1 --limit 40   # a quick look
    python scripts/mutation_score.py forge/rules.py --sample 3    # every third mutant, in line order
    python scripts/mutation_score.py --survivors-of results/mutation/RECORD.json  # its survivors again

Writes results/mutation/mutation-<date>-<commit>.json (with --out, elsewhere): per file the
mutants made, killed, survived and timed out, and every survivor's diff; the tool's version, the
commit, the date and the tests each file ran. docs/testing.md reads it.

--survivors-of RECORD runs only that record's survivors against today's tests: a quick check that
a test added kills what it was written for. A mutant is named by its operator and its occurrence
in the file, which mean the same mutant only in the same source, so a file that changed since the
commit the record ran it at is refused. Its record goes to --out, else to the temporary folder,
never into results/.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Each file and the tests that exercise it, those most likely to fail first: a mutant that
# survives runs them all, so each list holds what kills, not every test that touches the file.
_MUON = "tests/forge/test_muon.py::"
_OPTIM = "tests/forge/test_optim.py::"
_CLIP = "tests/forge/test_clip.py::"
_INT8 = "tests/forge/test_int8_states.py::"
_STEPS = _INT8 + "test_each_step_stores_the_definitions_codes_of_torch_optims_state"
_WITHIN = _INT8 + "test_int8_states_stay_within_the_quantization_step_of_fp32_states"
TARGETS = {
    "forge/kernels/quant.py": [
        _INT8 + "test_the_pytorch_quantizer_is_the_definition",
        _INT8 + "test_the_pytorch_round_up_to_bf16_is_the_definitions",
        *(f"{_STEPS}[{case}-elementwise]" for case in ("adamw", "adagrad", "rmsprop-centered-momentum")),
        *(f"{_STEPS}[{case}-fused]" for case in ("adamw-group128", "sgd-momentum")),
        f"{_WITHIN}[adagrad]",
        _INT8
        + "test_the_kernels_scales_round_up_from_one_ulp_above_a_bf16_value_and_a_zero_group_stays_zero",
        "tests/forge/kernels/test_quant.py",
        "tests/forge/kernels/test_elementwise_update.py::test_triton_rule_matches_its_pytorch_twin[adamw]",
        _OPTIM + "test_state_dict_resumes_bit_exactly[bf16-64]",  # bf16 states, in both kernels
    ],
    "forge/newton_schulz.py": [
        "tests/harness/kernels/test_newton_schulz_probe.py::test_forges_auto_table_is_the_newest_committed_runs_pick",
        "tests/forge/test_newton_schulz.py",
        "tests/forge/test_muon_orthogonalize.py",
        _MUON + "test_what_muon_cannot_train_is_refused_before_anything_changes",
        _MUON + "test_each_newton_schulz_variant_reaches_the_layers",
    ],
    "forge/clip.py": [
        _CLIP + "test_each_layers_norm_is_taken_the_cheaper_way",
        _CLIP + "test_outside_a_backward_one_update_is_clipped_by_its_own_norm",
        _CLIP + "test_gram_and_direct_norms_agree",
        _CLIP + "test_a_shared_input_has_its_gram_computed_once",
        _CLIP + "test_bad_clipping_options_are_refused_before_anything_changes",
        _CLIP + "test_without_max_grad_norm_there_is_no_norm_to_read",
        _CLIP + "test_clipped_step_matches_torch_clip_grad_norm[adamw-active]",
        _CLIP + "test_clipped_step_matches_torch_clip_grad_norm[sgd-inactive]",
        _CLIP + "test_other_norm_types_match_torch",
        _CLIP + "test_a_norm_other_than_2_is_taken_directly_whichever_way_is_asked",
        _CLIP + "test_the_norm_and_coefficient_stay_in_the_same_tensors_step_after_step",
        _CLIP + "test_param_groups_share_one_global_norm",
        _CLIP + "test_a_failed_backward_updates_nothing_and_leaves_nothing_behind",
        _CLIP + "test_low_precision_states_are_clipped_too",
        _CLIP + "test_the_kernels_grad_scale_is_exact",
    ],
    "forge/muon.py": [
        "tests/forge/test_muon_orthogonalize.py",
        _MUON + "test_forge_muon_equals_torch_muon",
        _MUON + "test_the_comparison_sees_each_hyperparameter",
        _MUON + "test_steps_read_from_device_rows_equal_steps_from_the_host",
        _MUON + "test_muon_with_an_adamw_fallback_equals_torch_muon_beside_torch_adamw[one-step]",
    ],
    "forge/states.py": [
        _INT8 + "test_a_state_read_back_is_what_its_storage_holds",
        _INT8 + "test_state_bytes_are_what_each_storage_keeps_per_element",
        _INT8 + "test_int8_storage_holds_matrices_and_leaves_vectors_bf16",
        _INT8 + "test_slots_hand_their_tensors_over_in_one_order_and_take_them_back",
        _INT8 + "test_a_saved_state_of_another_shape_or_dtype_is_refused",
        *(
            f"{_INT8}test_each_step_stores_the_definitions_codes_of_torch_optims_state[{case}-elementwise]"
            for case in ("adagrad", "rmsprop-centered-momentum", "adamw-group128")
        ),
        _OPTIM + "test_bad_options_are_refused",
        _OPTIM + "test_int8_group_sets_the_scales_and_a_mismatch_is_refused",
        _OPTIM + "test_state_dict_with_a_different_state_dtype_is_refused",
        _OPTIM + "test_converting_another_rules_state_is_refused",
        _OPTIM + "test_converting_a_state_with_a_slot_more_or_less_is_refused",
        _OPTIM + "test_a_torch_adamw_run_continues_under_forge",
        _OPTIM + "test_state_dict_resumes_bit_exactly",
        "tests/forge/test_compensated.py::test_a_model_trains_with_compensated_weights_and_resumes_exactly",
    ],
    "forge/rules.py": [
        "tests/forge/kernels/test_elementwise_update.py::test_both_halves_step_as_torch_optim",
        "tests/forge/test_rules.py::test_each_rules_defaults_are_its_torch_optimizers",
        "tests/forge/test_rules.py::test_muons_tile_half_reference_is_torchs_lerp",
        "tests/forge/test_rules.py::test_radam_steps_as_torch_with_its_rectification_at_full_weight",
        "tests/forge/test_validation.py",
        _OPTIM + "test_unknown_rule_lists_the_valid_ones",
        _OPTIM + "test_bad_options_are_refused",
        _OPTIM + "test_param_groups_per_group_options",
        _MUON + "test_what_muon_cannot_train_is_refused_before_anything_changes",
        _MUON + "test_a_refusal_names_four_parameters_and_marks_any_more",
        _MUON + "test_muon_takes_coefficients_of_its_own_for_torchs_iteration",
        _MUON + "test_fallback_is_for_matrix_rules_only",
        _MUON + "test_a_state_dict_of_other_group_rules_is_refused",
        _MUON + "test_forge_muon_equals_torch_muon[original-nesterov]",
        _MUON + "test_muon_with_an_adamw_fallback_equals_torch_muon_beside_torch_adamw[one-step]",
        f"{_STEPS}[adamw-elementwise]",  # int8: which states are positive
    ],
}
# Replacements left out (the module docstring), as regular expressions on cosmic-ray's operator names.
EXCLUDED_OPERATORS = (
    r"core/ReplaceBinaryOperator_\w+_(BitOr|BitAnd|BitXor|LShift|RShift|FloorDiv|Mod|Pow)$",
    r"core/ReplaceComparisonOperator_\w+_(Is|IsNot|In|NotIn)$",
    r"core/ReplaceUnaryOperator_\w+_Invert$",
)
TIMEOUT_FACTOR, MIN_TIMEOUT_S = 10.0, 60.0
PYTEST_ARGS = ["-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--no-header"]
# Imported once per worker, before any mutant: what every child would otherwise import again.
PRELOAD = ("torch", "triton", "triton.language", "numpy", "pytest", "hypothesis", "transformers")


def _annotations(path: Path) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) positions (line, column) of the type annotations in a file: with `from __future__
    import annotations` (every target has it) they are never evaluated, so a mutant there changes
    nothing that runs."""
    import ast

    spans = []
    for node in ast.walk(ast.parse(path.read_text())):
        found = [getattr(node, "returns", None), getattr(node, "annotation", None)]
        for a in filter(None, found):
            spans.append(((a.lineno, a.col_offset), (a.end_lineno, a.end_col_offset)))
    return spans


def mutants(path: str) -> list[dict]:
    """Every mutant cosmic-ray makes of `path` (relative to the repository), less the excluded
    operators and anything inside a type annotation."""
    from cosmic_ray.commands import init
    from cosmic_ray.work_db import WorkDB, use_db

    excluded = re.compile("|".join(EXCLUDED_OPERATORS))
    annotations = _annotations(REPO / path)
    in_annotation = lambda m: any(a <= tuple(m.start_pos) and tuple(m.end_pos) <= b for a, b in annotations)  # noqa: E731
    with (
        tempfile.TemporaryDirectory() as scratch,
        use_db(str(Path(scratch) / "work.sqlite"), WorkDB.Mode.create) as db,
    ):
        init([REPO / path], db, {})
        found = [
            dict(file=path, operator=m.operator_name, occurrence=m.occurrence, line=m.start_pos[0])
            for item in db.pending_work_items
            for m in item.mutations
            if not excluded.match(m.operator_name) and not in_annotation(m)
        ]
    return sorted(found, key=lambda m: (m["line"], m["operator"], m["occurrence"]))


def _copy_tree(into: Path) -> None:
    """The tracked files and the untracked ones git does not ignore, as they are on disk."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():  # results/ too: tests read recorded runs (the AUTO table's source)
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)


def _run_tests(tree: Path, tests: list[str], timeout_s: float) -> tuple[str, float]:
    """("passed", "failed" or "timeout", seconds) of `tests` in a forked child, against `tree`."""
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: a fresh import of forge and the tests from the tree, pytest in-process
        try:
            os.chdir(tree)
            sys.path.insert(0, str(tree))
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            import pytest

            import forge

            if not forge.__file__.startswith(str(tree)):  # an installed forge would hide the mutant
                os._exit(4)
            code = pytest.main([*PYTEST_ARGS, *tests])
        except BaseException:  # noqa: BLE001 - whatever the mutant broke, it failed the tests
            code = 1
        os._exit(int(code))
    deadline = start + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            if code in (4, 5):  # pytest's usage error or no tests: the selection itself is wrong
                raise RuntimeError(f"pytest exited {code} on {tests} in {tree}: no test ran")
            return ("passed" if code == 0 else "failed"), time.monotonic() - start
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "timeout", time.monotonic() - start
        time.sleep(0.05)


def _worker(index: int, tree: Path, jobs, results, baseline_s: dict) -> None:
    """Run mutants from `jobs` against `tree` until it yields None, each result onto `results`."""
    from cosmic_ray.mutating import use_mutation
    from cosmic_ray.plugins import get_operator

    for name in PRELOAD:
        __import__(name)
    while (job := jobs.get()) is not None:
        path = tree / job["file"]
        timeout_s = max(MIN_TIMEOUT_S, TIMEOUT_FACTOR * baseline_s[job["file"]])
        with use_mutation(path, get_operator(job["operator"])(), job["occurrence"]) as (original, mutated):
            if mutated is None:
                results.put(dict(job, outcome="not made", seconds=0.0))
                continue
            outcome, seconds = _run_tests(tree, TARGETS[job["file"]], timeout_s)
        diff = "".join(
            difflib.unified_diff(
                original.splitlines(keepends=True),
                mutated.splitlines(keepends=True),
                job["file"],
                job["file"],
                n=0,
            )
        )
        results.put(dict(job, outcome={"passed": "survived", "failed": "killed"}.get(outcome, outcome),
                         seconds=round(seconds, 2), diff=diff))  # fmt: skip


def _environment() -> None:
    """What every worker and child runs under: the interpreter for the kernels, one thread each, no
    bytecode written (a mutant and its original may share a size and a second of mtime)."""
    os.environ.update(
        TRITON_INTERPRET="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"
    )
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = (
        "1"  # none of xdist, timeout, benchmark: a third of a start
    )
    sys.dont_write_bytecode = True


def _baselines(tree: Path, files: list[str]) -> dict[str, float]:
    """Seconds of each file's tests on the unmutated tree; they must pass."""
    for name in PRELOAD:
        __import__(name)
    seconds = {}
    for path in files:
        outcome, seconds[path] = _run_tests(tree, TARGETS[path], 3600.0)
        if outcome != "passed":
            raise SystemExit(f"{path}'s tests fail without a mutant: {' '.join(TARGETS[path])}")
        print(f"{path}: its tests take {seconds[path]:.1f} s unmutated", flush=True)
    return seconds


def _summary(path: str, done: list[dict]) -> dict:
    made = [r for r in done if r["outcome"] != "not made"]
    killed = sum(r["outcome"] in ("killed", "timeout") for r in made)
    return dict(
        mutants=len(made),
        killed=killed,
        timeout=sum(r["outcome"] == "timeout" for r in made),
        survived=len(made) - killed,
        score=round(killed / len(made), 4) if made else None,
        tests=TARGETS[path],
        survivors=[
            {k: r[k] for k in ("line", "operator", "occurrence", "diff")}
            for r in made
            if r["outcome"] == "survived"
        ],
    )


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "forge", "tests"], cwd=REPO, capture_output=True, text=True
    )
    return out.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def _record_commit(record: dict, path: str) -> str:
    """The commit `record` ran `path` at: its own entry's (a merged record) or the record's."""
    commit = record["files"][path].get("commit", record["commit"])
    if commit.endswith("+changes"):
        raise SystemExit(f"{path} ran at {commit}: uncommitted changes, so its mutants cannot be made again")
    return commit


def survivors_of(record_path: Path, files: list[str]) -> list[dict]:
    """The mutants that survived in the record at `record_path`, of `files` (default: the record's),
    made again from today's source; refused where a file differs from the one the record ran."""
    record = json.loads(record_path.read_text())
    files = files or [path for path in TARGETS if path in record["files"]]
    missing = sorted(set(files) - set(record["files"]))
    if missing:
        raise SystemExit(f"{record_path} ran no mutants of {missing}")
    changed = []
    for path in files:
        commit = _record_commit(record, path)
        same = subprocess.run(["git", "diff", "--quiet", commit, "--", path], cwd=REPO)
        if same.returncode != 0:
            changed.append(f"{path} (since {commit})")
    if changed:
        unchanged = [p for p in files if not any(c.startswith(p + " ") for c in changed)]
        raise SystemExit(
            f"changed since the record ran them: {', '.join(changed)}. A mutant is its operator's n-th "
            "occurrence in the file's source, so these would not be the record's mutants: run them whole"
            + (f", and these alone with --survivors-of: {' '.join(unchanged)}" if unchanged else "")
        )
    jobs = []
    for path in files:
        wanted = {(s["operator"], s["occurrence"]): s for s in record["files"][path]["survivors"]}
        made = {(m["operator"], m["occurrence"]): m for m in mutants(path)}
        lost = sorted(set(wanted) - set(made))
        if lost:  # same source, same operators: only another cosmic-ray could make other mutants
            raise SystemExit(f"{path}: the record's mutants {lost} are not made from its source today")
        jobs += [made[key] for key in sorted(wanted, key=lambda k: (made[k]["line"], k))]
    return jobs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="files of TARGETS (default: all, or the record's)")
    parser.add_argument("--workers", type=int, default=2, help="processes, one per core (default 2)")
    parser.add_argument(
        "--limit", type=int, default=None, help="at most this many mutants per file (a quick look)"
    )
    parser.add_argument(
        "--sample", type=int, default=1, help="every SAMPLE-th mutant of a file (default: all)"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="the JSON written (default results/mutation/...)"
    )
    parser.add_argument(
        "--merge", type=Path, nargs="+", default=None, help="join records of one commit, file by file"
    )
    parser.add_argument(
        "--survivors-of",
        type=Path,
        default=None,
        metavar="RECORD",
        help="only the survivors of this record (files unchanged since it ran them)",
    )
    args = parser.parse_args(argv)
    if args.merge:
        return _merge(args.merge, args.out)
    if args.survivors_of and (args.sample != 1 or args.limit is not None):
        parser.error("--survivors-of runs every survivor of its record: no --sample or --limit")
    unknown = sorted(set(args.files) - set(TARGETS))
    if unknown:
        parser.error(f"no curated tests for {unknown}: choose among {sorted(TARGETS)}")
    import multiprocessing as mp

    import cosmic_ray

    if args.survivors_of:
        jobs = survivors_of(args.survivors_of, args.files)
        files = list(dict.fromkeys(m["file"] for m in jobs))
        if not jobs:
            raise SystemExit(f"{args.survivors_of}: no survivors of {args.files or 'its files'} to run")
    else:
        files = args.files or list(TARGETS)
        jobs = [m for path in files for m in mutants(path)[:: args.sample][: args.limit]]
    _environment()
    started, day = time.monotonic(), datetime.datetime.now(datetime.UTC)
    commit = _commit()
    with tempfile.TemporaryDirectory(prefix="forge-mutants-") as scratch:
        trees = [Path(scratch) / f"tree{i}" for i in range(args.workers)]
        for tree in trees:
            _copy_tree(tree)
        print(f"{len(jobs)} mutants of {len(files)} files, {args.workers} workers", flush=True)
        baseline = _baselines(trees[0], files)
        context = mp.get_context("fork")
        queue, results = context.Queue(), context.Queue()
        for job in jobs:
            queue.put(job)
        workers = [
            context.Process(target=_worker, args=(i, tree, queue, results, baseline))
            for i, tree in enumerate(trees)
        ]
        for worker in workers:
            queue.put(None)
            worker.start()
        done = []
        # each result as it comes, to follow a long run: beside --out, else in the scratch folder
        log = (args.out or Path(scratch) / "results").with_suffix(".partial.jsonl")
        log.parent.mkdir(parents=True, exist_ok=True)
        for n in range(1, len(jobs) + 1):
            done.append(results.get())
            with open(log, "a") as f:
                f.write(json.dumps(done[-1]) + "\n")
            if n % 10 == 0 or n == len(jobs):
                killed = sum(r["outcome"] in ("killed", "timeout") for r in done)
                print(f"{n}/{len(jobs)}: {killed} killed, {time.monotonic() - started:.0f} s", flush=True)
        for worker in workers:
            worker.join()
    record = _totalled(
        dict(
            tool="cosmic-ray",
            tool_version=cosmic_ray.__version__
            if hasattr(cosmic_ray, "__version__")
            else _version("cosmic-ray"),
            commit=commit,
            date=day.strftime("%Y-%m-%d"),
            python=sys.version.split()[0],
            torch=_version("torch"),
            triton=_version("triton"),
            workers=args.workers,
            wall_s=round(time.monotonic() - started),
            excluded_operators=list(EXCLUDED_OPERATORS),
            limit=args.limit,
            sample=args.sample,
            files={path: _summary(path, [r for r in done if r["file"] == path]) for path in files},
        )
    )
    if args.survivors_of:  # a check, not a score: never a record under results/
        record["survivors_of"] = args.survivors_of.as_posix()
        for r in sorted(done, key=lambda r: (r["file"], r["line"])):
            change = " / ".join(line for line in r.get("diff", "").splitlines()[2:] if line[:1] in "+-")
            print(f"{r['outcome']:8s} {r['file']}:{r['line']} {r['operator']} #{r['occurrence']}: {change}")
        out = args.out or Path(tempfile.gettempdir()) / f"survivors-of-{args.survivors_of.stem}.json"
        return _write(record, out)
    _write(record, args.out)


def _totalled(record: dict) -> dict:
    made = sum(f["mutants"] for f in record["files"].values())
    killed = sum(f["killed"] for f in record["files"].values())
    record["total"] = dict(mutants=made, killed=killed, survived=made - killed, score=round(killed / made, 4))
    return record


def _write(record: dict, out: Path | None) -> None:
    name = f"mutation-{record['date'].replace('-', '')}-{record['commit'].split('+')[0]}.json"
    out = out or REPO / "results" / "mutation" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    for path, f in record["files"].items():
        print(f"{path}: {f['killed']} of {f['mutants']} killed ({f['score']:.1%}), {f['survived']} survived")
    total = record["total"]
    print(f"all: {total['killed']} of {total['mutants']} killed ({total['score']:.1%}); written to {out}")


def _merge(paths: list[Path], out: Path | None) -> None:
    """One record of runs made file by file (each a record of this script): each file keeps the
    commit, the date and the sampling it ran with; the record's own are the latest run's."""
    records = sorted((json.loads(p.read_text()) for p in paths), key=lambda r: r["date"])
    merged = dict(records[-1], files={}, wall_s=sum(r["wall_s"] for r in records))
    for r in records:
        for path, summary in r["files"].items():
            merged["files"][path] = dict(
                summary, commit=r["commit"], date=r["date"], sample=r.get("sample", 1), workers=r["workers"]
            )
    merged["files"] = {path: merged["files"][path] for path in TARGETS if path in merged["files"]}
    _write(_totalled(merged), out)


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


if __name__ == "__main__":
    main()

"""`python -m harness.kernels.newton_schulz`: each Newton-Schulz variant's time and accuracy per shape.

FORGE's Muon spends most of a step orthogonalizing every hidden matrix (`forge.newton_schulz`).
For every hidden matrix shape of the models named (Llama-3.1-8B and Qwen3-14B by default, read
from conf/model/: q, k, v, o, gate, up, down; one record per distinct shape), this times each
variant on the same bf16 update, as Muon runs it (5 steps, torch's coefficients,
`triton.testing.do_bench`, median), and measures in fp64 how far its output lies from

  polar      the polar factor U V^T of the update (from the fp64 Gram matrix's eigendecomposition,
             (G G^T)^(-1/2) G: the same as the SVD's for a full-rank update);
  own_fp64   its own polynomial run in fp64 (torch's iteration for torch, symmetric, gram and
             gram_symmetric; Polar Express's for polar_express): what its half-precision
             arithmetic costs;
  torch      torch's bf16 output (the default's).

The update is a Gaussian matrix (seed 0), whose singular values spread as a random gradient's do.
`safe` marks a variant that computes torch's polynomial and lands at most twice as far from it in
fp64 as torch's own bf16 iteration does (the rule the CPU tests hold them to); polar_express
computes another polynomial (a different update, whose training effect a fidelity run measures)
and is never picked. One JSONL record per (shape, variant) into $OUT (results/out/ without it),
`newton-schulz-<date>-<time>-<commit>.jsonl`; about a minute on an H100 or H200. `--tiny` runs
the same at three small shapes on the CPU (Triton's interpreter; times mean nothing) into
`newton-schulz-tiny-...`, which the docs' block and `--auto` must never be given.

  --auto FILE   the fastest safe variant per shape from a run's records, written into
                forge/newton_schulz.py's `AUTO` table (between its generated markers), and
                printed; the docs' generated block (`harness.report.doc_probes`) shows the same.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch

from harness import results, sources

MODELS = ("llama3.1-8b", "qwen3-14b")
STEPS = 5
EPS = 1e-7
CONF = Path(__file__).resolve().parents[2] / "conf" / "model"
AUTO_FILE = Path(__file__).resolve().parents[2] / "forge" / "newton_schulz.py"
FILE_PREFIX = "newton-schulz-"  # a run's records: newton-schulz-<date>-<time>-<commit>.jsonl
AUTO_BEGIN = "# generated: newton-schulz-auto"
AUTO_END = "# end generated: newton-schulz-auto"


def hidden_shapes(model: str, conf: Path = CONF) -> dict[str, tuple[int, int]]:
    """{"q": (rows, cols), ...} of a decoder block's hidden matrices (W is (out, in)), from
    conf/model/<model>.yaml; distinct shapes only, the first name kept (k for k and v)."""
    import yaml

    path = conf / f"{model}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in conf.glob("*.yaml")))
        raise ValueError(f"no model config {path}; known models: {known}")
    cfg = yaml.safe_load(path.read_text())
    hidden, inter = int(cfg["hidden_size"]), int(cfg["intermediate_size"])
    head_dim = int(cfg.get("head_dim") or hidden // int(cfg["num_attention_heads"]))
    q, kv = int(cfg["num_attention_heads"]) * head_dim, int(cfg["num_key_value_heads"]) * head_dim
    named = {"q": (q, hidden), "k": (kv, hidden), "v": (kv, hidden), "o": (hidden, q)}
    named |= {"gate": (inter, hidden), "up": (inter, hidden), "down": (hidden, inter)}
    shapes: dict[str, tuple[int, int]] = {}
    for name, shape in named.items():
        if shape not in shapes.values():
            shapes[name] = shape
    return shapes


def polar_factor(u: torch.Tensor) -> torch.Tensor:
    """U V^T of u's SVD in fp64, as (G G^T)^(-1/2) G on the wide orientation (G full rank)."""
    g = u.double()
    tall = g.size(0) > g.size(1)
    g = g.T if tall else g
    eigenvalues, vectors = torch.linalg.eigh(g @ g.T)
    inverse_root = (vectors * eigenvalues.clamp(min=1e-300).rsqrt()) @ vectors.T
    out = inverse_root @ g
    return out.T if tall else out


def iteration_fp64(u: torch.Tensor, variant: str) -> torch.Tensor:
    """The polynomial `variant` computes, with nothing rounded (torch's loop in fp64)."""
    from forge import newton_schulz as ns

    x = u.double()
    tall = x.size(0) > x.size(1)
    x = x.T if tall else x
    if variant == "polar_express":
        sequence, margin = ns.polar_express_sequence(STEPS), 1 + ns.POLAR_EXPRESS_SAFETY
    else:
        sequence, margin = [ns.NS_COEFFICIENTS] * STEPS, 1.0
    x = x / (x.norm() * margin).clamp(min=EPS)
    for a, b, c in sequence:
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """|a - b|_F / |b|_F in fp64."""
    return float((a.double() - b.double()).norm() / b.double().norm())


def median_ms(fn, device: str) -> float:
    """fn's median time: `triton.testing.do_bench` on a GPU, three wall-clock runs on a CPU (--tiny)."""
    if device == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, return_mode="median")
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[1]


def measure_shape(model: str, name: str, rows: int, cols: int, device: str = "cuda") -> list[dict[str, Any]]:
    """One record per variant at one shape: median ms and its three distances."""
    from forge import newton_schulz as ns

    g = torch.Generator(device=device).manual_seed(0)
    u = torch.randn(rows, cols, device=device, dtype=torch.bfloat16, generator=g)
    polar = polar_factor(u)
    exact = {"torch": iteration_fp64(u, "torch"), "polar_express": iteration_fp64(u, "polar_express")}
    default = ns.newton_schulz(u, "torch", ns.NS_COEFFICIENTS, STEPS, EPS)
    torch_own = distance(default, exact["torch"])
    out = []
    for variant in ns.VARIANTS:
        run = lambda v=variant: ns.newton_schulz(u, v, ns.NS_COEFFICIENTS, STEPS, EPS)  # noqa: E731
        o = run()
        own = distance(o, exact.get(variant, exact["torch"]))
        row = dict(model=model, shape_name=name, N=rows, K=cols, variant=variant, status="ok")
        row["time_ms"] = median_ms(run, device)
        row["polar_relative_error"] = distance(o, polar)
        row["own_fp64_relative_error"] = own
        row["torch_relative_error"] = distance(o, default)
        row["safe"] = variant != "polar_express" and own <= 2 * torch_own
        out.append(row)
        del o
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def picks(records: list[dict[str, Any]]) -> dict[tuple[int, int], str]:
    """{(min, max) of a shape: the fastest safe variant there} from a run's records ("torch" where
    no safe variant is faster); a shape measured twice (gate and down) keeps its faster pick."""
    best: dict[tuple[int, int], tuple[float, str]] = {}
    for r in records:
        if r.get("status") != "ok" or not (r["variant"] == "torch" or r.get("safe")):
            continue
        key = (min(r["N"], r["K"]), max(r["N"], r["K"]))
        if key not in best or r["time_ms"] < best[key][0]:
            best[key] = (r["time_ms"], r["variant"])
    return {key: variant for key, (_, variant) in sorted(best.items())}


def auto_source(table: dict[tuple[int, int], str], origin: str) -> str:
    """The lines between forge/newton_schulz.py's AUTO markers for `table`."""
    lines = [AUTO_BEGIN + " (python -m harness.kernels.newton_schulz --auto FILE)", f"# FILE: {origin}"]
    lines.append("AUTO: dict[tuple[int, int], str] = {")
    lines += [f'    ({n}, {m}): "{variant}",' for (n, m), variant in table.items()]
    lines += ["}", AUTO_END]
    return "\n".join(lines)


def write_auto(table: dict[tuple[int, int], str], origin: str, path: Path = AUTO_FILE) -> None:
    """Replace the generated AUTO table of forge/newton_schulz.py with `table`."""
    text = path.read_text()
    pattern = re.compile(re.escape(AUTO_BEGIN) + r".*?" + re.escape(AUTO_END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{path} has no `{AUTO_BEGIN}` ... `{AUTO_END}` block to write the table into")
    path.write_text(pattern.sub(lambda _: auto_source(table, origin), text, count=1))


TINY = {"tiny": {"q": (40, 40), "k": (24, 40), "gate": (72, 40)}}  # --tiny: a CPU dry run's shapes


def run(models: list[str], output: Path, tiny: bool = False) -> None:
    from harness.run import env

    device = "cpu" if tiny else "cuda"
    meta = dict(
        sweep="newton_schulz",
        method="kernel",
        env=env.collect(env.git_info()),
        gpu_name="cpu (dry run)" if tiny else torch.cuda.get_device_name(),
        gpu_count=0 if tiny else 1,
        time=time.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    grid = TINY if tiny else {model: hidden_shapes(model) for model in models}
    for model, shapes in grid.items():
        for name, (rows, cols) in shapes.items():
            for row in measure_shape(model, name, rows, cols, device):
                results.append(output, results.kernel_record(meta, row))
                print(_line(row), flush=True)


def _line(row: dict[str, Any]) -> str:
    head = f"{row['model']:12s} {row['shape_name']:5s} {row['N']:6d}x{row['K']:<6d} {row['variant']:15s}"
    errors = "  ".join(f"{k} {row[f'{k}_relative_error']:.4f}" for k in ("polar", "own_fp64", "torch"))
    return f"{head} {row['time_ms']:8.3f} ms  {errors}  {'safe' if row['safe'] else ''}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.kernels.newton_schulz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--models", nargs="+", default=list(MODELS), help="conf/model/ names")
    parser.add_argument("--auto", type=Path, help="a run's records: write forge's AUTO table from them")
    parser.add_argument("--tiny", action="store_true", help="a CPU dry run at small shapes (the interpreter)")
    args = parser.parse_args(argv)
    if args.auto is not None:
        records = results.read(args.auto)
        if any(r.get("gpu_count") == 0 for r in records):
            print(f"{args.auto}: a --tiny dry run on the CPU; give --auto a GPU run's records")
            return 2
        table = picks(records)
        if not table:
            print(f"{args.auto}: no measured records to pick from")
            return 2
        write_auto(table, args.auto.as_posix())
        print(auto_source(table, args.auto.as_posix()))
        return 0
    if not torch.cuda.is_available() and not args.tiny:
        print("python -m harness.kernels.newton_schulz times GPU kernels: run it on a CUDA GPU (or --tiny)")
        return 2
    for model in args.models:
        hidden_shapes(model)  # a bad name fails before any GPU time
    out_dir = Path(os.environ.get("OUT") or sources.OUT)
    out_dir.mkdir(parents=True, exist_ok=True)
    commit = (results_commit() or "nogit")[:7]
    kind = "tiny-" if args.tiny else ""
    output = out_dir / f"{FILE_PREFIX}{kind}{time.strftime('%Y%m%d-%H%M%S')}-{commit}.jsonl"
    run(args.models, output, args.tiny)
    print(f"results: {output}")
    return 0


def results_commit() -> str | None:
    from harness.run import env

    return env.git_info().get("git_commit")


if __name__ == "__main__":
    sys.exit(main())

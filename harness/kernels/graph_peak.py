"""Where a graphed step's peak memory comes from, beside the eager step's, from the allocator.

    python -m harness.kernels.graph_peak method=no_optimizer model=llama3.1-8b batch_size=4
    python -m harness.kernels.graph_peak method=forge_bf16 model=tiny-llama device=cpu   # refused

A graphed point's `peak_alloc` is the most memory held during its eager warm-up steps or its
capture (`harness.run.graphs`); an eager point's is the most held during its steps. Where the two
differ, this says why. It takes one point's Hydra overrides (as `harness.kernels.profile` does)
and, with the CUDA allocator's history on and Python stacks kept for every allocation:

1. builds the point's method eagerly and runs WARMUP_STEPS + 1 steps from the start (the states
   are allocated in the first, as in a sweep point);
2. builds it again with `method.cuda_graph=true` and constructs its captured step (WARMUP_STEPS
   eager steps on a side stream, then the capture), as the point's first step does.

For each, a mark between steps (a `snapshot` entry in the history) tells in which step, or in
the capture, the peak fell; the blocks alive at the peak are summed by where they were allocated
(the first frame outside torch itself, e.g. transformers' loss or the method's `eager_step` for
the backward's buffers). The report (stdout, and `<point>.graph_peak.json` in $OUT or here) gives
both peaks, their phases, the sites, and per site the graphed minus the eager bytes: the rows at
the top are what the graph holds that the eager step does not.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from harness.run import env, methods, models, runner
from harness.run.config import compose_config
from harness.run.graphs import WARMUP_STEPS, CapturedStep
from harness.run.grid import point_id
from harness.run.peak_pools import GIB, blocks, find_peak, mark_indices

TOP_SITES = 15
OWN_FRAMES = ("/torch/", "<frozen", "/contextlib.py", "/functools.py")


def site_of(frames: Sequence[dict[str, Any]]) -> str:
    """Where an allocation was asked for: the innermost frame outside torch and the standard
    library's wrappers, beside the innermost frame of all (the op that allocated)."""
    if not frames:
        return "unknown"
    inner = frames[0]
    outer = next((f for f in frames if not any(own in f["filename"] for own in OWN_FRAMES)), inner)

    def name(f: dict[str, Any]) -> str:
        return f"{'/'.join(f['filename'].split('/')[-2:])}:{f['line']} {f['name']}"

    return name(outer) if outer is inner else f"{name(outer)} <- {inner['name']}"


def peak_by_site(snapshot: dict[str, Any], phases: Sequence[str], device: int) -> dict[str, Any]:
    """The peak of the history in `snapshot`: its bytes, the phase it fell in (the n-th `snapshot`
    entry closes `phases[n]`), and the bytes alive then summed by allocation site."""
    trace = snapshot.get("device_traces", [[]])[device]
    segments = [s for s in snapshot.get("segments", ()) if s.get("device", device) == device]
    found = blocks(trace, segments)
    index, total = find_peak(found, len(trace))
    ends = mark_indices(trace, phases)
    phase = next((p for p in phases if p in ends and index < ends[p]), "after the marks")
    sites: dict[str, int] = {}
    for block in found:
        if block.alive_at(index):
            where = "alive before" if block.born < 0 else site_of(trace[block.born].get("frames", ()))
            sites[where] = sites.get(where, 0) + block.size
    return {"peak_gib": total / GIB, "phase": phase if index >= 0 else "before", "sites": sites}


def recorded(run: Callable[[Callable[[], None]], list[str]]) -> dict[str, Any]:
    """Run `run(mark)` with the allocator's history on (Python stacks kept), `run` naming the
    phases its marks close; returns the history's peak by site (`peak_by_site`) beside the
    allocator's own peak over the run."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python")
    try:
        phases = run(lambda: torch.cuda.memory._snapshot())
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    report = peak_by_site(snapshot, phases, torch.cuda.current_device())
    report["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB
    return report


class MarkedCapture(CapturedStep):
    """A captured step whose construction marks the end of each warm-up step."""

    def __init__(self, mark: Callable[[], None], *args: Any, **kwargs: Any) -> None:
        self.mark = mark
        super().__init__(*args, **kwargs)

    def _warm_up(self, eager_step: Callable[[torch.Tensor], torch.Tensor]) -> None:
        def marked(batch: torch.Tensor) -> torch.Tensor:
            loss = eager_step(batch)
            torch.cuda.current_stream().synchronize()
            self.mark()
            return loss

        super()._warm_up(marked)


def measure_eager(cfg: Any, batch: torch.Tensor) -> dict[str, Any]:
    cfg.method.cuda_graph = False
    _, method = runner.build_method(cfg, "cuda")

    def run(mark: Callable[[], None]) -> list[str]:
        for _ in range(WARMUP_STEPS + 1):
            method.step(batch)
            torch.cuda.synchronize()
            mark()
        return [f"eager step {i + 1}" for i in range(WARMUP_STEPS + 1)]

    return recorded(run)


def measure_graphed(cfg: Any, batch: torch.Tensor) -> dict[str, Any]:
    cfg.method.cuda_graph = True
    _, method = runner.build_method(cfg, "cuda")

    def run(mark: Callable[[], None]) -> list[str]:
        method.captured = MarkedCapture(mark, method.eager_step, method.params(), batch, method.before_replay)
        torch.cuda.synchronize()
        mark()
        return [f"warm-up step {i + 1}" for i in range(WARMUP_STEPS)] + ["capture"]

    report = recorded(run)
    method.captured.replay(batch)  # the graph replays (what was measured is what a point runs)
    torch.cuda.synchronize()
    return report


def compare(eager: dict[str, Any], graphed: dict[str, Any]) -> list[dict[str, Any]]:
    """Per site, graphed minus eager bytes at each one's peak, largest difference first."""
    sites = set(eager["sites"]) | set(graphed["sites"])
    rows = [
        {
            "site": site,
            "eager_gib": eager["sites"].get(site, 0) / GIB,
            "graphed_gib": graphed["sites"].get(site, 0) / GIB,
        }
        for site in sites
    ]
    for row in rows:
        row["difference_gib"] = row["graphed_gib"] - row["eager_gib"]
    return sorted(rows, key=lambda r: -abs(r["difference_gib"]))[:TOP_SITES]


def top_sites(report: dict[str, Any]) -> dict[str, Any]:
    sites = sorted(report.pop("sites").items(), key=lambda kv: -kv[1])[:TOP_SITES]
    report["top_sites_gib"] = {site: n / GIB for site, n in sites}
    return report


def main(argv: list[str]) -> int:
    cfg = compose_config(argv)
    if not methods.get(cfg.method.name).graph_capturable:
        print(
            f"graph_peak: {cfg.method.name}'s step cannot be captured in a CUDA graph; pick a method with a "
            "*_graph config (python -m harness list)"
        )
        return 2
    device = env.resolve_device(cfg.device)
    if device != "cuda":
        print("graph_peak: needs CUDA: it reads the CUDA allocator's history and captures a CUDA graph")
        return 2
    batch = models.random_batch(cfg.model.vocab_size, cfg.batch_size, cfg.seq_len, device, cfg.seed)
    eager = measure_eager(cfg, batch)
    gc.collect()
    torch.cuda.empty_cache()
    graphed = measure_graphed(cfg, batch)
    report = {
        "point": point_id(cfg),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "difference_by_site": compare(eager, graphed),
        "eager": top_sites(eager),
        "graphed": top_sites(graphed),
    }
    text = json.dumps(report, indent=1)
    print(text)
    out = Path(os.environ.get("OUT", "."))
    (out / (report["point"].replace("/", "_") + ".graph_peak.json")).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

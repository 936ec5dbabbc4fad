"""`harness.kernels.graph_peak` on a history written by hand: the peak's phase, the bytes alive
then by allocation site, the site named by the first frame outside torch, and the graphed-minus-
eager difference; on a CPU the command refuses with why."""

import os
import subprocess
import sys
from pathlib import Path

from harness.kernels.graph_peak import compare, peak_by_site, site_of

REPO = Path(__file__).resolve().parents[3]
MIB = 2**20

LOSS = {"filename": "/x/transformers/loss/loss_utils.py", "line": 40, "name": "fixed_cross_entropy"}
TORCH = {"filename": "/x/torch/nn/functional.py", "line": 3000, "name": "cross_entropy"}
STEP = {"filename": "/x/harness/run/methods/base.py", "line": 139, "name": "eager_step"}


def alloc(addr, size, *frames):
    return {"action": "alloc", "addr": addr, "size": size, "frames": list(frames)}


def free(addr, size):
    return {"action": "free_requested", "addr": addr, "size": size}


def snapshot(trace, segments=()):
    return {"device_traces": [trace], "segments": list(segments)}


def test_site_is_the_first_frame_outside_torch_beside_the_op():
    assert site_of([TORCH, LOSS, STEP]) == "loss/loss_utils.py:40 fixed_cross_entropy <- cross_entropy"
    assert site_of([STEP]) == "methods/base.py:139 eager_step"
    assert site_of([TORCH]) == "nn/functional.py:3000 cross_entropy"
    assert site_of([]) == "unknown"


def test_peak_sums_the_live_blocks_by_site_and_names_its_phase():
    trace = [
        alloc(0x1000, 4 * MIB, TORCH, LOSS),
        {"action": "snapshot"},  # end of the first phase
        alloc(0x9000, 3 * MIB, STEP),
        alloc(0xF000, 2 * MIB, TORCH, LOSS),  # the peak: 4 + 3 + 2 (+1 alive before)
        free(0x1000, 4 * MIB),
        free(0x5000, 1 * MIB),  # allocated before the history began
        {"action": "snapshot"},
    ]
    report = peak_by_site(snapshot(trace), ["warm-up step 1", "capture"], 0)
    assert report["phase"] == "capture"
    assert report["peak_gib"] * 2**30 == 10 * MIB
    loss_site = "loss/loss_utils.py:40 fixed_cross_entropy <- cross_entropy"
    assert report["sites"] == {
        loss_site: 6 * MIB,
        "methods/base.py:139 eager_step": 3 * MIB,
        "alive before": 1 * MIB,
    }


def test_compare_orders_sites_by_the_graphed_minus_eager_difference():
    eager = {"sites": {"a": 4 * MIB, "b": 2 * MIB}}
    graphed = {"sites": {"a": 4 * MIB, "b": 1 * MIB, "c": 8 * MIB}}
    rows = compare(eager, graphed)
    assert [r["site"] for r in rows] == ["c", "b", "a"]
    assert rows[0]["difference_gib"] * 2**30 == 8 * MIB
    assert rows[1]["difference_gib"] * 2**30 == -1 * MIB


def _graph_peak(*overrides: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    command = [sys.executable, "-m", "harness.kernels.graph_peak", *overrides]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_refuses_a_method_that_cannot_be_captured_and_a_cpu_with_why():
    done = _graph_peak("method=lomo", "model=micro-llama", "device=cpu")
    assert done.returncode == 2 and "cannot be captured in a CUDA graph" in done.stdout
    done = _graph_peak("method=no_optimizer", "model=micro-llama", "device=cpu")
    assert done.returncode == 2 and "needs CUDA" in done.stdout

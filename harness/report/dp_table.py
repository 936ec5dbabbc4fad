"""The data-parallel table: FORGE under DDP and FSDP2 against fused AdamW under the same wrapper.

Its rows are the points of the data-parallel experiments, read from their configs
(`conf/exp/dp_h200.yaml`: step time and peak per GPU; `conf/exp/dp_capacity_40gb.yaml`: the
largest micro-batch under a 40 GiB cap), every method at every batch size, so that a point
without a record stands in the table as `not measured` rather than missing: these need a machine
with several GPUs. Where a record exists the row shows its step (rank 0's), its peak (the largest
rank's), and the ratio to fused AdamW under the same wrapper, batch and GPU count.

What to expect per GPU, in bytes a parameter before activations (bf16 weights, P ranks): fused
AdamW under DDP holds weights 2, gradients 2 and states 4 (8); FORGE bf16 under DDP 2 + 4 and a
bounded window of gradients; under FSDP2 everything is divided by P: fused AdamW (2 + 2 + 4) / P,
FORGE bf16 (2 + 4) / P, FORGE int8 (2 + ~2.06) / P, plus one block's unsharded weights and gradients
(docs/distributed.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from harness.records import Record
from harness.report.markup import Table, fmt_gib, fmt_ms, fmt_ratio
from harness.report.tables import Selection

EXPERIMENTS = ("dp_h200", "dp_capacity_40gb")
NOT_MEASURED = "not measured"
CONF = Path(__file__).resolve().parents[2] / "conf"


def planned_points(exp: str) -> list[dict]:
    """(method label, model, batch, seq, gpus, wrapper) of every point the experiment's config names."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(CONF / "exp" / f"{exp}.yaml")
    sweep, points = cfg.sweep, []
    for model in sweep.models:
        for seq in sweep.seq_lens:
            for method in sweep.methods:
                wrapper = OmegaConf.load(CONF / "method" / f"{method}.yaml").options.get("data_parallel")
                batches = list(sweep.get("batch_sizes") or []) or ["largest"]
                for batch in batches:
                    points.append(
                        dict(sweep=sweep.name, label=method, model=model, batch=batch, seq=seq, gpus=cfg.gpus,
                             wrapper=wrapper, capacity=sweep.get("mode") == "capacity")
                    )  # fmt: skip
    return points


def _matches(record: Record, point: dict) -> bool:
    return (
        record.get("sweep") == point["sweep"]
        and record.get("method_label") == point["label"]
        and record.get("model") == point["model"]
        and record.get("seq_len") == point["seq"]
        and (point["batch"] == "largest" or record.get("batch_size") == point["batch"])
        and (record.get("world_size") or record.get("gpu_count") or 1) == point["gpus"]
    )


def _latest(records: Sequence[Record], point: dict) -> Record | None:
    found = [r for r in records if _matches(r, point)]
    if point["capacity"]:
        found = [r for r in found if r.get("status") == "ok"]
        return max(found, key=lambda r: r.get("batch_size") or 0, default=None)
    return max(found, key=lambda r: str(r.get("time") or ""), default=None)


def dp_table(records: Sequence[Record]) -> Selection:
    """Every planned data-parallel point, measured or `not measured`."""
    rows, used = [], []
    for exp in EXPERIMENTS:
        points = planned_points(exp)
        for point in points:
            record = _latest(records, point)
            baseline = _baseline(records, points, point)
            rows.append(_row(point, record, baseline))
            used += [record] if record is not None else []
    header = ["Sweep", "Model", "GPUs", "Wrapper", "Method", "Batch per GPU", "Seq", "Step ms (median)",
              "Peak alloc GiB per GPU", "Step vs fused AdamW", "Peak vs fused AdamW"]  # fmt: skip
    table = Table(
        name="data_parallel",
        title="Data parallelism: FORGE against fused AdamW under the same wrapper, per GPU",
        header=header,
        rows=rows,
        align="lllllrrrrrr",
        notes=[
            f"{NOT_MEASURED}: no record of that point yet; the points need a machine with "
            "`gpus` GPUs (python -m harness sweep +exp=dp_h200, +exp=dp_capacity_40gb). On CPUs the "
            "data-parallel paths are checked by tests/forge/test_data_parallel.py (gloo ranks).",
            "Batch per GPU: each rank's micro-batch; 'largest' rows are the capacity search's largest "
            "micro-batch that fits under the cap.",
        ],
    )
    return Selection(table, used)


def _baseline(records: Sequence[Record], points: Sequence[dict], point: dict) -> Record | None:
    """Fused AdamW under the same wrapper at the same point."""
    same = (point["wrapper"], point["model"], point["batch"], point["seq"])
    twins = [p for p in points if p["label"].startswith("fused_adamw")
             and (p["wrapper"], p["model"], p["batch"], p["seq"]) == same]  # fmt: skip
    return _latest(records, twins[0]) if twins else None


def _row(point: dict, record: Record | None, baseline: Record | None) -> list[str]:
    head = [point["sweep"], point["model"], str(point["gpus"]), str(point["wrapper"]), point["label"]]
    batch = str(point["batch"] if record is None or point["batch"] != "largest" else record.get("batch_size"))
    head += [batch, str(point["seq"])]
    if record is None:
        return head + [NOT_MEASURED] * 4
    if record.get("status") != "ok":
        return head + [str(record.get("status")).upper()] * 4
    step, peak = record.get("step_time_ms_median"), record.get("peak_alloc_gib")
    ok = baseline is not None and baseline.get("status") == "ok" and not point["capacity"]
    step_ratio = step / baseline["step_time_ms_median"] if ok and step else None
    peak_ratio = peak / baseline["peak_alloc_gib"] if ok and peak else None
    return head + [fmt_ms(step), fmt_gib(peak), fmt_ratio(step_ratio), fmt_ratio(peak_ratio)]

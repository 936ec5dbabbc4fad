"""What identifies a measured point, and how to name it for a reader.

A results record (`harness.results`) is one point of a sweep. Two records describe the
same point when their *configuration* is the same: method and its options, model, batch size,
sequence length, GPU, activation checkpointing and memory cap. The report and the regression check
both match records by this key, so it lives in one place.

`method_options` arrives as a dict (or None, or already a string); it is turned into a canonical
string (sorted JSON) so that equal options compare equal and sort the same way on every run.

How a table names and orders a record's method (its `Method`'s title and order) is
`harness.report.names`' job; this module knows records alone.

A method's ratios compare it with fused AdamW of the same sweep and configuration whose step runs
the same way (`step_mode`: under autocast or not, captured in a CUDA graph or not, compiled or not,
with the chunked loss or not, clipped or not), so a graphed FORGE row is a ratio of the graphed
fused AdamW, never of the eager one, and a clipped one of fused AdamW after clip_grad_norm_. A
method that replaces another torch method (FORGE Muon: torch Muon) is compared with that one
instead (`BASELINES`, `baseline_of`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

CONFIG_FIELDS = (
    "method",
    "method_options",
    "model",
    "batch_size",
    "seq_len",
    "gpu_name",
    "activation_checkpointing",
    "memory_cap_gib",
    "gpu_count",  # GPUs one point ran on: a tensor-parallel point is not its one-GPU twin
    "seed",  # weights and data order (config.seed): repeats of a run under other seeds stay apart
    "cuda_alloc_conf",  # the CUDA allocator's settings (gpu.allocator): they change what fits
)

REFERENCE_METHOD = "fused_adamw"
# The torch method a method replaces, where that is not fused AdamW: its ratios divide by that one.
BASELINES = {"forge_muon": "muon"}

# Options a method gained after some of its records were written, with the value every older
# record ran at (FORGE's int8 scales came in groups of 64 before `int8_group` existed, and its
# updates ran on the backward's own stream before `update_stream`, and undelayed before the
# `debug_delay_us` switch of a deliberate slowdown). A record
# that lacks one is keyed as if it had it, so an old point and a new one of the same
# configuration are the same point (the latest wins) rather than two rows of one method.
OPTIONS_ADDED_LATER = {"forge": {"int8_group": 64, "update_stream": False, "debug_delay_us": 0.0}}

# Methods recorded under another name before they got their registry name: keyed as the new one.
METHOD_ALIASES = {"harness.methods.torch_rule:TorchRule": "torch_rule"}


def missing(value: Any) -> bool:
    """True for None, NaN and pandas' NA: the ways a results loader says 'no value'."""
    if value is None:
        return True
    if isinstance(value, float):
        return math.isnan(value)
    return type(value).__name__ in ("NAType", "NaTType")


def options_dict(options: Any) -> dict[str, Any]:
    """`method_options` as a dict: accepts a dict, a JSON string, or nothing."""
    if missing(options) or options == "":
        return {}
    if isinstance(options, Mapping):
        return dict(options)
    if isinstance(options, str):
        try:
            parsed = json.loads(options)
        except json.JSONDecodeError:
            return {"options": options}
        return parsed if isinstance(parsed, dict) else {"options": parsed}
    return {"options": options}


def options_key(options: Any) -> str:
    """Canonical string of `method_options`: sorted JSON, '' when there are none."""
    opts = options_dict(options)
    return json.dumps(opts, sort_keys=True, separators=(",", ":"), default=str) if opts else ""


LOSS_NAMES = {"chunked_loss": "chunked loss", "chunked_head": "chunked head"}


def loss_mode(record: Mapping[str, Any]) -> str | None:
    """How a point computed its loss beside transformers' own: "chunked_loss" (in chunks of tokens,
    `model.chunked_loss`), "chunked_head" (lm_head with it, in chunks of the vocabulary,
    `model.chunked_head`), or None."""
    options = options_dict(record.get("method_options"))
    return next((mode for mode in LOSS_NAMES if options.get(mode)), None)


def _plain(value: Any) -> Any:
    """A hashable, comparable stand-in for a config value (None for missing)."""
    if missing(value):
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def config_key(record: Mapping[str, Any]) -> tuple:
    """The configuration of a record as a tuple in CONFIG_FIELDS order."""
    key = []
    for field in CONFIG_FIELDS:
        if field == "method":
            key.append(METHOD_ALIASES.get(str(record.get(field)), _plain(record.get(field))))
        elif field == "method_options":
            added = OPTIONS_ADDED_LATER.get(str(record.get("method")), {})
            key.append(options_key({**added, **options_dict(record.get(field))}))
        elif field == "activation_checkpointing":
            key.append(bool(_plain(record.get(field)) or False))
        elif field == "seed":
            key.append(seed_of(record))
        else:
            key.append(_plain(record.get(field)))
    return tuple(key)


def seed_of(record: Mapping[str, Any]) -> int:
    """The point's seed (its `config.seed`); 0, the default, where a record does not say."""
    config = record.get("config")
    seed = config.get("seed") if isinstance(config, Mapping) else None
    return 0 if missing(seed) else int(seed)


def describe(key: tuple) -> dict[str, Any]:
    """A config key back as a dict keyed by field name."""
    return dict(zip(CONFIG_FIELDS, key))


def latest_by_key(
    records: Iterable[Mapping[str, Any]],
    prefer: Callable[[Mapping[str, Any]], bool] | None = None,
) -> dict[tuple, Mapping[str, Any]]:
    """One record per configuration: the latest by `time` (ties: the later in the input). With
    `prefer`, a record it accepts wins over any it refuses, whatever their times (tables prefer a
    record measured beside its fused AdamW, so its ratio is side by side)."""
    chosen: dict[tuple, tuple[bool, str, int, Mapping[str, Any]]] = {}
    for index, record in enumerate(records):
        key = config_key(record)
        stamp = "" if missing(record.get("time")) else str(record.get("time"))
        rank = (bool(prefer(record)) if prefer else True, stamp, index)
        if key not in chosen or rank >= chosen[key][:3]:
            chosen[key] = rank + (record,)
    return {key: value[3] for key, value in chosen.items()}


def graphed(record: Mapping[str, Any]) -> bool:
    """Whether the record's step was captured in a CUDA graph and replayed (`method.cuda_graph`)."""
    return bool(options_dict(record.get("method_options")).get("cuda_graph"))


def autocast(record: Mapping[str, Any]) -> Any:
    """The dtype the record's forward ran under torch.autocast to ("bf16"), or None (`method.autocast`)."""
    return options_dict(record.get("method_options")).get("autocast")


def step_mode(record: Mapping[str, Any]) -> tuple[Any, bool, bool, str | None, Any, Any]:
    """How the step ran, beyond the method's own update: (autocast dtype or None, graphed, compiled,
    the loss's chunks (`loss_mode`), max_grad_norm or None, FP8 recipe or None). A point is compared
    with the fused AdamW whose step ran the same way: a clipped FORGE step with fused AdamW after
    clip_grad_norm_, an FP8 one with fused AdamW over torchao's FP8 linears of the same recipe."""
    options = options_dict(record.get("method_options"))
    return (
        autocast(record),
        graphed(record),
        bool(options.get("compile")),
        loss_mode(record),
        options.get("max_grad_norm"),
        options.get("fp8"),
    )


def reference_key(record: Mapping[str, Any]) -> tuple:
    """(sweep, configuration without the method, step mode): where to look for a record's fused
    AdamW: the one whose step ran the same way (autocast, CUDA graph)."""
    return (_plain(record.get("sweep")),) + config_key(record)[2:] + step_mode(record)


def reference_index(records: Iterable[Mapping[str, Any]]) -> dict[tuple, Mapping[str, Any]]:
    """Fused AdamW per `reference_key`: the fewest options first (then their canonical string), then
    the latest record."""
    return {key: r for (method, key), r in baseline_index(records).items() if method == REFERENCE_METHOD}


def baseline_method(record: Mapping[str, Any]) -> str:
    """The method a record's ratios divide by: the torch method it replaces (`BASELINES`), else
    fused AdamW."""
    return BASELINES.get(str(record.get("method")), REFERENCE_METHOD)


def baseline_index(records: Iterable[Mapping[str, Any]]) -> dict[tuple, Mapping[str, Any]]:
    """Every baseline record (fused AdamW, and the methods of `BASELINES`) by (method,
    `reference_key`): the fewest options first (then their canonical string), then the latest."""
    baselines = {REFERENCE_METHOD, *BASELINES.values()}
    best: dict[tuple, tuple[tuple, Mapping[str, Any]]] = {}
    for index, record in enumerate(records):
        if record.get("method") not in baselines:
            continue
        stamp = "" if missing(record.get("time")) else str(record.get("time"))
        options = record.get("method_options")
        rank = (len(options_dict(options)), options_key(options), _negate(stamp), -index)
        key = (record.get("method"), reference_key(record))
        if key not in best or rank < best[key][0]:
            best[key] = (rank, record)
    return {key: value[1] for key, value in best.items()}


def baseline_of(
    record: Mapping[str, Any], index: Mapping[tuple, Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    """The record `record`'s ratios divide by, from `baseline_index`: its `baseline_method` measured
    in the same sweep and configuration, its step run the same way; None where there is none."""
    return index.get((baseline_method(record), reference_key(record)))


def _negate(text: str) -> tuple[int, ...]:
    """A sort key that orders strings backwards (latest time first)."""
    return tuple(-ord(ch) for ch in text) + (0,)

"""The results files that the report and the docs' generated blocks read, each named once.

A doc block or figure (`harness.report.doc_tables`, `doc_figures`, `doc_probes`) is built from
named runs: the latest run of one sweep, an archived run it cites, a probe's output under
device-logs/. This module is their list, so a file is renamed, archived or replaced in one place
and every reader follows. The report's own tables (`harness.report.report`) read every record
under `RESULTS` and choose by sweep; the kernel lab writes under `KERNELS`, `TUNING` and
`DEVICE_LOGS` by default.

Paths are relative to the repository root and spelled as the docs print them (`root / HEADLINE`
opens one); a name with `{}` is a pattern the reader fills, one with `*` a glob.
"""

from __future__ import annotations

RESULTS = "results/"
ARCHIVE = RESULTS + "archive/"
DEVICE_LOGS = RESULTS + "device-logs/"
KERNELS = RESULTS + "kernels/"
TUNING = RESULTS + "tuning/"
OUT = RESULTS + "out/"  # where a probe writes when $OUT names no folder

# The latest run of a sweep (`python -m harness sweep +exp=<name>`), one file each.
HEADLINE = RESULTS + "llama8b_graphs_h200.jsonl"
PAPER = RESULTS + "paper_h200.jsonl"
QWEN_SCALING = RESULTS + "qwen3_scaling_h200.jsonl"
TP2_CAPACITY = RESULTS + "tp2_capacity_40gb.jsonl"
CHECKPOINTING = RESULTS + "activation_checkpointing.jsonl"
TOKENS = RESULTS + "scaling_tokens_h200.jsonl"
PEAKS = RESULTS + "peak_vs_tokens_h200.jsonl"
CLIP = RESULTS + "clip_h200.jsonl"
STREAM = RESULTS + "llama8b_update_stream_h200.jsonl"
KAHAN = RESULTS + "kahan_h200.jsonl"
MUON = RESULTS + "muon_h200.jsonl"
REFERENCE = RESULTS + "reference_h100.jsonl"  # the paper's code beside ours (+exp=reference_h200)
COMPILE = RESULTS + "compile_h200.jsonl"  # torch.compile beside eager on Llama-3.1-8B
EAGER_HOST = RESULTS + "eager_host.jsonl"  # eager and graphed steps where the host sets the pace

# Runs a generated block names before they exist: until one is measured, its block says what to run.
NOT_MEASURED_YET = (EAGER_HOST,)

FP8 = RESULTS + "fp8_h200.jsonl"

# Archived runs a doc cites (int8 states in groups of 64 and of 128; torchao's FP8 compiled, with
# the full attention mask).
INT8_GROUPS = ARCHIVE + "llama8b_graphs_h200-20261130-5acc636.jsonl"
FP8_COMPILED = ARCHIVE + "fp8_h200-masked-20261202-31a33a4.jsonl"

# The kernel tables (`python -m harness kernels`), one file per model.
KERNELS_LLAMA = KERNELS + "kernels-llama3.1-8b.jsonl"
KERNELS_QWEN = KERNELS + "kernels-qwen3-14b.jsonl"
KERNEL_TABLES = (KERNELS_LLAMA, KERNELS_QWEN)

# The mutation score of FORGE's numeric core (`python scripts/mutation_score.py`, docs/testing.md).
MUTATION = RESULTS + "mutation/mutation-20261208-e0f64e7.json"

# The GPU runs' probes and logs (results/device-logs/<what>-<date>-<commit>.<ext>).
OVERLAP = DEVICE_LOGS + "overlap-20261204-f71303c.jsonl"
OVERLAP_T39 = DEVICE_LOGS + "overlap-triton3.9-20261204-0a52bdd.jsonl"
OVERLAP_RUNS = DEVICE_LOGS + "overlap-*.jsonl"
COPY_ENGINE = DEVICE_LOGS + "overlap-20261205-841c142.jsonl"  # the update fed by bulk copies (prefetch_*)
NCU = DEVICE_LOGS + "ncu-ws-split-gate-t1024-20261204-926cb1d.csv"
PROFILES_B1 = DEVICE_LOGS + "profile-{}-llama3.1-8b-b1-s1024-h200-20261130-05ac13b.json"
LAUNCHES = DEVICE_LOGS + "launch-breakdown-1024x2048x1024-20261204-9616b23.json"
LAUNCH_BREAKDOWNS = DEVICE_LOGS + "launch-breakdown-*.json"  # every run of the probe; the newest is read
MASKED = DEVICE_LOGS + "graphed-vs-eager-b8-20261203-{}.jsonl"
GRAPH_PEAK = DEVICE_LOGS + "graph-peak-no_optimizer-b4-20261203-b75d62b.json"
GPU_TESTS = DEVICE_LOGS + "gpu-tests-and-sweep-llama8b_graphs_h200-20261130-d6b0cab.log"
REFERENCE_EXACTNESS = DEVICE_LOGS + "reference-exactness-20261206-1abd8ba.json"
# One device call's graphed Llama-3.1-8B steps: the floor and FORGE bf16 at 1,024 and 4,096 tokens
# (sweep graphed_check), torch's Muon and FORGE's at 1,024 (sweep muon_h200, gpu=h100_80gb).
LLAMA8B_GRAPHED_H100 = DEVICE_LOGS + "llama8b-graphed-h100-20261206-1abd8ba.jsonl"

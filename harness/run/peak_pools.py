"""What holds the memory at a step's peak, read from the CUDA allocator's own record.

`measure.breakdown` models the peak: it adds up weights, states and every gradient, and calls the
remainder activations, which is wrong wherever the peak comes before the gradients exist. With
`measure.peak_pools=true` the runner measures it instead. After the timed steps it runs one more
eager step with the allocator's history on (`torch.cuda.memory._record_memory_history`: every
allocation and free, in order, with its address and size), then:

1. replays that history to find the moment the allocated total is largest, and every block alive
   then (`find_peak`); a block alive since before the step comes from the final snapshot's
   segments or from a free with no allocation before it;
2. names each live block by what it holds (`classify`), from the tensors themselves:
   - weights: a block holding a parameter's storage;
   - states: a block holding an optimizer state's storage (master weights count here, as in the
     record's `optimizer_state_gib`);
   - gradients: a block holding a parameter's `.grad` (or a `main_grad` buffer,
     `harness.run.main_grad`) at the end of the backward, and alive at that moment;
   - activations: any other block allocated during the step's forward and backward: the saved
     activations, their gradients in flight, the logits and the loss, workspaces;
   - other: the rest: blocks alive from before the step that are none of the above (the batch,
     library workspaces, caches) and blocks the update allocates after the backward;
3. says in which phase the peak fell: forward, backward, or after backward (the update). Two marks
   split the step: a snapshot taken when the model's forward returns and one queued on the
   autograd engine for the end of the backward (each snapshot leaves a `snapshot` entry in the
   history, so the marks sit at their place among the allocations).

Sizes are what the tensors asked for (the history's `size` is the requested size); the allocator's
own peak over the same step (`torch.cuda.max_memory_allocated`, in rounded block sizes) is kept
beside them as `peak_pools_alloc_gib`: the pools add up to it less the allocator's rounding.

The recorded step is an extra one so that the timed steps stay unperturbed, and an eager one
because a replayed CUDA graph allocates nothing (the config refuses `cuda_graph` with it). A
gradient that a method frees inside its own post-accumulate-grad hook (FORGE's embeddings and
norms, the no-optimizer floor) is gone by the end of the backward: if it is alive at the peak, it
counts with the activations, one parameter's gradient at most.

    fields, note = measure(method, model, batch, device)      # the record's peak_pools_* fields
    pools = split_at_peak(snapshot, identities, marks)        # pure: any snapshot dict (tests)
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

POOLS = ("weights", "states", "gradients", "activations", "other")
FORWARD_END, BACKWARD_END = "forward_end", "backward_end"
GIB = 2**30

Span = tuple[int, int]  # (first byte's address, bytes)


@dataclass
class Block:
    """One allocation: its address and requested size, and the history entries that made and freed
    it (`born` -1: alive before the history starts; `died` None: alive at its end)."""

    addr: int
    size: int
    born: int
    died: int | None = None

    def alive_at(self, index: int) -> bool:
        return self.born <= index and (self.died is None or self.died > index)


@dataclass
class Identities:
    """The tensors a block can hold, as the storages' spans: parameters, optimizer states, and
    the gradients present at the end of the backward."""

    weights: list[Span] = field(default_factory=list)
    states: list[Span] = field(default_factory=list)
    gradients: list[Span] = field(default_factory=list)


@dataclass
class PeakPools:
    """The pools at the peak in bytes (POOLS order), their total, and the phase the peak fell in."""

    bytes: dict[str, int]
    total: int
    phase: str | None


# ---------------------------------------------------------------------------------------------
# The history, replayed


def blocks(trace: Sequence[dict[str, Any]], segments: Sequence[dict[str, Any]]) -> list[Block]:
    """Every block the history saw, with its lifetime, and the blocks alive throughout it: those
    freed without being allocated in it, and those the final snapshot holds that it never made."""
    open_blocks: dict[int, Block] = {}
    found: list[Block] = []
    for index, entry in enumerate(trace):
        action, addr = entry.get("action"), entry.get("addr")
        if action == "alloc":
            block = Block(int(addr), int(entry["size"]), index)
            open_blocks[block.addr] = block
            found.append(block)
        elif action == "free_requested":
            block = open_blocks.pop(int(addr), None)
            if block is None:  # allocated before the history began
                found.append(Block(int(addr), int(entry["size"]), -1, index))
            else:
                block.died = index
    for segment in segments:
        for block in segment.get("blocks", ()):
            if block.get("state") == "active_allocated" and int(block["address"]) not in open_blocks:
                size = block.get("requested_size") or block["size"]
                found.append(Block(int(block["address"]), int(size), -1))
    return found


def find_peak(found: Sequence[Block], n_entries: int) -> tuple[int, int]:
    """(index, bytes): the history entry after which the allocated total is largest (the first
    such; -1 before any entry) and that total."""
    delta = [0] * n_entries
    total = 0
    for block in found:
        if block.born < 0:
            total += block.size
        else:
            delta[block.born] += block.size
        if block.died is not None:
            delta[block.died] -= block.size
    best, at = total, -1
    for index, change in enumerate(delta):
        total += change
        if total > best:
            best, at = total, index
    return at, best


def mark_indices(trace: Sequence[dict[str, Any]], marks: Sequence[str]) -> dict[str, int]:
    """The history index of each mark: the n-th `snapshot` entry is the n-th mark taken."""
    snapshots = [i for i, entry in enumerate(trace) if entry.get("action") == "snapshot"]
    return dict(zip(marks, snapshots))


def phase_of(index: int, at: dict[str, int]) -> str | None:
    """The part of the step the history entry `index` fell in, as far as the marks tell."""
    if index < 0:
        return "before the step"
    if FORWARD_END in at and index < at[FORWARD_END]:
        return "forward"
    if BACKWARD_END in at:
        return "backward" if index < at[BACKWARD_END] else "after backward"
    return "backward or after" if FORWARD_END in at else None


# ---------------------------------------------------------------------------------------------
# What a block holds


class _Spans:
    """Span start addresses, sorted, for 'does this block hold one of them' in log time."""

    def __init__(self, spans: Iterable[Span]) -> None:
        self.starts = sorted(ptr for ptr, nbytes in spans if ptr and nbytes)

    def in_block(self, block: Block) -> bool:
        i = bisect.bisect_left(self.starts, block.addr)
        return i < len(self.starts) and self.starts[i] < block.addr + max(block.size, 1)


def classify(block: Block, ids: dict[str, _Spans], backward_end: int | None) -> str:
    """The pool of one block alive at the peak (see the module's list)."""
    if ids["weights"].in_block(block):
        return "weights"
    if ids["states"].in_block(block):
        return "states"
    if backward_end is not None and block.alive_at(backward_end) and ids["gradients"].in_block(block):
        return "gradients"
    if block.born >= 0 and (backward_end is None or block.born < backward_end):
        return "activations"
    return "other"


def split_at_peak(
    snapshot: dict[str, Any], identities: Identities, marks: Sequence[str], device: int = 0
) -> PeakPools:
    """The pools at the peak of the history in `snapshot` (torch.cuda.memory._snapshot()'s dict),
    `marks` naming its `snapshot` entries in the order they were taken."""
    trace = snapshot.get("device_traces", [[]])[device]
    segments = [s for s in snapshot.get("segments", ()) if s.get("device", device) == device]
    found = blocks(trace, segments)
    index, total = find_peak(found, len(trace))
    at = mark_indices(trace, marks)
    ids = {name: _Spans(getattr(identities, name)) for name in ("weights", "states", "gradients")}
    pools = dict.fromkeys(POOLS, 0)
    for block in found:
        if block.alive_at(index):
            pools[classify(block, ids, at.get(BACKWARD_END))] += block.size
    return PeakPools(pools, total, phase_of(index, at))


# ---------------------------------------------------------------------------------------------
# Recording a step


class AllocatorHistory:
    """The CUDA allocator's history: `start` it, `mark` a moment (a snapshot, which the history
    records as a `snapshot` entry), `stop` it and get the final snapshot. No stack traces are kept:
    the classification needs addresses, not call sites."""

    def start(self) -> None:
        torch.cuda.memory._record_memory_history(enabled="all", context=None)

    def mark(self) -> None:
        torch.cuda.memory._snapshot()

    def stop(self) -> dict[str, Any]:
        try:
            return torch.cuda.memory._snapshot()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)


def spans(objs: Iterable[Any]) -> list[Span]:
    """The storages behind tensors, tensor subclasses and containers (`measure.storage_spans`)."""
    from harness.run.measure import storage_spans

    return storage_spans(objs)


def gradient_tensors(method: Any) -> list[torch.Tensor]:
    """The gradients `method` holds now: its parameters' `.grad`, and the fp32 `main_grad` buffers
    of any `harness.run.main_grad.MainGrads` it keeps."""
    from harness.run.main_grad import MainGrads

    found = [p.grad for p in method.params() if p.grad is not None]
    for value in vars(method).values():
        if isinstance(value, MainGrads):
            found.extend(value.main_grad.values())
    return found


@dataclass
class Recording:
    """One recorded step: the final snapshot, the marks it holds (in order), the tensors."""

    snapshot: dict[str, Any]
    marks: list[str]
    identities: Identities


def record_step(
    method: Any,
    model: torch.nn.Module,
    step: Callable[[], Any],
    recorder: Any,
    sync: Callable[[], None] = lambda: None,
) -> Recording:
    """Run `step` under `recorder` (an `AllocatorHistory`), marking the end of the model's forward
    and, through a hook on its loss, the end of the backward (`queue_callback` on the autograd
    engine), where the gradients present are taken."""
    marks: list[str] = []
    gradients: list[Span] = []

    def at_backward_end() -> None:
        gradients.extend(spans(gradient_tensors(method)))
        recorder.mark()
        marks.append(BACKWARD_END)

    def at_loss_gradient(grad: torch.Tensor) -> None:
        torch.autograd.Variable._execution_engine.queue_callback(at_backward_end)

    def at_forward_end(module: Any, args: Any, output: Any) -> None:
        if marks:  # the step's first forward only
            return
        recorder.mark()
        marks.append(FORWARD_END)
        loss = getattr(output, "loss", None)
        if isinstance(loss, torch.Tensor) and loss.requires_grad:
            loss.register_hook(at_loss_gradient)

    handle = model.register_forward_hook(at_forward_end)
    sync()
    recorder.start()
    try:
        step()
        sync()
    finally:
        handle.remove()
        snapshot = recorder.stop()
    ids = Identities(spans(method.params()), spans(method.optimizer_state_tensors()), gradients)
    return Recording(snapshot, marks, ids)


EMPTY = {"peak_pools_gib": None, "peak_pools_phase": None, "peak_pools_alloc_gib": None}


def measure(method: Any, model: torch.nn.Module, batch: torch.Tensor, device: str) -> tuple[dict, str | None]:
    """The record's `peak_pools_gib`, `peak_pools_phase` and `peak_pools_alloc_gib` from one more
    recorded step, and a note where they could not be measured (never an exception: the timed
    steps' measurements stand)."""
    if device != "cuda":
        return dict(EMPTY), "peak_pools: not measured: it reads the CUDA allocator's history (device is cpu)"
    try:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        recording = record_step(
            method, model, lambda: method.step(batch), AllocatorHistory(), torch.cuda.synchronize
        )
        alloc_peak = torch.cuda.max_memory_allocated()
        pools = split_at_peak(
            recording.snapshot, recording.identities, recording.marks, torch.cuda.current_device()
        )
    except Exception as e:  # the recorded step is extra: its failure leaves the point's figures alone
        why = f"{type(e).__name__}: {e}"[:400]
        return dict(EMPTY), f"peak_pools: not measured: the recorded step failed ({why})"
    note = None
    if BACKWARD_END not in recording.marks:
        note = "peak_pools: the end of the backward was not marked: gradients count with the activations"
    return {
        "peak_pools_gib": {name: pools.bytes[name] / GIB for name in POOLS},
        "peak_pools_phase": pools.phase,
        "peak_pools_alloc_gib": alloc_peak / GIB,
    }, note

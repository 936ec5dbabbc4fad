"""Each parameter's step count, and the scalars its next launch reads: the rule's coefficients for
that step and the stochastic-rounding seed.

`begin(p, task)` counts one more step of p and returns what its kernel needs: `(coefficients,
seed, row)`. The coefficients are the rule's nine fp32 scalars at that step (`Rule.coefficients`:
the learning rate, powers of the betas, bias corrections, weight decay...) from p's param group, so
an LR scheduler's change applies at the next backward. Inside a backward (`task`, the autograd
graph task, >= 0) a rule without per-parameter host state gives every parameter of one group at
one step the same coefficients: they are computed at the backward's first update of the group at
that step and reused by its other parameters (the host arithmetic the update would repeat, on the
same values, so the same floats). The seed derives from (the
optimizer's seed, p's index, the step), so a run's random bits need no RNG state of their own: a
checkpoint that restores the step counts and the seed restores them (`forge.checkpoint`). FSDP2
shards mix their place on the mesh in, so that two shards of one weight draw independent bits.

CUDA graphs (`capturable=True`). A captured launch cannot take new arguments at each replay, so
every parameter gets a row of device memory (`row`, `step_row_words()` int32) holding its
coefficients and seed, which its launch reads instead. Outside a capture, `begin` writes p's row
just before its kernel (warm-up steps run the kernels a graph will replay); inside one it only
records p and returns zeros, and `prepare_replay` then does the host's part for every captured
parameter before each replay: one more step each, their rows uploaded in one copy. Replays are
bit-identical to eager steps: the same host arithmetic, the same fp32 values.

That host part runs before every replay, while the GPU waits for it, so it is done in bulk: a
rule without per-parameter host state gives every parameter of one group at one step the same
coefficients, computed once; the seeds of all captured parameters are one numpy expression (the
same 32-bit arithmetic as `seed_for`); the rows are filled in a pinned buffer.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from forge.backend import interpreting
from forge.distributed import local
from forge.param_table import ParamTable
from forge.rules import NUM_COEFFICIENTS


class Steps:
    """Step counts, seeds and (capturable) step rows of one optimizer's parameters."""

    def __init__(
        self,
        table: ParamTable,
        seed: int,
        capturable: bool,
        salt: Callable[[torch.Tensor], int] | None = None,
    ):
        self.table = table  # p's param group, rule and state (`forge.param_table`)
        self.seed = int(seed)
        self.capturable = bool(capturable)
        self._salt = salt  # p -> a number mixed into p's seeds (an FSDP2 shard's rank), or None
        self.index: dict[torch.Tensor, int] = {}  # p's position, in the order parameters were added
        self.params: list[torch.Tensor] = []  # the parameters by position
        self.version: dict[torch.Tensor, int] = {}  # updates p has received (the double-backward guard)
        self.rows: torch.Tensor | None = None  # capturable: one step row per parameter, on the device
        self.captured: dict[torch.Tensor, None] = {}  # updated inside a capture, in order (an ordered set)
        self.shared: dict[tuple[int, int], tuple] = {}  # (group id, step) -> coefficients, in `shared_task`
        self.shared_task = -1  # the backward whose coefficients `shared` holds
        # p -> (its group, its rule, whether its rule shares coefficients, the part of its seed that
        # does not change with the step or the optimizer's seed): what `begin` reads with one lookup
        self.fixed: dict[torch.Tensor, tuple] = {}

    def add(self, p: torch.Tensor, state: dict) -> None:
        """Count the steps of a new parameter p, whose state is `state`: step 0, and its rule's host
        values at their start (NAdam's mu product; Muon's take p's shape)."""
        index = self.index[p] = len(self.index)
        self.params.append(p)
        self.version[p] = 0
        rule = self.table.rule_of(p)
        self.fixed[p] = (self.table.group_of(p), rule, not rule.per_parameter, index * 0x85EBCA77)
        state["step"] = 0
        state.update(rule.initial_host_state(p))

    def begin(self, p: torch.Tensor, task: int = -1) -> tuple[tuple, int, torch.Tensor | None]:
        """(coefficients, seed, row) of p's next update, its step counted; `task`: the backward it
        runs in (-1: none, nothing shared). The row is None unless capturable; inside a CUDA-graph
        capture nothing is counted (the replays will be)."""
        row = None
        if self.capturable:
            row = self._row(p)
            if _capturing(p):
                self.captured[p] = None
                return self._no_coefficients(), 0, row
        # Counting, the coefficients (once per group and step in backward `task` where every
        # parameter of the group shares them: see the module) and `seed_for`'s arithmetic, written
        # out: this runs at every update of every step, p's fixed facts in one lookup.
        state = self.table.state_of(p)
        state["step"] = step = state["step"] + 1
        self.version[p] += 1
        group, rule, shares, index_term = self.fixed[p]
        if task >= 0 and shares:
            if task != self.shared_task:
                self.shared.clear()
                self.shared_task = task
            key = (id(group), step)
            coefficients = self.shared.get(key)
            if coefficients is None:
                coefficients = self.shared[key] = rule.coefficients(group, step, state)
        else:
            coefficients = rule.coefficients(group, step, state)
        if self._salt is not None:
            seed = self.seed_for(p, step)
        else:
            x = (self.seed * 0x9E3779B1 + index_term + step * 0xC2B2AE3D) & 0xFFFFFFFF
            x ^= x >> 15
            x = (x * 0x2C1B3C6D) & 0xFFFFFFFF
            seed = (x ^ (x >> 13)) & 0x7FFFFFFF
        if row is not None:
            row.copy_(_step_values([coefficients], [seed], (1, row.shape[0]), [0])[0], non_blocking=True)
        return coefficients, seed, row

    def _count(self, p: torch.Tensor, state: dict) -> int:
        """Count one more step of p; its new step."""
        state["step"] += 1
        self.version[p] += 1
        return state["step"]

    def seed_for(self, p: torch.Tensor, step: int) -> int:
        """A per-step, per-tensor Philox seed: a fixed seed gives reproducible bits."""
        x = (self.seed * 0x9E3779B1 + self.index[p] * 0x85EBCA77 + step * 0xC2B2AE3D) & 0xFFFFFFFF
        if self._salt is not None:
            x = (x + self._salt(p) * 0x27D4EB2F) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x2C1B3C6D) & 0xFFFFFFFF
        return (x ^ (x >> 13)) & 0x7FFFFFFF

    def _seeds(self, params: list, index: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """`seed_for` of every (p, step) at once, `index` holding each p's: uint64 arithmetic wraps
        modulo 2^64, which keeps the low 32 bits that `seed_for`'s masks keep."""
        index = index.astype(np.uint64)
        x = np.uint64(self.seed & 0xFFFFFFFF) * np.uint64(0x9E3779B1) + index * np.uint64(0x85EBCA77)
        x = (x + steps.astype(np.uint64) * np.uint64(0xC2B2AE3D)) & np.uint64(0xFFFFFFFF)
        if self._salt is not None:
            salt = np.fromiter(((self._salt(p) & 0xFFFFFFFF) for p in params), np.uint64, len(params))
            x = (x + salt * np.uint64(0x27D4EB2F)) & np.uint64(0xFFFFFFFF)
        x ^= x >> np.uint64(15)
        x = (x * np.uint64(0x2C1B3C6D)) & np.uint64(0xFFFFFFFF)
        return (x ^ (x >> np.uint64(13))) & np.uint64(0x7FFFFFFF)

    def _row(self, p: torch.Tensor) -> torch.Tensor:
        """p's step row (the rows of every parameter are allocated at the first update)."""
        rows = self.rows
        if rows is None or rows.shape[0] < len(self.index):
            device = local(p).device
            if _capturing(p):
                raise RuntimeError(
                    "FORGE: the first update of a capturable optimizer happened inside a CUDA-graph "
                    "capture. Run at least one eager step (the usual warm-up on a side stream) before "
                    "capturing, so that its buffers and kernels exist outside the graph."
                )
            devices = {local(q).device for q in self.index}
            if len(devices) != 1 or (device.type != "cuda" and not interpreting()):
                raise RuntimeError(
                    "FORGE: capturable=True needs every parameter on one CUDA device, found "
                    f"{sorted(map(str, devices))}"
                )
            rows = torch.zeros((len(self.index), step_row_words()), dtype=torch.int32, device=device)
            if rows.is_cuda:  # zeroed (on an update stream, maybe) before any other stream writes a row
                torch.cuda.synchronize(device)
            self.rows = rows
        return rows[self.index[p]]

    def prepare_replay(self) -> None:
        """Before each replay of a captured step: every parameter updated inside the capture takes
        one more step, and the rows of all of them go to the device in one copy."""
        if not self.capturable:
            raise RuntimeError(
                "prepare_replay() is for capturable optimizers: forge.attach(..., capturable=True)"
            )
        if not self.captured:
            raise RuntimeError(
                "prepare_replay(): no FORGE update has been captured yet. Capture a forward and backward "
                "under torch.cuda.graph with this optimizer attached, then call it before each replay."
            )
        params = list(self.captured)
        steps = np.empty(len(params), np.int64)
        coefficient_rows = []
        shared: dict[tuple[int, int], tuple] = {}  # (group, step) -> coefficients, rules without host state
        for j, p in enumerate(params):
            state, group, rule = self.table.state_of(p), self.table.group_of(p), self.table.rule_of(p)
            step = steps[j] = self._count(p, state)
            key = (id(group), step)
            # NAdam: each parameter's own running product; Muon: its shape's learning rate
            coefficients = None if rule.per_parameter else shared.get(key)
            if coefficients is None:
                coefficients = rule.coefficients(group, step, state)
                shared[key] = coefficients
            coefficient_rows.append(coefficients)
        at = np.fromiter((self.index[p] for p in params), np.int64, len(params))
        seeds = self._seeds(params, at, steps)
        self.rows.copy_(_step_values(coefficient_rows, seeds, tuple(self.rows.shape), at), non_blocking=True)

    @staticmethod
    def _no_coefficients() -> tuple:
        """The coefficients a captured launch is given: zeros (it reads its own from its step row)."""
        return (0.0,) * NUM_COEFFICIENTS


def _capturing(p: torch.Tensor) -> bool:
    """Whether work issued now is being captured into a CUDA graph (never on a CPU tensor)."""
    return p.is_cuda and torch.cuda.is_current_stream_capturing()


def _step_values(coefficient_rows: list, seeds, shape: tuple, at) -> torch.Tensor:
    """Step rows of `shape` (rows, words) int32 in host memory, pinned where CUDA exists; rows `at`
    hold `step_rows(coefficient_rows, seeds)`, the others zeros. A fresh tensor each call: the
    pinned-memory allocator keeps it until the non-blocking copy that reads it has run."""
    values = np.zeros(shape, np.int32)
    values[at] = step_rows(coefficient_rows, seeds, shape[1])
    values = torch.from_numpy(values)
    return values.pin_memory() if torch.cuda.is_available() else values


def step_rows(coefficient_rows: list, seeds, words: int) -> np.ndarray:
    """(len(seeds), words) int32: each row the coefficients as fp32 bits first (words 0-8, rounded
    from Python's floats as a launch argument is), then the seed, then zeros: what a launch that
    reads its step from memory reads (`forge.kernels.update_tile.load_step_values`)."""
    n = NUM_COEFFICIENTS
    values = np.zeros((len(seeds), words), np.int32)
    if len(values):
        values[:, :n] = np.asarray(coefficient_rows, np.float32).view(np.int32)
        values[:, n] = np.asarray(seeds).astype(np.int32)
    return values


def for_row_block(seed: int, row: torch.Tensor | None, block: int) -> tuple[int, torch.Tensor | None]:
    """(seed, step row) of one block of a parameter's rows that its own launch updates
    (`forge.functional.Launcher.row_blocks`). A kernel keys its stochastic-rounding bits by an element's
    row within the launch, so blocks after the first mix their index into the seed, alike on the
    host and, in a copy of the row, on the device (a captured launch reads its seed there)."""
    if block == 0:
        return seed, row
    salt = (block * 0x9E3779B1) & 0x7FFFFFFF
    if row is None:
        return seed ^ salt, None
    mixed = row.clone()
    mixed[NUM_COEFFICIENTS : NUM_COEFFICIENTS + 1].bitwise_xor_(salt)  # the seed's word follows them
    return seed ^ salt, mixed


def step_row_words() -> int:
    """int32 words in one parameter's step row: h0..h8 as fp32 bits, the seed, then padding."""
    from forge.kernels.update_tile import STEP_ROW

    return STEP_ROW

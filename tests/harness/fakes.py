"""Methods that misbehave on purpose, for the harness tests (named as "tests.harness.fakes:Class").

Each one exercises one failure path of a sweep point in a real worker subprocess.
"""

import os
import time

import torch

from harness.run.methods.base import Method


class OomMethod(Method):
    """Raises the allocator's OOM error, as CUDA does, whatever the device."""

    def step(self, input_ids):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")


class OomAboveFourMethod(Method):
    """Trains like SGD, but 'runs out of memory' above batch size 4 (for the capacity search)."""

    def step(self, input_ids):
        if input_ids.shape[0] > 4:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated above batch 4)")
        loss = self.loss(input_ids)
        loss.backward()
        with torch.no_grad():
            for p in self.params():
                p -= 1e-2 * p.grad
                p.grad = None
        return loss.detach()


class CrashMethod(Method):
    """The worker process dies without a record (as a segfault would)."""

    def step(self, input_ids):
        os._exit(3)


class HangMethod(Method):
    """Never finishes a step (for the timeout)."""

    def step(self, input_ids):
        time.sleep(600)


class StillMethod(Method):
    """Runs forward and backward but never updates: fast, and trains nothing."""

    def update(self):
        for p in self.params():
            p.grad = None


class NanMethod(Method):
    """The loss blows up."""

    def step(self, input_ids):
        return torch.tensor(float("nan"))


class BrokenImportMethod(Method):
    """Its package is installed but cannot load here (say, no CUDA library for it)."""

    def setup(self):
        raise ImportError("libcudart.so.13: cannot open shared object file (simulated)")

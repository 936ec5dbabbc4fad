"""Integers that name live FORGE optimizers, where an object cannot go.

torch.compile's custom ops (`forge.ops`) take tensors and plain values only, so a compiled graph
refers to its optimizer by the integer `register` gave it, and the op finds the optimizer again when
it runs (`optimizer_of`). The registry holds weak references: an optimizer that is garbage-collected
drops out of it, and a graph that still names it gets a clear error instead of a dangling object.
"""

from __future__ import annotations

import itertools
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from forge.interface import CompiledUpdater

_NEXT = itertools.count(1)
_BY_HANDLE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def register(optimizer: CompiledUpdater) -> int:
    """A new handle for `optimizer`, valid for as long as it lives."""
    handle = next(_NEXT)
    _BY_HANDLE[handle] = optimizer
    return handle


def optimizer_of(handle: int) -> CompiledUpdater:
    """The live optimizer `handle` names, or a RuntimeError."""
    optimizer = _BY_HANDLE.get(handle)
    if optimizer is None:
        raise RuntimeError("FORGE: the optimizer of this compiled model has been garbage-collected")
    return optimizer

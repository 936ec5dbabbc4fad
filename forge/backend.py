"""Where FORGE's kernels run: compiled for a CUDA device, or in Triton's CPU interpreter.

Triton makes this choice per function, when `@triton.jit` wraps it: under TRITON_INTERPRET=1 the
function becomes an interpreted one (plain Python over NumPy arrays, on CPU tensors), else a
compiled one. Triton's own library functions (`tl.cdiv`, `tl.sum`, `tl.randint`, ...) are wrapped
once, when `triton` is first imported, and an interpreted kernel cannot call a compiled one
("Cannot call @triton.jit'd outside of the scope of a kernel"). So the choice must hold before
the first `import triton` of the process, which FORGE does not control: transformers, torch.compile
or the user's own code may import Triton first.

FORGE therefore decides once, at the first use of its kernels (`prepare`, run before any of its
modules imports Triton; `import forge` itself imports none of them):

* TRITON_INTERPRET, where it is set, decides (1, true, on or yes: the interpreter);
* otherwise the interpreter runs exactly when no CUDA device is available, and FORGE sets
  TRITON_INTERPRET=1 for Triton, which reads it while interpreting too.

Where Triton was imported before without the interpreter and the interpreter is chosen, Triton's
library modules (`triton.language.standard`, `triton.language.random`) are run again under it, as
the first import would have run them under TRITON_INTERPRET=1. Nothing compiled can run in such a
process anyway (it has no CUDA device, or the user asked for the interpreter).

A tool that wants compiled kernels on a machine without a GPU (an offline build for Hopper) sets
TRITON_INTERPRET=0 before its first use of `forge.kernels`; there is nothing to undo.
"""

from __future__ import annotations

import os
import sys

_TRUE = ("1", "true", "on", "yes")
_interpreting: bool | None = None


def interpreting() -> bool:
    """True when FORGE's kernels run in Triton's CPU interpreter (decided once, see `prepare`)."""
    if _interpreting is None:
        return prepare()
    return _interpreting


def prepare() -> bool:
    """Decide, once, between compiled kernels and the interpreter, and make Triton agree; returns
    `interpreting()`. Run before the first import of Triton by FORGE's kernel modules."""
    global _interpreting
    if _interpreting is not None:
        return _interpreting
    value = os.environ.get("TRITON_INTERPRET")
    if value is None:
        import torch

        interpret = not torch.cuda.is_available()
        if interpret:
            os.environ["TRITON_INTERPRET"] = "1"
    else:
        interpret = value.strip().lower() in _TRUE
    if interpret and "triton" in sys.modules:
        _interpret_triton_library()
    _interpreting = interpret
    return interpret


def _interpret_triton_library() -> None:
    """Re-run Triton's library modules under the interpreter where `import triton` ran them without
    it, and point `triton.language`'s names at the new functions."""
    import importlib

    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if isinstance(tl.standard.cdiv, InterpretedFunction):
        return  # Triton was imported under the interpreter
    for module in (tl.standard, tl.random):
        importlib.reload(module)  # its @jit functions, and the tensor methods they define, again
        for name, value in vars(module).items():
            if isinstance(value, InterpretedFunction) and name in vars(tl):
                setattr(tl, name, value)

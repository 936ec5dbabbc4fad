"""Four log lines that every sweep would open with, and that say nothing about the sweep, filtered.

Building a model through transformers imports torchao (transformers' quantizer registry does), and
torchao's import logs, on a machine where its compiled extensions do not fit the installed torch
(a CPU build of torch, say):

    Failed to load .../torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so: Could not load this library: ...
    Failed to load .../torchao/_C_cutlass_90a.abi3.so: Could not load this library: ...

and then registers two of its enums as pytree constants, which torch logs as deprecated:

    <enum 'KernelPreference'> is an Enum subclass and is now natively supported by torch.compile ...
    <enum 'ScaleCalculationMode'> is an Enum subclass and is now natively supported by torch.compile ...

Neither touches what the harness measures: its FP8 methods use torchao's `Float8Linear`, which
runs on torch's own ops, not on these two extensions (MX formats; Hopper's CUTLASS kernels), and
the enums work either way. Read as errors, though, they are the first thing
a new user sees. `install()` puts a filter on the two loggers that drops exactly these records
(torchao's two extensions by file name, the deprecation only for enums that torchao defines);
every other record of those loggers, and every warning, still shows. `harness/__init__.py`
installs it, so the command line and every worker process get it.
"""

from __future__ import annotations

import logging
import re

TORCHAO_LOGGER = "torchao"
PYTREE_LOGGER = "torch.utils._pytree"
# torchao/__init__.py: logger.warning(f"Failed to load {file}: {e}") for each _C*.so it ships
EXTENSION = re.compile(r"Failed to load \S*torchao[/\\]_C_(mxfp8|cutlass_90a)\.[^/\\\s]*\.so: ")
# torch/utils/_pytree.py: register_constant() called on an Enum subclass
ENUM_CONSTANT = "is an Enum subclass and is now natively supported by torch.compile"


def _unloadable_extension(record: logging.LogRecord) -> bool:
    return record.levelno == logging.WARNING and EXTENSION.match(record.getMessage()) is not None


def _torchao_enum_constant(record: logging.LogRecord) -> bool:
    if record.levelno != logging.WARNING or ENUM_CONSTANT not in str(record.msg):
        return False
    args = record.args if isinstance(record.args, tuple) else ()
    return len(args) == 1 and str(getattr(args[0], "__module__", "")).split(".")[0] == "torchao"


class _Drop(logging.Filter):
    """Drops the records `match` recognizes; passes every other."""

    def __init__(self, match) -> None:
        super().__init__()
        self.match = match

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.match(record)


def install() -> None:
    """Filter the four lines (idempotent: a second call adds nothing)."""
    for name, match in ((TORCHAO_LOGGER, _unloadable_extension), (PYTREE_LOGGER, _torchao_enum_constant)):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) and f.match is match for f in logger.filters):
            logger.addFilter(_Drop(match))

"""`python -m harness report`: the verb that renders reports/ and the docs' generated blocks.

With no arguments it renders the committed results into reports/ (`report.main`) and then rewrites
the generated blocks of README.md and docs/ (`doc_blocks.write_blocks`); with arguments (a scratch
run, another output folder) it renders the report alone and leaves the docs untouched. `--check`
renders nothing into the tree: it names every file and figure that differs from what results/
gives now (`check.main`, what CI runs).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from harness.report import check, doc_blocks, report


def main(argv: Sequence[str] | None = None) -> int:
    """Render reports/ (and, for the committed results, the docs' blocks); or `--check` them."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--check"]:
        return check.main()
    status = report.main(argv)
    if status != 0 or argv:
        return status
    try:
        changed = doc_blocks.write_blocks(Path("."))
    except (doc_blocks.BlockError, LookupError, KeyError, ValueError) as err:
        print(f"report: the docs' generated blocks: {err}", file=sys.stderr)
        return 2
    names = ", ".join(str(p) for p in changed) or "none changed"
    print(f"report: generated blocks of README.md and docs/ rewritten ({names})")
    return 0

"""The subprocess entry point: one point per fresh Python process.

    python -m harness.worker POINT.json RECORD.json

POINT.json holds {"point": id, "config": resolved config, "git": {...}}; the worker re-validates
the config, runs `runner.run_point` and writes the record to RECORD.json. A fresh process per
point means no CUDA state, allocator cache, peak counter or leaked tensor (an OOM'd point's
traceback keeps its tensors alive) can reach the next point. If this process dies without
writing RECORD.json (a segfault, a kill, a timeout), the sweep records an `error` from its exit
code and stderr instead.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    point_path, record_path = map(Path, argv)
    spec = json.loads(point_path.read_text())
    if spec["config"].get("device") == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

    from harness import config, runner

    cfg = config.from_dict(spec["config"])
    record = runner.run_point(cfg, point=spec["point"], git=spec.get("git"))
    tmp = record_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, default=str))
    tmp.replace(record_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

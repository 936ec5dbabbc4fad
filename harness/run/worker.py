"""The subprocess entry point: one point per fresh Python process.

    python -m harness.run.worker POINT.json RECORD.json

POINT.json holds {"point": id, "config": resolved config, "git": {...}}; the worker re-validates
the config, runs `runner.measure_point` and writes the record to RECORD.json. A fresh process per
point means no CUDA state, allocator cache, peak counter or leaked tensor (an OOM'd point's
traceback keeps its tensors alive) can reach the next point. If this process dies without
writing RECORD.json (a segfault, a kill, a timeout), the sweep records an `error` from its exit
code and stderr instead.

Under torchrun (`gpus=N`, see `harness.run.launch`) every rank runs this: it joins the process group,
runs the same point on its shard of the model, and writes RECORD.rankR.json; the sweep merges
them. A rank whose point failed exits with code 1, so that torchrun stops the ranks still
waiting for it in a collective.
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

    from harness import results
    from harness.run import config, launch, runner, tensor_parallel

    cfg = config.from_dict(spec["config"])
    world, rank = tensor_parallel.world_size(), tensor_parallel.rank()
    if world > 1:
        tensor_parallel.init(spec["config"]["device"])
    record = runner.measure_point(cfg, point=spec["point"], git=spec.get("git"))
    record.set(rank=rank, world_size=world)
    path = launch.rank_record_path(record_path, rank, world)
    results.write_one(path, record.to_json())
    if world > 1 and record.status != "ok":
        os._exit(1)  # torchrun then stops the other ranks (they may wait in a collective for us)
    tensor_parallel.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

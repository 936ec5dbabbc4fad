"""Bring back the records an earlier device call wrote, before this one resumes a sweep.

    python scripts/merge_device_results.py .device-results/results results

Each device call replaces the tracked results/ with the sender's tree, so a sweep resumed in the
next call would not see the points the previous call recorded unless they were copied back first.
`scripts/device_sweep.sh` keeps a copy of every results file it writes in .device-results/
(ignored by git, so it outlives the call on a warm machine) and runs this first: records missing
from results/ are appended, none is duplicated.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.results import merge_missing_records  # noqa: E402

if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python scripts/merge_device_results.py KEPT_DIR RESULTS_DIR")
    kept, results = sys.argv[1:]
    if Path(kept).is_dir():
        for name, count in merge_missing_records(kept, results).items():
            print(f"merge_device_results: {count} records of an earlier call back in {results}/{name}")

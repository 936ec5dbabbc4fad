"""The README's "Try the library" block, run verbatim as a newcomer would: on a CPU, in a fresh
process, with nothing set beforehand. It must finish within a minute and print a loss that fell."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIMIT_S = 60.0


def readme_block(heading: str) -> str:
    """The first ```python block under the README's `## heading`, verbatim."""
    text = (REPO / "README.md").read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"no python block under '## {heading}'"
    return match.group(1)


def test_try_the_library_runs_on_a_cpu_within_a_minute_and_the_loss_falls(tmp_path):
    script = tmp_path / "try_forge.py"
    script.write_text(readme_block("Try the library"))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # as a new user's shell
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU, on a GPU machine too
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=LIMIT_S
    )
    seconds = time.perf_counter() - start
    assert done.returncode == 0, done.stderr
    assert seconds < LIMIT_S
    losses = [float(v) for v in re.findall(r"^step \d+: loss (\S+)$", done.stdout, re.M)]
    assert len(losses) == 10, done.stdout
    assert losses[-1] < 0.5 * losses[0], losses  # the loss fell, visibly
    assert done.stdout.rstrip().endswith("weight gradient: None")

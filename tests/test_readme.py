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


def readme_commands(heading: str = "Two commands") -> list[str]:
    """The commands of the first ```bash block under the README's `## heading`, comments stripped."""
    text = (REPO / "README.md").read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    assert match, f"no bash block under '## {heading}'"
    return [line.split("  #", 1)[0].strip() for line in match.group(1).splitlines() if line.strip()]


def test_ci_runs_the_readmes_commands_verbatim():
    """.ci/run installs and tests exactly as the README tells a newcomer to: each of its commands
    below the marker is a line of the README's set-up block, and the two commands share its venv."""
    commands = readme_commands()
    assert commands[0] == "python3 -m venv .venv && . .venv/bin/activate"
    assert "python -m harness sweep +exp=smoke" in commands and "pytest" in commands
    ci = (REPO / ".ci" / "run").read_text().split("# --- the README's", 1)[1].splitlines()[1:]
    verbatim = [line for line in ci if line.strip() and not line.startswith("#")][:2]
    assert verbatim == [commands[1], "pytest"], (verbatim, commands)


def test_the_readmes_test_count_holds():
    """The README's range of test counts holds for what pytest collects now (the time is held by
    tests/conftest.py at the end of a whole run on two cores)."""
    from tests.conftest import readme_claims

    fewest, most, low, high = readme_claims()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-o", "addopts=", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    found = re.search(r"^(\d+) tests? collected", done.stdout, re.M)
    assert found, done.stdout[-2000:] + done.stderr[-2000:]
    collected = int(found.group(1))
    assert fewest <= collected <= most, (
        f"pytest collects {collected} tests; README.md says between {fewest:,} and {most:,}: change the claim"
    )
    assert 0 < low < high

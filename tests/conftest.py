"""Shared test setup: CPU tests run FORGE's kernels in Triton's interpreter; GPU tests are marked."""

import os
import re
import sys
import time
import zlib
from pathlib import Path

import pytest
import torch

# Tests import shared code as `tests.helpers`, and the harness tests name misbehaving methods as
# "tests.harness.fakes:Class" and run them in worker subprocesses: the repository root must be
# importable here and in every child, whatever way the package was installed (an editable install
# maps only forge and harness).
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)

# Without a GPU, FORGE's kernels run in Triton's interpreter: forge decides so itself at their first
# use, but saying it here, before any test imports Triton, holds for this process and every child
# a test starts (harness workers, tensor-parallel ranks) alike.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# The files that take longest on two CPU cores, longest first. They run before the rest: with one
# worker per core and each file on one worker (--dist loadfile), a long file collected last (the
# harness's run/ tests come last by name) would leave the other workers idle at the end.
LONGEST_FIRST = (
    "tests/forge/test_data_parallel.py",
    "tests/harness/run/test_sweep.py",
    "tests/forge/test_checkpoint.py",
    "tests/forge/integrations/test_transformers.py",
    "tests/harness/run/test_convergence.py",
    "tests/harness/run/test_config.py",
    "tests/harness/run/test_tensor_parallel.py",
    "tests/forge/test_properties.py",
    "tests/forge/test_low_precision.py",
    "tests/forge/test_int8_states.py",
    "tests/harness/kernels/test_build.py",
    "tests/forge/test_models.py",
    "tests/forge/test_rules.py",
    "tests/harness/run/test_slurm.py",
    "tests/forge/test_clip.py",
    "tests/forge/test_compile.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(item.path).relative_to(_ROOT).as_posix(), len(rank)))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(autouse=True)
def _fresh_seed(request):
    # A different but reproducible draw per test: never test on zeros or on one lucky seed.
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


# The README claims how many tests there are and how long the whole suite takes on two cores
# (tests/test_readme.py checks the count). A run of the whole suite on a machine of at most two
# cores fails if it took longer than the README says: the claim is then false and must be changed.
_README_CLAIM = re.compile(
    r"The tests number between ([\d,]+) and ([\d,]+).*?take (\d+) to (\d+) minutes on 2 cores", re.S
)


def readme_claims() -> tuple[int, int, int, int]:
    """(fewest tests, most tests, fewest minutes, most minutes) as the README states them."""
    found = _README_CLAIM.search(re.sub(r"\s+", " ", (Path(_ROOT) / "README.md").read_text()))
    assert found, "README.md no longer says how many tests there are and how long they take"
    return tuple(int(v.replace(",", "")) for v in found.groups())  # type: ignore[return-value]


def pytest_sessionstart(session):
    session.config._forge_started = time.monotonic()


def pytest_sessionfinish(session, exitstatus):
    config, opt = session.config, session.config.option
    selected = any(getattr(opt, name, None) for name in ("keyword", "markexpr", "lf", "exitfirst"))
    if hasattr(config, "workerinput") or selected or exitstatus != 0 or (os.cpu_count() or 1) > 2:
        return  # a worker, a selection, a failure already, or a machine the claim is not about
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    ran = sum(len(reporter.stats.get(kind, [])) for kind in ("passed", "skipped")) if reporter else 0
    fewest, _most, _low, high = readme_claims()
    minutes = (time.monotonic() - config._forge_started) / 60
    if ran >= fewest and minutes > high:
        print(
            f"\nREADME.md says the tests take at most {high} minutes on 2 cores; they took {minutes:.1f}:"
            " change the claim (README.md, 'Two commands')"
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

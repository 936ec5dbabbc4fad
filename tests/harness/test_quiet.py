"""harness.quiet: the four lines torchao's import logs are gone from a sweep; nothing else is."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from harness.run import grid
from harness.run.config import compose_config

REPO = Path(__file__).resolve().parents[2]

FOUR_LINES = ("_C_mxfp8", "_C_cutlass_90a", "KernelPreference", "ScaleCalculationMode")


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=REPO, timeout=300
    )


def test_the_smoke_sweeps_import_path_prints_none_of_the_four_lines(tmp_path):
    """`sweep +exp=smoke --dry-run` takes the sweep's whole path up to the first point (composing
    every point, building each model to check it fits), which is where torchao gets imported."""
    done = subprocess.run(
        [sys.executable, "-m", "harness", "sweep", "+exp=smoke", f"results_dir={tmp_path}", "--dry-run"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    points = grid.expand(compose_config(["+exp=smoke"]), ["+exp=smoke"])
    assert f"would run {len(points)} point(s)" in done.stdout
    for text in FOUR_LINES:
        assert text not in done.stderr + done.stdout, done.stderr


def test_the_same_loggers_still_show_everything_else():
    done = _python(
        """
        import enum, logging, warnings
        import harness
        import torch.utils._pytree as pytree

        logging.basicConfig(format="%(name)s: %(message)s")
        torchao = logging.getLogger("torchao")
        torchao.warning("Failed to load /x/torchao/_C_mxfp8.abi3.so: dropped")
        torchao.warning("Failed to load /x/torchao/_C_other.abi3.so: shown")
        torchao.warning("another torchao warning")
        KernelPreference = enum.Enum("KernelPreference", "A", module="torchao.quantization")
        Mine = enum.Enum("Mine", "A", module="my_package")
        for cls in (KernelPreference, Mine):
            pytree.log.warning(
                "%s is an Enum subclass and is now natively supported by torch.compile as an "
                "opaque value type.", cls)
        warnings.warn("a warning of another kind")
        """
    )
    assert done.returncode == 0, done.stderr
    err = done.stderr
    assert "_C_mxfp8" not in err and "KernelPreference" not in err
    assert "_C_other.abi3.so: shown" in err and "another torchao warning" in err
    assert "<enum 'Mine'> is an Enum subclass" in err
    assert "a warning of another kind" in err

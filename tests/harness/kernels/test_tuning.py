"""The tuning summary (`python -m harness.kernels.tuning`) names each point's winner and the geometric mean
of every candidate against the shipped config, per state dtype and T range."""

import pytest

from harness.kernels import tuning

SHIPPED = dict(block_n=128, block_k=128, block_t=64, epilogue_split=4, num_warps=8, num_stages=3, maxnreg=128)
HALF = dict(SHIPPED, block_n=64)


def _record(config, T, ms, status="ok"):
    return dict(
        variant="forge_tune",
        shape_name="gate",
        T=T,
        state_dtype="int8",
        config=config,
        time_ms=ms,
        status=status,
    )


def test_summary_picks_winners_and_geometric_means():
    records = [
        _record(SHIPPED, 1024, 1.0),
        _record(HALF, 1024, 0.5),
        _record(SHIPPED, 8192, 2.0),
        _record(HALF, 8192, 4.0),
        _record(HALF, 4096, None, status="error"),  # a config that failed is left out
    ]
    text = tuning.summarize(records)
    assert "| int8 | 1024 | gate | 1.0000 | 0.5000 | 64x128x64" in text
    assert "| int8 | 8192 | gate | 2.0000 | 2.0000 | 128x128x64" in text
    half_row = next(line for line in text.splitlines() if line.startswith("| 64x128x64") and "(" in line)
    assert "2.000 (2.00)" in half_row and "0.500 (0.50)" in half_row


def test_summary_refuses_a_file_without_tuning_records():
    with pytest.raises(SystemExit, match="kernels --tune"):
        tuning.summarize([dict(variant="forge", T=1024)])

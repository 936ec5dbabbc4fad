"""Tests of the harness, laid out as harness/ is: run/, report/, kernels/, and the shared modules."""

from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures" / "results"  # small results files shaped like the real ones
CONF = HERE / "conf"  # an extra Hydra search path with the misbehaving methods of fakes.py

"""Tests of the kernel lab (harness/kernels/)."""

"""forge-bench tests: tests/forge mirrors forge/, tests/harness mirrors harness/."""

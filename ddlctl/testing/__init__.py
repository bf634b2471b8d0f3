"""Test harness shared by tests and benchmarks."""

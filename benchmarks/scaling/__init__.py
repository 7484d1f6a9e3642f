"""Scaling of the parallel layouts on this machine: `python -m benchmarks.scaling --help`."""

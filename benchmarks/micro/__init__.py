"""Micro-benchmarks: the LSTM kernels, the head by rows, a step's operator launches and syncs, CPU time by operator, the GEMM peak."""

"""The measurements behind docs/BENCHMARKS.md and docs/RELIABILITY.md, by subject. Each runs from the
repository root as a module (`python -m benchmarks.scaling`, `python -m benchmarks.micro.peak`, ...), and
its --help says what it measures:

    scaling      the parallel layouts side by side, the scaling goals, one process alone (python -m benchmarks.scaling)
    peers        OpenNMT-py beside ours on the same model and batches
    planner      the layout planner against measured runs, and its predictions for GPUs (python -m benchmarks.planner)
    gpu          the GPU check for a lent device, its wheels and data, the device profile
    data         preparing data at scale, the TMX reader, batching of patent-length sentences
    micro        kernel and operator studies: the LSTM kernels, the head, the loss's projection, a step's ops,
                 CPU time, the GEMM peak
    quality      BLEU in a time budget, optimizer recipes, the demo corpus's recipes, numbers copied
    reliability  resume across layouts, failing nodes, hostile inputs, memory over a long run

What the scripts share (the enja-small data, running the real training CLI, reading its metrics, a free
port, the CPU's name) is in benchmarks/common.py, once; every result is written as a record through
benchmarks/results (`python -m benchmarks.results render` makes docs/BENCHMARKS.md of them).
"""

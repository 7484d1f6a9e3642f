"""This machine's measured matmul peak: GEMM FLOP/s in fp32 and bf16 on 1 and 2 threads.

    python -m benchmarks.micro.peak [--work /tmp/hybrid-nmt-bench] [--threads 1 2] [--reps 5] [--rounds 3]

torch.matmul (2*m*n*k FLOPs, benchmarks/gpu/gpu_profile.py::gemm: the median of --reps calls after 3 warm-ups;
the best of --rounds rounds, interleaved over precisions and thread counts) on large squares and on the
GEMM shapes of enja-small's step of 64 pairs: the head's projection to the 8k vocabulary, the largest
product of a step (forward and its two backward products), for 1408 rows (64 pairs x 22 positions: a long
batch) and for 736 (~64 x 11.4, the real target tokens it runs on); an LSTM layer's input projection over a whole
sequence; one LSTM time step for the batch (64 x 256 @ 256 x 4*256). The best shape is the "peak" for each
precision and thread count. Prints the CPU, a markdown table, and writes WORK/peak.json, which the other
benchmarks read through benchmarks/common.py::matmul_peak:

    {"cpu": ..., "torch": ..., "fp32": {"1": flop/s, "2": flop/s}, "bf16": {...}, "shapes": {...}}
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.common import cpu_model
from benchmarks.gpu.gpu_profile import gemm

HEAD_ROWS, REAL_ROWS, HIDDEN, VOCAB, BATCH = 1408, 736, 256, 8000, 64
SHAPES = {  # label -> (m, n, k): (m x k) @ (k x n)
    "square 1024": (1024, 1024, 1024),
    "square 2048": (2048, 2048, 2048),
    "head projection 1408x256 @ 256x8000": (HEAD_ROWS, VOCAB, HIDDEN),
    "head projection 736x256 @ 256x8000": (REAL_ROWS, VOCAB, HIDDEN),
    "head grad input 1408x8000 @ 8000x256": (HEAD_ROWS, HIDDEN, VOCAB),
    "head grad weight 8000x1408 @ 1408x256": (VOCAB, HIDDEN, HEAD_ROWS),
    "LSTM input projection 1408x256 @ 256x1024": (HEAD_ROWS, 4 * HIDDEN, HIDDEN),
    "LSTM step 64x256 @ 256x1024": (BATCH, 4 * HIDDEN, HIDDEN),
}
PRECISIONS = ("fp32", "bf16")


def measure(threads: list[int], reps: int, rounds: int, shapes: dict = SHAPES) -> dict:
    """FLOP/s per shape, precision and thread count (the best of `rounds` interleaved rounds, each the median
    of `reps` calls), and the best shape per precision and thread count."""
    import torch

    before = torch.get_num_threads()
    result = {"cpu": cpu_model(), "torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
              "method": f"torch.matmul; best of {rounds} interleaved rounds of the median of {reps} calls after 3 "
                        f"warm-ups (benchmarks/gpu/gpu_profile.py::gemm)",
              "shapes": {label: {precision: {} for precision in PRECISIONS} for label in shapes}}
    try:
        for _ in range(rounds):  # interleaved, so a burst of other work on the machine hits one round, not one column
            for precision in PRECISIONS:
                for n in threads:
                    torch.set_num_threads(n)
                    for label, row in zip(shapes, gemm(torch.device("cpu"), precision, list(shapes.values()), reps)):
                        by_threads = result["shapes"][label][precision]
                        by_threads[str(n)] = max(by_threads.get(str(n), 0.0), row["tflops"] * 1e12)
    finally:
        torch.set_num_threads(before)
    for precision in PRECISIONS:
        result[precision] = {str(n): max(by[precision][str(n)] for by in result["shapes"].values()) for n in threads}
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/hybrid-nmt-bench"))
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--reps", type=int, default=5, help="timed calls per shape, precision and thread count in a round")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if min(args.threads) < 1 or args.reps < 1 or args.rounds < 1:
        raise SystemExit("--threads, --reps and --rounds must be >= 1")
    args.work.mkdir(parents=True, exist_ok=True)
    result = measure(args.threads, args.reps, args.rounds)
    cols = [(precision, str(n)) for precision in PRECISIONS for n in args.threads]
    print(f"{result['cpu']}, torch {result['torch']} ({result['cpu_capability']}); GFLOP/s of torch.matmul, "
          f"best of {args.rounds} rounds of the median of {args.reps} calls")
    print("| shape | " + " | ".join(f"{pr}, {n} thread{'' if n == '1' else 's'}" for pr, n in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for label, by in result["shapes"].items():
        print(f"| {label} | " + " | ".join(f"{by[pr][n] / 1e9:.0f}" for pr, n in cols) + " |")
    print("| **peak** | " + " | ".join(f"**{result[pr][n] / 1e9:.0f}**" for pr, n in cols) + " |")
    path = args.work / "peak.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

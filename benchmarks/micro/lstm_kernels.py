"""What cutting the time axis costs one LSTM layer, with torch's fused LSTM and with the stepwise kernel.

    python -m benchmarks.micro.lstm_kernels [--hidden 256 1024] [--precision bf16 fp32] [--chunks 1 2 4 8]
                                      [--batch 64] [--time 16] [--repeats 10]

One layer (input = hidden), a (batch, time) input cut into `chunks` consecutive time chunks, each a
separate call with the state carried from the previous one (as a pipeline stage runs its time chunks),
then the backward of all chunks. 1 thread. Prints the median forward and backward ms of each setting and
the ratio to one chunk (docs/BENCHMARKS.md 13.1): `fused` is model.lstm_kernel=fused (oneDNN on a CPU),
`stepwise` is trainer/model/lstm.py.
"""
from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.common import cpu_model


def time_chunks(lstm, x, chunks: int, kernel: str, repeats: int) -> tuple[float, float]:
    """Median (forward ms, backward ms) over `repeats` runs after 2 warm-up runs."""
    import torch

    from trainer.model.lstm import run_stepwise

    batch, steps, _ = x.shape

    def once():
        xin = x.detach().requires_grad_(True)
        state, outs = None, []
        t0 = time.perf_counter()
        for k in range(chunks):
            a, b = k * steps // chunks, (k + 1) * steps // chunks
            out, state = run_stepwise(lstm, xin[:, a:b], None, state) if kernel == "stepwise" else lstm(xin[:, a:b], state)
            outs.append(out)
        y = torch.cat(outs, 1)
        t1 = time.perf_counter()
        y.float().sum().backward()
        return t1 - t0, time.perf_counter() - t1

    for _ in range(2):
        once()
    runs = [once() for _ in range(repeats)]
    return 1000 * statistics.median(f for f, _ in runs), 1000 * statistics.median(b for _, b in runs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--precision", nargs="+", choices=("bf16", "fp32"), default=["bf16", "fp32"])
    p.add_argument("--chunks", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--time", type=int, default=16)
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    print(f"{cpu_model()}, 1 thread, torch {torch.__version__}; batch {args.batch}, {args.time} steps\n")
    print("| hidden | precision | kernel | chunks | forward ms | backward ms | fwd+bwd vs 1 chunk |")
    print("|---:|---|---|---:|---:|---:|---:|")
    for hidden in args.hidden:
        for prec in args.precision:
            dtype = torch.bfloat16 if prec == "bf16" else torch.float32
            torch.manual_seed(0)
            lstm = torch.nn.LSTM(hidden, hidden, batch_first=True).to(dtype)
            x = torch.randn(args.batch, args.time, hidden, dtype=dtype)
            for kernel in ("fused", "stepwise"):
                base = None
                for chunks in args.chunks:
                    f, b = time_chunks(lstm, x, chunks, kernel, args.repeats)
                    base = base or f + b
                    print(f"| {hidden} | {prec} | {kernel} | {chunks} | {f:.1f} | {b:.1f} | {(f + b) / base:.2f}x |",
                          flush=True)


if __name__ == "__main__":
    main()

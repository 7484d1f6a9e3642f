"""The head's output projection cut two ways (train.loss_projection), and the GEMMs that decide between them.

    python -m benchmarks.micro.loss_projection [--tokens 864] [--width 256] [--vocab 8000] [--chunk 256]
                                               [--threads 1 2] [--reps 20]

For each thread count and precision (fp32, bf16), ms per call, the median of --reps after 3 warm-ups:

* `logits, chunk GEMMs`: hidden (tokens, width) @ weight^T + bias in chunks of --chunk rows, one GEMM each
  (train.loss_projection=chunked); `logits, one GEMM`: all rows at once (=whole);
* `weight grad, ones column`: dlogits^T @ [hidden, 1], the weight and bias gradients in one GEMM with an inner
  size of width + 1 (chunked); `weight grad + column sums`: dlogits^T @ hidden and dlogits.sum(0) (whole);
* `loss, chunked` / `loss, whole`: the whole loss, forward with its gradients and backward, as the trainer
  times it at the start (trainer.training.tuning.time_loss_chunks; the best of 3 there, the median here).

The defaults are enja-small's head on one 64-pair batch (about 864 target tokens after rounding).
"""
from __future__ import annotations

import argparse
import statistics
import time


def median_ms(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def rows(tokens: int, width: int, vocab: int, chunk: int, dtype, reps: int) -> dict[str, float]:
    import torch

    from trainer.model.seq2seq import projected_cross_entropy

    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, width, generator=gen).to(dtype)
    weight = (torch.randn(vocab, width, generator=gen) * width ** -0.5).to(dtype)
    bias = torch.zeros(vocab).to(dtype)
    dlogits = torch.randn(tokens, vocab, generator=gen).to(dtype)
    ones = torch.ones(tokens, 1, dtype=dtype)
    target = torch.randint(4, vocab, (tokens,), generator=gen)
    out = {
        "logits, chunk GEMMs": lambda: [torch.addmm(bias, hidden[a:a + chunk], weight.t()) for a in range(0, tokens, chunk)],
        "logits, one GEMM": lambda: torch.addmm(bias, hidden, weight.t()),
        "weight grad, ones column": lambda: dlogits.t() @ torch.cat([hidden, ones], 1),
        "weight grad + column sums": lambda: (dlogits.t() @ hidden, dlogits.sum(0)),
    }
    result = {name: median_ms(fn, reps) for name, fn in out.items()}
    h, w, b = (t.clone().requires_grad_(True) for t in (hidden, weight, bias))
    for proj in ("chunked", "whole"):
        def loss_step(proj=proj):
            loss, _ = projected_cross_entropy(h, w, b, target, 0.1, chunk, proj == "whole")
            loss.backward()
            h.grad = w.grad = b.grad = None
        result[f"loss, {proj}"] = median_ms(loss_step, reps)
    return result


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.micro.loss_projection", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=864)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    import torch

    from benchmarks.common import cpu_model

    cases = [(t, d) for t in args.threads for d in (torch.float32, torch.bfloat16)]
    table = {}
    for threads, dtype in cases:
        torch.set_num_threads(threads)
        table[threads, dtype] = rows(args.tokens, args.width, args.vocab, args.chunk, dtype, args.reps)
    names = list(next(iter(table.values())))
    print(f"{cpu_model()}; {args.tokens} tokens x width {args.width} -> vocabulary {args.vocab}, chunks of "
          f"{args.chunk} rows; ms per call (median of {args.reps})")
    print("| | " + " | ".join(f"{str(d).replace('torch.', '')}, {t} thread{'s' * (t > 1)}" for t, d in cases) + " |")
    print("|---|" + "---:|" * len(cases))
    for name in names:
        print(f"| {name} | " + " | ".join(f"{table[c][name]:.1f}" for c in cases) + " |")


if __name__ == "__main__":
    main()

"""What the head costs by rows, and what one process pays when another shares the machine.

    python -m benchmarks.micro.head_rows [--work /tmp/hybrid-nmt-bench] [--precision bf16|fp32] [--side-by-side]

1. The enja-small head (general attention, attentional layer, 8k projection, label-smoothed loss;
   `trainer.model.seq2seq.build_head`) forward + backward on one thread at 16, 32, 64 and 128 pairs (source 14,
   target 16 positions of which 12 real): ms per call, median of 20 after 3 warm-ups. A head whose
   cost were proportional to its rows would double per line; the fixed part is what each replica of the
   hybrid's data-parallel head pays again.
2. With --side-by-side: single-process training (1 thread, 32 pairs per step: one hybrid_2 rank's share of
   the head) alone, then two such runs at once, through the real CLI; ms per step of forward, backward,
   head and optimizer (RUN_DIR/timing). The difference is what sharing the two cores costs a rank.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from benchmarks.common import REPO, ds_variant, prepare_enja, start_train, wait_train


def head_ms(pairs: int, dtype, reps: int = 20, src_len: int = 14, tgt_len: int = 16, real: int = 12) -> float:
    import torch

    from trainer.config import load_config
    from trainer.model.seq2seq import build_head

    cfg = load_config(str(REPO / "trainer" / "configs" / "enja_small.yaml")).model
    head = build_head(cfg, 8000).to(dtype)
    gen = torch.Generator().manual_seed(0)
    enc = torch.randn(pairs, src_len, cfg.hidden, generator=gen).to(dtype).requires_grad_()
    dec = torch.randn(pairs, tgt_len, cfg.hidden, generator=gen).to(dtype).requires_grad_()
    mask = torch.ones(pairs, src_len, dtype=torch.bool)
    target = torch.randint(4, 8000, (pairs, tgt_len), generator=gen)
    target[:, real:] = 0
    times = []
    for i in range(reps + 3):
        start = time.perf_counter()
        loss, _ = head(enc, mask, dec, target)
        loss.backward()
        if i >= 3:
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def side_by_side(work: Path, precision: str) -> None:
    data = prepare_enja(work)
    changes = {"train_micro_batch_size_per_gpu": 32}
    if precision == "fp32":
        changes["bf16"] = {"enabled": False}
    ds = ds_variant(work, "single", f"head_rows_{precision}", **changes)

    def show(label, started):
        s = wait_train(label, *started)
        t = s["timing"][0]
        parts = "  ".join(f"{k} {1000 * t[k]:.1f}" for k in ("forward", "backward", "head", "optimizer_step"))
        print(f"| {label} | {s['step_ms_median']:.1f} | {parts} |")

    print(f"\n| {precision}, 32 pairs per step, 1 thread | median step (ms) | ms per step |\n|---|---:|---|")
    show("alone", start_train(work, "head_rows_alone", ds, 1, 1, 40, data))
    runs = [start_train(work, f"head_rows_pair{i}", ds, 1, 1, 40, data) for i in (0, 1)]
    for i, started in enumerate(runs):
        show(f"two at once, run {i + 1}", started)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/hybrid-nmt-bench"))
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--side-by-side", action="store_true", help="also the training runs alone and two at once")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    print(f"| pairs | head forward + backward, {args.precision}, 1 thread (ms) | ms per pair |\n|---:|---:|---:|")
    for pairs in (16, 32, 64, 128):
        ms = head_ms(pairs, dtype)
        print(f"| {pairs} | {ms:.1f} | {ms / pairs:.2f} |", flush=True)
    if args.side_by_side:
        side_by_side(args.work, args.precision)
    return 0


if __name__ == "__main__":
    sys.exit(main())

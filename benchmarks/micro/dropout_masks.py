"""What drawing a step's dropout masks costs each rank, on the host: the draws a rank's forwards ask for
(trainer.model.dropout through trainer/parallel/interpreter.py), on the trainer's own batches, one thread.

    python -m benchmarks.micro.dropout_masks DATA_DIR [--steps 60] [--sentences 64] [--emb 256] [--hidden 256]
                                             [--p 0.2] [--rounds 3]

enja-small's sites (trainer/configs/enja_small.yaml): the two embeddings (emb), each side's two layer outputs
(hidden) and the head's attentional layer (hidden, on the gathered target tokens of its rows). Per step:

    single        every site over the micro-batch's rows
    data_2 r      every site over replica r's half of the rows
    hybrid_2 r    stage r's sites (0: the embeddings and layer 0, 1: layer 1) over every row, and the head's site
                  over the rank's shard (half the rows)

Runs with the training processes' allocator (trainer.training.memory). Prints the median over rounds of the mean ms per step for each, and each rank's share of single's. To compare with an
older trainer, run this file from a checkout of it (the mask API it calls is the same, less the head's row count).
"""
from __future__ import annotations

import argparse
import time
from statistics import median


def requests(layout: str, rank: int, rows: int) -> list[tuple]:
    """(site, side, feat kind, first row, rows, head) of each draw a rank asks for in one micro-step."""
    half = rows // 2
    emb = [(0, "src", "emb"), (1, "tgt", "emb")]
    layer = lambda k: [(10 + 2 * k, "src", "hidden"), (11 + 2 * k, "tgt", "hidden")]  # noqa: E731
    head = (99, "tgt", "hidden")
    if layout == "single":
        return [(*s, 0, rows, False) for s in emb + layer(0) + layer(1)] + [(*head, 0, rows, True)]
    if layout == "data_2":
        a = rank * half
        return [(*s, a, half, False) for s in emb + layer(0) + layer(1)] + [(*head, a, half, True)]
    own = emb + layer(0) if rank == 0 else layer(1)
    return [(*s, 0, rows, False) for s in own] + [(*head, rank * half, half, True)]


def one_step(batch, reqs: list, p: float, dims: dict) -> None:
    import torch

    from trainer.model.dropout import DropoutKeys

    rows, widths = batch.size, {"src": batch.src.shape[1], "tgt": batch.tgt_in.shape[1]}
    keys = DropoutKeys((7, 1, 0), rows, widths)
    for site, side, feat, row0, n, head in reqs:
        if not head:
            keys.at(row0, 0).mask(site, side, p, n, widths[side], dims[feat], torch.float32)
            continue
        tokens = (batch.tgt_out[row0:row0 + n] != 0).reshape(-1).nonzero().reshape(-1)  # the shard's real tokens
        try:
            at = keys.at(row0, 0, n)
        except TypeError:  # a trainer before the head's row count
            at = keys.at(row0, 0)
        at.mask(site, side, p, 0, widths[side], dims[feat], torch.float32, tokens)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data_dir")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--sentences", type=int, default=64)
    p.add_argument("--emb", type=int, default=256)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--p", type=float, default=0.2)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    from trainer.training import memory

    memory.prepare()  # the allocator a training process runs with (the process may exec itself)
    import numpy as np
    import torch

    torch.set_num_threads(1)
    from trainer.data import ParallelData, make_batches

    data = ParallelData(args.data_dir, "train")
    order, _ = make_batches(data.src_len, data.tgt_len, max_sentences=args.sentences, max_tokens=0, seed=1, epoch=0,
                            bucket_batches=100, min_batch=8)
    batches = [data.batch(b) for b in order[:args.steps]]
    dims = {"emb": args.emb, "hidden": args.hidden}
    runs = {"single": ("single", 0), "data_2 rank 0": ("data_2", 0), "data_2 rank 1": ("data_2", 1),
            "hybrid_2 rank 0": ("hybrid_2", 0), "hybrid_2 rank 1": ("hybrid_2", 1)}
    times: dict = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, (layout, rank) in runs.items():
            reqs = [requests(layout, rank, b.size) for b in batches]
            one_step(batches[0], reqs[0], args.p, dims)  # warm
            t = time.perf_counter()
            for b, r in zip(batches, reqs):
                one_step(b, r, args.p, dims)
            times[name].append((time.perf_counter() - t) / len(batches) * 1e3)
    base = median(times["single"])
    widths = np.mean([[b.src.shape[1], b.tgt_in.shape[1]] for b in batches], axis=0)
    print(f"{args.steps} batches of {args.sentences} pairs (mean padded widths {widths[0]:.1f} / {widths[1]:.1f}), "
          f"p={args.p}, 1 thread, median of {args.rounds} rounds")
    print("| who | mask ms per step | of single's |")
    print("|---|---:|---:|")
    for name in runs:
        ms = median(times[name])
        print(f"| {name} | {ms:.2f} | {ms / base:.2f} |")


if __name__ == "__main__":
    main()

"""How many distinct shapes a run's steps give the kernels, by data.length_multiple (the batch widths padded up to a
multiple): on a GPU each new GEMM shape loads a cuBLAS kernel (2-3.3 ms of host time each, 8 per step in the first
check's warm-up: ../shared/gpu/2026-12-04) and a CUDA graph is one per shape; the padding costs work instead.

    python -m benchmarks.data.shapes DATA_DIR [DATA_DIR ...] [--steps 1000] [--sentences 64 128] [--repeat 1 4]
                                     [--multiple 1 8 16]

For each DATA_DIR, each length stretch (--repeat K: every sentence K times as long, as the GPU check's patent-length
data, benchmarks/gpu/gpu_patent.py), each batch size and each multiple: the trainer's own batches
(trainer.data.make_batches over epochs, as training draws them) for --steps steps, and the distinct
source widths, target widths, (rows, source width, target width) batch shapes, head token counts (the rounded count
the head's GEMMs see, trainer.model.tensors.round_count) and whole-step shapes (all four), with the share of padded
positions. No training; prints one JSON object.
"""
from __future__ import annotations

import argparse
import json

import numpy as np


def count(src_len: np.ndarray, tgt_len: np.ndarray, steps: int, sentences: int, multiple: int,
          seed: int = 1) -> dict:
    from trainer.data import make_batches, padded_width
    from trainer.model.tensors import round_count

    shapes, srcs, tgts, tokens, steps_shapes = set(), set(), set(), set(), set()
    real = padded = 0
    epoch = done = 0
    while done < steps:
        batches, _ = make_batches(src_len, tgt_len, max_sentences=sentences, max_tokens=0, seed=seed, epoch=epoch,
                                  bucket_batches=100, min_batch=8)
        for b in batches[:steps - done]:
            s, t = src_len[b] + 1, tgt_len[b] + 1  # with EOS / BOS, as collate lays them out
            sw, tw = padded_width(int(s.max()), multiple), padded_width(int(t.max()), multiple)
            n = round_count(int(t.sum()))
            srcs.add(sw), tgts.add(tw), tokens.add(n), shapes.add((len(b), sw, tw)), steps_shapes.add((len(b), sw, tw, n))
            real += int(s.sum() + t.sum())
            padded += len(b) * (sw + tw)
        done += min(len(batches), steps - done)
        epoch += 1
    return {"src_widths": len(srcs), "tgt_widths": len(tgts), "batch_shapes": len(shapes), "head_token_counts": len(tokens),
            "step_shapes": len(steps_shapes), "padding_share": round(1 - real / padded, 4)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data_dirs", nargs="+")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--sentences", type=int, nargs="+", default=[64, 128])
    p.add_argument("--repeat", type=int, nargs="+", default=[1, 4], help="each sentence K times as long (patent: 4)")
    p.add_argument("--multiple", type=int, nargs="+", default=[1, 8, 16])
    args = p.parse_args(argv)
    from trainer.data import ParallelData

    result = {}
    for d in args.data_dirs:
        data = ParallelData(d, "train")
        for k in args.repeat:
            src_len, tgt_len = data.src_len * k, data.tgt_len * k
            for sentences in args.sentences:
                key = f"{d} x{k} {sentences} pairs"
                result[key] = {f"multiple {m}": count(src_len, tgt_len, args.steps, sentences, m)
                               for m in args.multiple}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

"""How even training batches are with sentence-count batching vs a token cap, on patent-length sentences.

    python -m benchmarks.data.batching DATA_DIR [DATA_DIR ...] [--sentences 64] [--max-tokens 0 6000] [--join 8]
                                       [--bucket-batches 100 [1000 ...]]

For each prepared DATA_DIR and each cap, one epoch of `trainer.data.make_batches` (the trainer's own
batching, bucketed by length as in training) is cut and measured: batches per epoch, padded src+tgt tokens
per batch (what a step computes on: min / median / 95th percentile / max, and their coefficient of
variation) and the share of padding, of both sides and of each (`src_padding_share`, `tgt_padding_share`).
`--bucket-batches` (default 100, as `data.bucket_batches`): the length-sort window, in batches; with more
than one, each cap is measured at each window (keys `max_tokens=CAP bucket_batches=N`). No training. Prints
one JSON object. `--join K` also measures patent-length pairs made from the corpus: each "pair" is 1..K
consecutive pairs joined (K seeded-uniform), as a claim of several clauses is (lengths only).
"""
from __future__ import annotations

import argparse
import json
import statistics

import numpy as np


def joined(src_len: np.ndarray, tgt_len: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Lengths of pairs made of 1..k consecutive pairs each (seeded)."""
    sizes = np.random.default_rng(1).integers(1, k + 1, size=len(src_len))
    ends = np.cumsum(sizes)
    ends = ends[ends <= len(src_len)]
    starts = np.concatenate([[0], ends[:-1]])
    src, tgt = np.concatenate([[0], np.cumsum(src_len)]), np.concatenate([[0], np.cumsum(tgt_len)])
    return src[ends] - src[starts], tgt[ends] - tgt[starts]


def measure(src_len: np.ndarray, tgt_len: np.ndarray, sentences: int, max_tokens: int,
            bucket_batches: int = 100) -> dict:
    from trainer.data import make_batches

    batches, left_out = make_batches(src_len, tgt_len, max_sentences=sentences, max_tokens=max_tokens,
                                     seed=1, epoch=0, bucket_batches=bucket_batches, min_batch=8)
    padded, rows = [], []
    side_padded, side_real = np.zeros(2), np.zeros(2)  # source, target
    for b in batches:
        s, t = src_len[b] + 1, tgt_len[b] + 1
        padded.append(len(b) * (int(s.max()) + int(t.max())))
        side_padded += (len(b) * int(s.max()), len(b) * int(t.max()))
        side_real += (int(s.sum()), int(t.sum()))
        rows.append(len(b))
    real = side_real.sum()
    q = np.percentile(padded, [0, 50, 95, 100])
    return {"batches": len(batches), "left_out": left_out, "sentences_per_batch_median": statistics.median(rows),
            "padded_tokens": {"min": int(q[0]), "median": int(q[1]), "p95": int(q[2]), "max": int(q[3])},
            "cv": round(statistics.pstdev(padded) / statistics.mean(padded), 3),
            "padding_share": round(1 - real / sum(padded), 3),
            "src_padding_share": round(1 - side_real[0] / side_padded[0], 3),
            "tgt_padding_share": round(1 - side_real[1] / side_padded[1], 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data_dirs", nargs="+")
    p.add_argument("--sentences", type=int, default=64, help="sentences per global micro-batch")
    p.add_argument("--max-tokens", type=int, nargs="+", default=[0, 6000])
    p.add_argument("--join", type=int, default=0, help="also pairs of 1..K joined pairs (patent-length claims)")
    p.add_argument("--bucket-batches", type=int, nargs="+", default=[100],
                   help="length-sort windows, in batches (data.bucket_batches); each cap is measured at each")
    args = p.parse_args()
    from trainer.data import ParallelData

    result = {}
    for d in args.data_dirs:
        data = ParallelData(d, "train")
        variants = {d: (data.src_len, data.tgt_len)}
        if args.join:
            variants[f"{d} joined 1..{args.join}"] = joined(data.src_len, data.tgt_len, args.join)
        for name, (src_len, tgt_len) in variants.items():
            lengths = src_len + tgt_len
            result[name] = {"pairs": len(lengths), "src+tgt pieces per pair": {
                "median": int(np.median(lengths)), "p95": int(np.percentile(lengths, 95)), "max": int(lengths.max())}}
            for cap in args.max_tokens:
                for window in args.bucket_batches:
                    key = f"max_tokens={cap}" + (f" bucket_batches={window}" if len(args.bucket_batches) > 1 else "")
                    result[name][key] = measure(src_len, tgt_len, args.sentences, cap, window)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

"""Single-rank training throughput of the reference model enja-small.

    python benchmarks/throughput.py [--work /tmp/hybrid-nmt-bench] [--steps 60] [--threads 2]

enja-small: emb 256, hidden 256, 2+2 layers, general attention, 8k BPE SentencePiece vocabulary per
side, batches of 64 sentence pairs, on ../shared/data/small_parallel_enja, trained through the real
CLI (`python launch/train.py --deepspeed_config ds_configs/single.json`), in fp32 and in bf16
(DeepSpeed's bf16 wrapper: bf16 weights and activations, fp32 master weights). Reported: sentence
pairs/s and src+tgt tokens/s over the steps after 3 warm-up steps, and the per-step time split of the
schedule (forward, head, backward, optimizer). Reference on this machine (from the issue): OpenNMT-py
3.5.1, same model and batches, 2 threads, word-level vocabulary: ~220 pairs/s with input feeding,
~330 pairs/s without.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import breakdown, ds_variant, prepare_enja, train

OPENNMT_INPUT_FEED = 220.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/hybrid-nmt-bench"))
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    data = prepare_enja(args.work)
    results = {}
    for precision in ("fp32", "bf16"):
        name = f"throughput_{precision}"
        cfg = ds_variant(args.work, "single", name, bf16={"enabled": precision == "bf16"})
        results[precision] = train(args.work, name, cfg, 1, args.threads, args.steps, data)
    print(f"| precision | pairs/s | tokens/s | median step (ms) | fwd | head | bwd | opt | vs OpenNMT-py input-feed "
          f"({OPENNMT_INPUT_FEED:.0f} pairs/s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for precision, r in results.items():
        b = breakdown(r["timing"][0])
        print(f"| {precision} | {r['pairs_per_s']:.0f} | {r['tokens_per_s']:.0f} | {r['step_ms_median']:.0f} | "
              f"{b['forward']:.0f} | {b['head']:.0f} | {b['backward']:.0f} | {b['optimizer_step']:.0f} | "
              f"{r['pairs_per_s'] / OPENNMT_INPUT_FEED:.2f}x |")
    (args.work / "throughput.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

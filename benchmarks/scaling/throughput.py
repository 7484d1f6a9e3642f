"""Single-rank training throughput of the reference model enja-small.

    python benchmarks/throughput.py [--work /tmp/hybrid-nmt-bench] [--steps 60] [--threads 2]

enja-small: emb 256, hidden 256, 2+2 layers, general attention, 8k BPE SentencePiece vocabulary per
side, batches of 64 sentence pairs, on ../shared/data/small_parallel_enja, trained through the real
CLI (`python launch/train.py --deepspeed_config ds_configs/single.json`), in fp32 and in bf16
(DeepSpeed's bf16 wrapper: bf16 weights and activations, fp32 master weights). Reported: sentence
pairs/s and src+tgt tokens/s over the steps after 3 warm-up steps, and the per-step time split of the
schedule (forward, head, backward, optimizer). The peer, OpenNMT-py 3.5.1 with the same model and
batches, is measured next to ours by benchmarks/opennmt_peer.py (its own virtual environment); when
WORK/opennmt_peer.json exists, its numbers are printed beside these (from that run, not this one).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import breakdown, ds_variant, prepare_enja, train

PEER_RUNS = ("OpenNMT-py, no input feeding fp32", "OpenNMT-py, input feeding fp32")


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
    print("| precision | pairs/s | tokens/s | median step (ms) | fwd | head | bwd | opt |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for precision, r in results.items():
        b = breakdown(r["timing"][0])
        print(f"| {precision} | {r['pairs_per_s']:.0f} | {r['tokens_per_s']:.0f} | {r['step_ms_median']:.0f} | "
              f"{b['forward']:.0f} | {b['head']:.0f} | {b['backward']:.0f} | {b['optimizer_step']:.0f} |")
    peer_file = args.work / "opennmt_peer.json"
    if peer_file.exists():
        peer = json.loads(peer_file.read_text())
        for name in PEER_RUNS:
            if name in peer.get("runs", {}):
                print(f"{name}: {peer['runs'][name]['pairs_per_s']:.0f} pairs/s ({peer_file}, its own run; "
                      f"benchmarks/opennmt_peer.py measures both side by side)")
    else:
        print("the peer: python benchmarks/opennmt_peer.py (OpenNMT-py 3.5.1 beside ours, same model and batches)")
    (args.work / "throughput.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

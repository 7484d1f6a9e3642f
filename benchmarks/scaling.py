"""Scaling of the parallel modes on this machine, measured side by side in one run.

    python benchmarks/scaling.py [--work /tmp/bench] [--steps 40] [--units 1 2 4 8] [--precision fp32|bf16]

enja-small (emb 256, hidden 256, 2+2 layers, general attention, 8k BPE vocabulary, 64 sentence pairs
per batch) on ../shared/data/small_parallel_enja: single with 1 thread, single with 2 threads, data_2,
pipeline_2 and hybrid_2 (1 thread per rank) for each pipeline-unit count. Every run trains the same
batches (same seed); the first 3 steps are warm-up. Prints a markdown table of step time, tokens/s and
the ratio to single-1-thread, then per-rank time per step by category for the pipelined runs, and
writes everything to WORK/scaling.json.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import breakdown, ds_variant, prepare_enja, train


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/hybrid-nmt-bench"))
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--units", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    data = prepare_enja(args.work)
    bf16 = {"bf16": {"enabled": args.precision == "bf16"}}
    runs = [("single 1 thread", "single", 1, 1, {}), ("single 2 threads", "single", 1, 2, {}),
            ("data_2", "data_2", 2, 1, {})]
    for mode in ("pipeline_2", "hybrid_2"):
        runs += [(f"{mode} units={u}", mode, 2, 1, {"micro_batches": u}) for u in args.units]
    results = {}
    for label, base, ranks, threads, layout in runs:
        name = label.replace(" ", "_").replace("=", "")
        cfg = ds_variant(args.work, base, name, layout=layout, **bf16)
        results[label] = train(args.work, name, cfg, ranks, threads, args.steps, data)
        r = results[label]
        print(f"{label:24s} {r['step_ms_median']:7.1f} ms/step  {r['tokens_per_s']:8.0f} tok/s", flush=True)
    base = results["single 1 thread"]["tokens_per_s"]
    print(f"\n| run ({args.precision}) | median step (ms) | tokens/s | pairs/s | vs single-1-thread |")
    print("|---|---:|---:|---:|---:|")
    for label, r in results.items():
        print(f"| {label} | {r['step_ms_median']:.0f} | {r['tokens_per_s']:.0f} | {r['pairs_per_s']:.0f} "
              f"| {r['tokens_per_s'] / base:.2f}x |")
    print("\nper rank, ms per step: compute (forward / backward / head / optimizer), waiting in receives "
          "(transfer + pipeline bubbles), sends, collectives")
    print("| run | rank | compute | fwd | bwd | head | opt | recv wait | send | collectives |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, r in results.items():
        for rank, t in sorted(r["timing"].items()):
            b = breakdown(t)
            print(f"| {label} | {rank} | {b['compute']:.0f} | {b['forward']:.0f} | {b['backward']:.0f} | "
                  f"{b['head']:.0f} | {b['optimizer_step']:.0f} | {b['recv_wait']:.0f} | {b['send']:.0f} | "
                  f"{b['collectives']:.0f} |")
    (args.work / "scaling.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

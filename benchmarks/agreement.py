"""How closely the modes agree step by step: `model.dropout=0 train.seed=S` in every layout.

    python benchmarks/agreement.py [--work /tmp/hybrid-nmt-bench] [--steps 20] [--precision fp32|bf16]

Trains enja-small for `--steps` optimizer steps in single, data_2, pipeline_2 and hybrid_2
(the shipped ds_configs: Adam, warm-up, clipping) on the same batches and prints, per mode, the
largest |loss - single loss| over the steps of metrics.jsonl.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import ds_variant, prepare_enja, train


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/hybrid-nmt-bench"))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    data = prepare_enja(args.work)
    losses = {}
    for base, ranks in (("single", 1), ("data_2", 2), ("pipeline_2", 2), ("hybrid_2", 2)):
        name = f"agree_{base}_{args.precision}"
        cfg = ds_variant(args.work, base, name, bf16={"enabled": args.precision == "bf16"})
        train(args.work, name, cfg, ranks, 1, args.steps, data, extra=("model.dropout=0", "train.seed=11"))
        rows = [json.loads(x) for x in (args.work / "runs" / name / "metrics.jsonl").read_text().splitlines()]
        losses[base] = [r["loss"] for r in rows]
    ref = losses["single"]
    print(f"| mode ({args.precision}, {args.steps} steps) | max abs loss difference vs single | "
          f"max relative | loss at step {args.steps} |")
    print("|---|---:|---:|---:|")
    for mode, ls in losses.items():
        diffs = [abs(a - b) for a, b in zip(ls, ref)]
        rel = max(d / abs(b) for d, b in zip(diffs, ref))
        print(f"| {mode} | {max(diffs):.2e} | {rel:.2e} | {ls[-1]:.6f} |")
    (args.work / f"agreement_{args.precision}.json").write_text(json.dumps(losses, indent=1))


if __name__ == "__main__":
    main()

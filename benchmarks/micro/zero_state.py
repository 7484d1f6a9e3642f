"""Optimizer memory per rank with and without ZeRO stage 1 (`zero_optimization.stage: 1`): the fp32 masters and
Adam's two moments, which ZeRO-1 shards over the data-parallel replicas (trainer/parallel/deepspeed_zero.py).

    python -m benchmarks.micro.zero_state [--work /tmp/zero_state] [--config trainer/configs/enja_small.yaml]

Each layout trains 2 steps of the YAML's model through the real CLI (the deepspeed launcher for several ranks) and
the last metrics row's `rank{r}/optimizer_mb` columns are read (trainer/parallel/deepspeed_adapter.py,
Engine.optimizer_state_bytes: bytes of tensors, so the numbers do not depend on the machine or its load). Prints
a markdown table: MiB per rank without ZeRO and with it, and their ratio.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from benchmarks.common import REPO, ds_variant, metrics, prepare_enja, train_command

LAYOUTS = {  # name: (ranks, parallel_layout, global micro-batch)
    "data_2": (2, {"mode": "data", "num_pp": 1, "num_dp": 2}, 64),
    "data_4": (4, {"mode": "data", "num_pp": 1, "num_dp": 4}, 64),
    "grid_2x2": (4, {"mode": "hybrid", "num_pp": 2, "num_dp": 2, "micro_batches": 2}, 64),
    "hybrid_2": (2, {"mode": "hybrid", "num_pp": 2, "num_dp": 1}, 64),
}


def optimizer_mb(work: Path, data: Path, config: str, name: str, precision: str, zero: int) -> list[float]:
    """Each rank's optimizer MiB after 2 steps of layout `name`."""
    ranks, layout, batch = LAYOUTS[name]
    label = f"{name}_{precision}_zero{zero}"
    ds = ds_variant(work, "single", label, layout=layout, bf16={"enabled": precision == "bf16"},
                    train_micro_batch_size_per_gpu=batch // layout["num_dp"], zero_optimization={"stage": zero})
    cmd, env, run_dir = train_command(work, label, ds, ranks, 1, 2, data, config=config, extra=("train.seed=1",))
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        sys.exit(f"{label} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    row = metrics(run_dir)[-1]
    return [row[f"rank{r}/optimizer_mb"] for r in range(ranks)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/zero_state"))
    ap.add_argument("--config", default="trainer/configs/enja_small.yaml", help="the model's YAML")
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    ap.add_argument("--precision", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32"])
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    data = prepare_enja(args.work)
    print(f"# {args.config}: optimizer MiB per rank (fp32 masters + Adam's moments), rank 0 first")
    print("| layout | precision | without ZeRO | ZeRO stage 1 | ZeRO / without (sum over ranks) |")
    print("|---|---|---|---|---:|")
    for name in args.layouts:
        for precision in args.precision:
            plain, zero = (optimizer_mb(args.work, data, args.config, name, precision, z) for z in (0, 1))
            print(f"| {name} | {precision} | {' / '.join(f'{m:.2f}' for m in plain)} | "
                  f"{' / '.join(f'{m:.2f}' for m in zero)} | {sum(zero) / sum(plain):.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

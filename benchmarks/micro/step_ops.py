"""Operator launches and would-be device syncs of one optimizer step, per layout, at two sizes: what a GPU
step would queue and how often the host would wait for the device (trainer/observe/op_counter.py; counted on
the CPU, where the operators are the same).

    python -m benchmarks.micro.step_ops [--work /tmp/step_ops] [--sizes enja-small paper-structure]
                                  [--loss-chunk-rows 8192] [--precision bf16 fp32] [--json OUT]

enja-small      trainer/configs/enja_small.yaml on small_parallel_enja (8k BPE), 64 pairs per step
paper-structure the paper-size model's structure (4+4 layers, 128 pairs per step, general attention) at
                width 64: launches and syncs depend on layers, units, chunks and tokens, not on the
                width, and a step at width 1024 takes a minute on one core
Each layout trains 2 steps through the real CLI (launch/train.py, the deepspeed launcher for several ranks)
with `train.count_ops=true train.profile_from=1 train.profile_steps=1`: step 2 is counted on every rank
(RUN_DIR/profile/rank{r}.json). Prints a markdown table: syncs per step (max over ranks) with their
places, launches per step per rank, and the operators launched most.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from benchmarks.common import REPO, cpu_model, ds_variant, prepare_enja, train_command
from trainer.artifacts.run_dir import PROFILE_DIR, rank_file

LAYERS = {"enja-small": 2, "paper-structure": 4}  # pair layers of each size
SIZES = {  # YAML, overrides, pairs per step
    "enja-small": ("trainer/configs/enja_small.yaml", [], 64),
    "paper-structure": ("trainer/configs/paper_size.yaml", ["model.emb_dim=64", "model.hidden=64",
                                                            "data.min_batch_sentences=8"], 128),
}
LAYOUTS = {  # name: (world, parallel_layout)
    "single": (1, {"mode": "single"}),
    "data_2": (2, {"mode": "data", "num_pp": 1, "num_dp": 2}),
    "pipeline_2": (2, {"mode": "pipeline", "num_pp": 2, "num_dp": 1, "micro_batches": 4}),
    "hybrid_2": (2, {"mode": "hybrid", "num_pp": 2, "num_dp": 1, "micro_batches": 1}),
    "hybrid_2 2u 2c": (2, {"mode": "hybrid", "num_pp": 2, "num_dp": 1, "micro_batches": 2, "time_chunks": 2}),
    "hybrid_4": (4, {"mode": "hybrid", "num_pp": 4, "num_dp": 1, "micro_batches": 4}),
}


def count(work: Path, data: Path, size: str, name: str, precision: str, loss_chunk_rows: int) -> dict:
    """One layout's counted step: per rank its launches, syncs and launches by operator."""
    config, overrides, batch = SIZES[size]
    world, layout = LAYOUTS[name]
    label = f"{size}_{name}_{precision}".replace(" ", "_")
    ds = ds_variant(work, "hybrid_2", label, layout=layout, bf16={"enabled": precision == "bf16"},
                    train_micro_batch_size_per_gpu=batch // layout.get("num_dp", 1))
    cmd, env, run_dir = train_command(work, label, ds, world, 1, 2, data, config=config, extra=(
        *overrides, "train.seed=1", f"train.loss_chunk_rows={loss_chunk_rows}", "train.count_ops=true",
        "train.profile_from=1", "train.profile_steps=1"))
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        sys.exit(f"{label} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return [json.loads((run_dir / PROFILE_DIR / rank_file(r)).read_text()) for r in range(world)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/step_ops"))
    ap.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    ap.add_argument("--precision", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32"])
    ap.add_argument("--loss-chunk-rows", type=int, default=0,
                    help="train.loss_chunk_rows (0: the CPU's 128; 8192: what an accelerator uses)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    data = prepare_enja(args.work)
    rows = []
    print(f"# {cpu_model()}; train.loss_chunk_rows={args.loss_chunk_rows or 'auto (128 on a CPU)'}")
    print("| size | layout | precision | syncs/step | launches/step (per rank) | most launched |")
    print("|---|---|---|---:|---|---|")
    for size in args.sizes:
        for name in args.layouts:
            if LAYOUTS[name][1].get("num_pp", 1) > LAYERS[size]:
                continue  # more stages than the model has pair layers
            for precision in args.precision:
                ranks = count(args.work, data, size, name, precision, args.loss_chunk_rows)
                top = Counter()
                for r in ranks:
                    top.update(r["launches_by_op"])
                row = {"size": size, "layout": name, "precision": precision,
                       "syncs": max(int(r["syncs_per_step"]) for r in ranks),
                       "places": sorted({place for r in ranks for place in r["sync_sites"]}),
                       "launches": [int(r["launches_per_step"]) for r in ranks],
                       "top": [(op, int(n / len(ranks))) for op, n in top.most_common(6)]}
                rows.append(row)
                print(f"| {size} | {name} | {precision} | {row['syncs']} | {' / '.join(map(str, row['launches']))} | "
                      f"{', '.join(f'{op} {n}' for op, n in row['top'])} |", flush=True)
    for row in rows:
        if row["places"]:
            print(f"{row['size']} {row['layout']} {row['precision']}: syncs at {'; '.join(row['places'])}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

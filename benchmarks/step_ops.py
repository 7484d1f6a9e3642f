"""Operator launches and would-be device syncs of one optimizer step, per layout, at two sizes: what a GPU
step would queue and how often the host would wait for the device (trainer.op_counter; counted on the
CPU, where the operators are the same).

    python benchmarks/step_ops.py [--work /tmp/step_ops] [--sizes enja-small paper-structure]

enja-small      trainer/configs/enja_small.yaml on small_parallel_enja (8k BPE), 64 pairs per step
paper-structure the paper-size model's structure (4+4 layers, 128 pairs per step, general attention) at
                width 64: launches and syncs depend on layers, units, chunks and tokens, not on the
                width, and a step at width 1024 takes a minute on one core
Each layout is a real gloo job of the in-process pool (tests/harness.py), one warm-up step, then the
counted one (the first of three batches: the same batch in every layout). Prints a markdown table:
syncs per step (max over ranks) with their places, launches per step per rank, and the operators
launched most.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.harness, trainer

from common import REPO, cpu_model, prepare_enja  # noqa: E402

LAYERS = {"enja-small": 2, "paper-structure": 4}  # pair layers of each size
SIZES = {
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


def ds_config(global_batch: int, world: int, layout: dict, bf16: bool) -> dict:
    ds = json.loads((REPO / "ds_configs" / "hybrid_2.json").read_text())
    num_dp = layout.get("num_dp", 1)
    ds.update(train_micro_batch_size_per_gpu=global_batch // num_dp, parallel_layout=layout, bf16={"enabled": bf16})
    return ds


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
    from tests.harness import Workers
    from tests.parallel_jobs import count_step_ops

    args.work.mkdir(parents=True, exist_ok=True)
    data = prepare_enja(args.work)
    workers = Workers(max(LAYOUTS[name][0] for name in args.layouts))
    rows = []
    print(f"# {cpu_model()}; train.loss_chunk_rows={args.loss_chunk_rows or 'auto (128 on a CPU)'}")
    print("| size | layout | precision | syncs/step | launches/step (per rank) | most launched |")
    print("|---|---|---|---:|---|---|")
    try:
        for size in args.sizes:
            config, overrides, batch = SIZES[size]
            for name in args.layouts:
                world, layout = LAYOUTS[name]
                if layout.get("num_pp", 1) > LAYERS[size]:
                    continue  # more stages than the model has pair layers
                for precision in args.precision:
                    out = workers.run(world, count_step_ops, [f"data.dir={data}", *overrides, "train.seed=1",
                                                              f"train.loss_chunk_rows={args.loss_chunk_rows}"],
                                      ds_config(batch, world, layout, precision == "bf16"),
                                      str(args.work / "runs" / f"{size}_{name}_{precision}".replace(" ", "_")), 1,
                                      str(REPO / config), timeout=1800)
                    syncs = max(len(o["syncs"]) for o in out)
                    places = sorted({f"{op} at {where}" for o in out for op, where in o["syncs"]})
                    top = Counter()
                    for o in out:
                        top.update(o["by_op"])
                    row = {"size": size, "layout": name, "precision": precision, "syncs": syncs, "places": places,
                           "launches": [o["launches"] for o in out],
                           "top": [(op, n // world) for op, n in top.most_common(6)]}
                    rows.append(row)
                    print(f"| {size} | {name} | {precision} | {syncs} | {' / '.join(map(str, row['launches']))} | "
                          f"{', '.join(f'{op} {n}' for op, n in row['top'])} |", flush=True)
    finally:
        workers.close()
    for row in rows:
        if row["places"]:
            print(f"{row['size']} {row['layout']} {row['precision']}: syncs at {'; '.join(row['places'])}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

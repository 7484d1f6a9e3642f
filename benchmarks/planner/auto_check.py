"""`python -m benchmarks.planner auto-check`: is `parallel_layout: {"mode": "auto"}` within 5% of the fastest shipped
2-rank layout on this CPU? (issue 40, item 3: single-thread ranks, both precisions, both widths.)

For each model (small: trainer/configs/enja_small.yaml; wide: trainer/configs/enja_wide.yaml) and precision:
1. this machine's planner profile for the model, WORK/cpu_profile_MODEL.json (`python launch/plan.py --calibrate
   --config MODEL.yaml --out ...`, unless it is there);
2. trains 2 ranks of 1 thread through the launcher with `{"mode": "auto", "profile": that file}` (the auto path as a
   user runs it: the log's choice is read back from the run's ds_config.json), and each shipped 2-rank layout
   (data_2, pipeline_2, hybrid_2, hybrid_2_wide) at the same global batch (64 pairs) and precision;
3. prints each run's mean ms per step after the warm-up, and the chosen layout's against the fastest shipped one's.
With --rounds R every run trains R times, interleaved (each round starting one run later than the one before:
auto ran first in every round, and slower than the same layout run second in two of three), and each run's median
round counts. CPU-heavy: 2 widths x 2 precisions x 5 runs x R, each `--steps` steps (wide: several minutes a run);
run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks import results as records
from benchmarks.common import REPO, ds_variant, prepare_enja, train
from trainer.artifacts import run_dir as run_dir_names

MODELS = {"small": "trainer/configs/enja_small.yaml", "wide": "trainer/configs/enja_wide.yaml"}
SHIPPED = ("data_2", "pipeline_2", "hybrid_2", "hybrid_2_wide")
GOAL = 0.05


def auto_json(work: Path, name: str, profile: Path, precision: str) -> Path:
    ds = json.loads((REPO / "ds_configs" / "single.json").read_text())
    ds.update(bf16={"enabled": precision == "bf16"}, parallel_layout={"mode": "auto", "profile": str(profile)})
    path = work / f"{name}.json"
    path.write_text(json.dumps(ds, indent=1))
    return path


def profile_for(work: Path, model: str, data: Path) -> Path:
    path = work / f"cpu_profile_{model}.json"
    if not path.exists():
        subprocess.run([sys.executable, "launch/plan.py", "--calibrate", "--config", MODELS[model], "--out", str(path),
                        f"data.dir={data}"], cwd=REPO, check=True)
    return path


def same_layout(chosen: dict) -> list[str]:
    """The shipped 2-rank layouts whose parallel_layout is auto's choice (compared as the trainer reads them: the
    same LayoutSpec). Where auto chose one, its run and that layout's train the same thing, and the gap between
    them is this machine's run-to-run spread."""
    from trainer.parallel.layout import LayoutSpec

    spec = LayoutSpec.from_ds_config({"parallel_layout": chosen}, 2)
    return [name for name in SHIPPED if LayoutSpec.from_ds_config(
        json.loads((REPO / "ds_configs" / f"{name}.json").read_text()), 2) == spec]


def compare(times: dict, chosen: str) -> dict:
    """{label: [ms per round]} -> the chosen run's median against the fastest shipped layout's."""
    medians = {label: statistics.median(ms) for label, ms in times.items()}
    shipped = {k: v for k, v in medians.items() if k != "auto"}
    best = min(shipped, key=shipped.get)
    ratio = medians["auto"] / shipped[best] - 1
    return {"chosen": chosen, "auto_ms": medians["auto"], "best": best, "best_ms": shipped[best], "slower_by": ratio,
            "within_goal": ratio <= GOAL, "medians": medians, "same_as": same_layout(json.loads(chosen))}


def auto_check(args: argparse.Namespace) -> None:
    data = prepare_enja(args.work)
    cases = [(m, p) for m in args.model for p in args.precision]
    runs = {case: {} for case in cases}
    chosen = {}
    for rnd in range(args.rounds):
        for model, precision in cases:
            profile = profile_for(args.work, model, data)
            tag = f"auto_{model}_{precision}"
            jsons = {"auto": auto_json(args.work, tag, profile, precision),
                     **{name: ds_variant(args.work, name, f"{tag}_{name}", bf16={"enabled": precision == "bf16"})
                        for name in SHIPPED}}
            order = list(jsons.items())  # each round starts one run later: no run always follows the same one
            for label, path in order[rnd % len(order):] + order[:rnd % len(order)]:
                name = f"{tag}_{label}_r{rnd + 1}"
                ms = train(args.work, name, path, 2, 1, args.steps, data, config=MODELS[model])["step_ms_mean"]
                runs[(model, precision)].setdefault(label, []).append(ms)
                if label == "auto":
                    chosen[(model, precision)] = json.loads(
                        (args.work / "runs" / name / run_dir_names.DS_CONFIG).read_text())["parallel_layout"]
                print(f"round {rnd + 1}: {model} {precision} {label:14s} {ms:7.1f} ms/step", flush=True)
    print("\n| model | precision | auto chose | auto ms/step | fastest shipped | its ms/step | auto slower by |")
    print("|---|---|---|---:|---|---:|---:|")
    out = []
    for case in cases:
        row = {"model": case[0], "precision": case[1], **compare(runs[case], json.dumps(chosen[case]))}
        out.append(row)
        print(f"| {case[0]} | {case[1]} | `{row['chosen']}` | {row['auto_ms']:.1f} | {row['best']} | {row['best_ms']:.1f} | "
              f"{100 * row['slower_by']:+.1f}%{'' if row['within_goal'] else ' **'} |")
    for row in out:
        if row["best"] in row["same_as"]:
            print(f"{row['model']} {row['precision']}: auto chose {row['best']}'s layout, the fastest shipped: the two "
                  f"runs trained the same thing, and {100 * row['slower_by']:+.1f}% is this machine's spread between "
                  f"two runs of one layout", flush=True)
    (args.work / "auto_check.json").write_text(json.dumps(out, indent=1))
    records.write(auto_records(out, args))


def auto_records(rows: list[dict], args: argparse.Namespace) -> list[dict]:
    """One record per model and precision (table "auto" of the planner's question): auto's choice and its ms per
    step against the fastest shipped layout's, the median round of each."""
    return [records.record(
        "planner", "auto", command=records.command("benchmarks.planner"),
        settings={"model": row["model"], "precision": row["precision"], "ranks": 2, "threads_per_rank": 1,
                  "steps": args.steps, "rounds": args.rounds, "chosen": row["chosen"], "fastest_shipped": row["best"],
                  "chosen_is": row["same_as"]},
        figures={"auto_step_ms": round(row["auto_ms"], 1), "fastest_shipped_step_ms": round(row["best_ms"], 1),
                 **{f"{label}_step_ms": round(ms, 1) for label, ms in row["medians"].items() if label != "auto"}},
        ratios={"auto_slower_by": round(row["slower_by"], 4)}) for row in rows]

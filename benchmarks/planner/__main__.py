"""Is the planner right on this machine? Predicted vs measured step time, side by side.

    python benchmarks/plan_validation.py [--work /tmp/hybrid-nmt-bench] [--profile FILE] [--steps 30]
                                          [--precision bf16 fp32] [--only LABEL ...]

1. calibrates this machine (`python launch/plan.py --calibrate --config trainer/configs/enja_small.yaml
   --out WORK/cpu_profile.json`) unless --profile names a profile already measured here;
2. trains enja-small (64 pairs per step) through the real CLI in each layout: single with 1 and 2
   threads, data_2, pipeline_2 and hybrid_2 (1 thread per rank) with 1/2/4 pipeline units and 1/2/4
   time chunks, hybrid_2 with head_schedule per_unit; in bf16 and fp32;
3. predicts each run's step time with the planner (trainer.planner.plan.predict) on exactly the
   batches the run trained on (the steps after the 3 warm-up steps) and prints predicted vs
   measured mean step time and the error, then per rank the measured and predicted ms per step of
   each instruction type (RUN_DIR/timing/rank*.json vs the simulation) for rows off by more than 10%.
Writes everything to WORK/plan_validation.json. Numbers taken on a busy machine mean nothing: the
load average is printed before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


from common import REPO, ds_variant, prepare_enja, train

CONFIG = "trainer/configs/enja_small.yaml"
WARMUP = 3  # as common.summarise


def rows() -> list[tuple[str, str, int, int, dict]]:
    """(label, base JSON, ranks, threads per rank, layout changes)."""
    out = [("single 1 thread", "single", 1, 1, {}), ("single 2 threads", "single", 1, 2, {}),
           ("data_2", "data_2", 2, 1, {})]
    for units, chunks in ((1, 1), (2, 1), (4, 1), (1, 2), (1, 4)):
        out.append((f"pipeline_2 u{units} c{chunks}", "pipeline_2", 2, 1, {"micro_batches": units, "time_chunks": chunks}))
    for units, chunks in ((1, 1), (2, 1), (4, 1), (1, 2), (1, 4), (2, 2)):
        out.append((f"hybrid_2 u{units} c{chunks}", "hybrid_2", 2, 1, {"micro_batches": units, "time_chunks": chunks}))
    for units in (2, 4):
        out.append((f"hybrid_2 u{units} c1 per_unit", "hybrid_2", 2, 1,
                    {"micro_batches": units, "time_chunks": 1, "head_schedule": "per_unit"}))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/hybrid-nmt-bench"))
    p.add_argument("--profile", type=Path, default=None, help="a profile measured on this machine (else calibrate)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--precision", nargs="+", choices=("bf16", "fp32"), default=["bf16", "fp32"])
    p.add_argument("--only", nargs="*", default=None, help="run only rows whose label starts with one of these")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    data = prepare_enja(args.work)
    profile_path = args.profile or args.work / "cpu_profile.json"
    if args.profile is None:
        if profile_path.exists():
            profile_path.unlink()  # ours, from an earlier run of this script
        subprocess.run([sys.executable, "launch/plan.py", "--calibrate", "--config", CONFIG, "--out", str(profile_path),
                        f"data.dir={data}"], cwd=REPO, check=True)

    from trainer.config import load_config
    from trainer.ds_config import load_ds_config
    from trainer.parallel.layout import LayoutSpec
    from trainer.planner import plan
    from trainer.planner.candidates import Candidate
    from trainer.planner.profile import load

    profile = load(str(profile_path))
    cfg = load_config(str(REPO / CONFIG), [f"data.dir={data}"])
    results = []
    for precision in args.precision:
        for label, base, ranks, threads, layout in rows():
            if args.only and not any(label.startswith(o) for o in args.only):
                continue
            name = f"val_{precision}_{label}".replace(" ", "_")
            ds_path = ds_variant(args.work, base, name, layout=layout, bf16={"enabled": precision == "bf16"})
            measured = train(args.work, name, ds_path, ranks, threads, args.steps, data, config=CONFIG)
            ds = load_ds_config(str(ds_path), args.steps)
            spec = LayoutSpec.from_ds_config(ds, ranks)
            work = plan.workload(cfg, ds, steps=args.steps - WARMUP, skip=WARMUP)
            pred = plan.predict(Candidate(spec, ranks, threads), work, profile)
            row = {"precision": precision, "label": label, "measured_ms": measured["step_ms_mean"],
                   "measured_median_ms": measured["step_ms_median"], "predicted_ms": 1000 * pred.step_s,
                   "error": 1000 * pred.step_s / measured["step_ms_mean"] - 1,
                   "measured_ops": measured["timing"], "predicted_ops": pred.op_seconds,
                   "predicted_fractions": pred.fractions}
            results.append(row)
            print(f"{precision} {label:28s} measured {row['measured_ms']:7.1f} ms  predicted {row['predicted_ms']:7.1f} ms  "
                  f"error {100 * row['error']:+5.1f}%", flush=True)
    load_end = os.getloadavg()
    print(f"\nload average at end: {load_end}")
    report(results)
    (args.work / "plan_validation.json").write_text(json.dumps(
        {"profile": str(profile_path), "load_end": load_end, "rows": results}, indent=1))


def report(results: list[dict]) -> None:
    """The table of predicted against measured, and the instruction types of the rows off by more than 10%."""
    print("\n| precision | run | measured ms/step | predicted ms/step | error |")
    print("|---|---|---:|---:|---:|")
    for r in results:
        flag = "" if abs(r["error"]) <= 0.10 else " **"
        print(f"| {r['precision']} | {r['label']} | {r['measured_ms']:.1f} | {r['predicted_ms']:.1f} | "
              f"{100 * r['error']:+.1f}%{flag} |")
    within = sum(abs(r["error"]) <= 0.10 for r in results)
    print(f"\n{within} of {len(results)} rows within 10%")
    off = [r for r in results if abs(r["error"]) > 0.10]
    if off:
        print("\nrows off by more than 10%: ms per step by instruction type, measured / predicted, per rank")
        for r in off:
            for rank, measured_ops in sorted(r["measured_ops"].items()):
                predicted_ops = r["predicted_ops"].get(int(rank), {})
                cells = ", ".join(f"{op} {1000 * measured_ops.get(op, 0):.1f}/{1000 * predicted_ops.get(op, 0):.1f}"
                                  for op in sorted(set(measured_ops) | set(predicted_ops))
                                  if max(measured_ops.get(op, 0), predicted_ops.get(op, 0)) > 5e-4)
                print(f"  {r['precision']} {r['label']} rank {rank}: {cells}")


if __name__ == "__main__":
    main()

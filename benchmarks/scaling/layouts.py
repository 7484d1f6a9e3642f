"""The layouts side by side (the default mode of `python -m benchmarks.scaling`; its --help says what
each run is and what the tables hold): RUNS, trained in every precision and round, then reported.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from benchmarks import results as records
from benchmarks.common import RANK_CATEGORIES, breakdown, ds_variant, rank_fractions, train
from benchmarks.scaling import goals
from trainer.artifacts.run_dir import TIMELINE_DIR, TIMELINE_TRACE, timeline_png

MODELS = {"small": "trainer/configs/enja_small.yaml", "wide": "trainer/configs/enja_wide.yaml"}

# (name, DeepSpeed JSON base, ranks, threads per rank, parallel_layout changes[, top-level JSON changes, where
# "yaml": (KEY=VALUE, ...) are overrides of the trainer's config instead])
RUNS = [
    ("single 1 thread", "single", 1, 1, {}),
    ("single 2 threads", "single", 1, 2, {}),
    ("data_2", "data_2", 2, 1, {}),
    ("data_2 zero1", "data_2", 2, 1, {}, {"zero_optimization": {"stage": 1}}),
    # gloo's loopback TCP for the replicas' sums instead of shared memory (started early / all after the backward)
    ("data_2 gloo sums", "data_2", 2, 1, {"shared_memory_sums": False}),
    ("data_2 sums after backward", "data_2", 2, 1, {"overlap_grad_sums": False, "shared_memory_sums": False}),
    # the OS places every thread (train.pin_cores=auto pins a CPU rank's threads to a core of its own)
    ("data_2 unpinned", "data_2", 2, 1, {}, {"yaml": ("train.pin_cores=off",)}),
    ("pipeline_2 units=1", "pipeline_2", 2, 1, {"micro_batches": 1}),
    ("pipeline_2 units=4", "pipeline_2", 2, 1, {"micro_batches": 4}),
    ("hybrid_2 units=1", "hybrid_2", 2, 1, {"micro_batches": 1, "time_chunks": 1}),
    ("hybrid_2 units=1 unpinned", "hybrid_2", 2, 1, {"micro_batches": 1, "time_chunks": 1},
     {"yaml": ("train.pin_cores=off",)}),
    ("hybrid_2 units=2", "hybrid_2", 2, 1, {"micro_batches": 2, "time_chunks": 1}),
    ("hybrid_2 units=4", "hybrid_2", 2, 1, {"micro_batches": 4, "time_chunks": 1}),
    ("hybrid_2 chunks=2", "hybrid_2", 2, 1, {"micro_batches": 1, "time_chunks": 2}),
    ("hybrid_2 chunks=4", "hybrid_2", 2, 1, {"micro_batches": 1, "time_chunks": 4}),
    ("hybrid_2 chunks=8", "hybrid_2", 2, 1, {"micro_batches": 1, "time_chunks": 8}),
    # the last stage's head share runs slower (it also scatters the shards and gathers their gradients)
    ("hybrid_2 chunks=4 shares=17:15", "hybrid_2", 2, 1, {"micro_batches": 1, "time_chunks": 4,
                                                          "head_shares": [17, 15]}),
    ("hybrid_2 units=2 chunks=4", "hybrid_2", 2, 1, {"micro_batches": 2, "time_chunks": 4}),
    # the weight gradients after each rank's last backward (stepwise kernel only)
    ("hybrid_2 chunks=4 deferred", "hybrid_2", 2, 1, {"micro_batches": 1, "time_chunks": 4,
                                                      "defer_weight_grads": True}),
    # the head cut along time: rank 0 the first 2 chunks' positions, the last stage the last 2
    ("hybrid_2 chunks=2 time", "hybrid_2", 2, 1, {"micro_batches": 1, "time_chunks": 2, "head_split": "time"}),
    ("hybrid_2 chunks=4 time", "hybrid_2", 2, 1, {"micro_batches": 1, "time_chunks": 4, "head_split": "time"}),
    ("hybrid_2 chunks=4 time unpinned", "hybrid_2", 2, 1, {"micro_batches": 1, "time_chunks": 4,
                                                           "head_split": "time"}, {"yaml": ("train.pin_cores=off",)}),
    ("hybrid_2 chunks=4 time deferred", "hybrid_2", 2, 1, {"micro_batches": 1, "time_chunks": 4,
                                                           "head_split": "time", "defer_weight_grads": True}),
    ("hybrid_2 chunks=8 time", "hybrid_2", 2, 1, {"micro_batches": 1, "time_chunks": 8, "head_split": "time"}),
    ("hybrid_2 chunks=8 time 5:3", "hybrid_2", 2, 1, {"micro_batches": 1, "time_chunks": 8, "head_split": "time",
                                                      "head_shares": [5, 3]}),
    # the head projection's weight gradient where rank 0 would wait (after sending its shard's gradients)
    ("hybrid_2 units=1 head deferred", "hybrid_2", 2, 1, {"micro_batches": 1, "time_chunks": 1,
                                                          "defer_head_weight_grads": True}),
    ("hybrid_2 units=1 head deferred 9:7", "hybrid_2", 2, 1, {"micro_batches": 1, "time_chunks": 1,
                                                              "defer_head_weight_grads": True, "head_shares": [9, 7]}),
    ("hybrid_2 chunks=4 time head deferred", "hybrid_2", 2, 1, {"micro_batches": 1, "time_chunks": 4,
                                                                "head_split": "time", "defer_head_weight_grads": True}),
    ("pipeline_2 units=4 head deferred", "pipeline_2", 2, 1, {"micro_batches": 4, "defer_head_weight_grads": True}),
    ("hybrid_2 per_unit units=2", "hybrid_2", 2, 1, {"micro_batches": 2, "time_chunks": 1,
                                                     "head_schedule": "per_unit"}),
    ("hybrid_2 per_unit units=4", "hybrid_2", 2, 1, {"micro_batches": 4, "time_chunks": 1,
                                                     "head_schedule": "per_unit"}),
]


def run(args: argparse.Namespace, steps: int, data: Path, peak: dict, pngs: Path) -> None:
    """Train every run of RUNS (--only, --lstm-kernel) in each precision and round; report the median round."""
    precisions = ("bf16", "fp32") if args.precision == "both" else (args.precision,)
    runs = with_kernels([r for r in RUNS if args.only is None or r[0] in args.only], args.lstm_kernel)
    results: dict = {prec: {} for prec in precisions}
    for rnd in range(args.rounds):
        for prec in precisions:
            for label, base, ranks, threads, layout, top, kernel in runs:
                name = f"{args.model}_{prec}_{label.replace(' ', '_').replace('=', '')}"
                top = dict(top)
                overrides = top.pop("yaml", ())
                cfg = ds_variant(args.work, base, name, layout=layout, bf16={"enabled": prec == "bf16"}, **top)
                r = train(args.work, name, cfg, ranks, threads, steps, data, config=MODELS[args.model],
                          extra=(f"train.timeline_every={steps - 1}", f"model.lstm_kernel={kernel}", *overrides))
                run_dir = args.work / "runs" / name
                r.update(rank_fractions(run_dir), run_dir=str(run_dir))
                png = run_dir / TIMELINE_DIR / timeline_png(steps - 1)
                if png.exists():
                    shutil.copy(png, pngs / f"{name}.png")
                results[prec].setdefault(label, []).append(r)
                print(f"[{rnd + 1}/{args.rounds}] {prec} {label:28s} {r['step_ms_median']:7.1f} ms/step "
                      f"{r['tokens_per_s']:8.0f} tok/s", flush=True)
    summary = {}
    for prec in precisions:
        summary[prec] = {}
        for label, rs in results[prec].items():
            best = sorted(rs, key=lambda x: x["step_ms_median"])[len(rs) // 2]
            summary[prec][label] = best
        report(prec, summary[prec], peak, runs)
    out = args.work / ("scaling.json" if args.model == "small" else f"scaling_{args.model}.json")
    out.write_text(json.dumps({"peak": peak, "model": args.model, "results": summary}, indent=1))
    records.write(to_records(summary, args.model, runs, records.command("benchmarks.scaling")))


def to_records(summary: dict, model: str, runs: list, command: str) -> list[dict]:
    """Each run's median round as a record of the scaling question's layouts (tokens/s, pairs/s, ms per step)."""
    threads = {label: (ranks, t) for label, _, ranks, t, _, _, _ in runs}
    kernel = {label: k for label, *_, k in runs}
    return [records.record("scaling", "layouts", command=command, settings={
        "model": {"small": "enja-small"}.get(model, model), "precision": prec, "layout": label,
        "ranks": threads[label][0], "threads": threads[label][1], "lstm_kernel": kernel[label]},
        figures={"tokens_per_s": r["tokens_per_s"], "pairs_per_s": r["pairs_per_s"], "step_ms_median": r["step_ms_median"],
                 "model_gflop": r["model_gflop"]})
        for prec, rows in summary.items() for label, r in rows.items()]


def with_kernels(runs: list, kernel: str) -> list:
    """RUNS rows with the LSTM kernel appended. A single process runs with each kernel (the ratios are
    taken against the faster, the strongest baseline); the parallel runs with `kernel`, or with each
    for `both`. The kernel joins the name of a run that has both."""
    both = ("fused", "stepwise")
    out = []
    for r in runs:
        r = (*r, {}) if len(r) == 5 else r  # no top-level JSON changes
        kernels = both if r[2] == 1 or kernel == "both" else (kernel,)
        out += [(f"{r[0]} {k}" if len(kernels) > 1 else r[0], *r[1:], k) for k in kernels]
    return out


def report(prec: str, res: dict, peak: dict, runs: list) -> None:
    threads = {label: (ranks, t) for label, _, ranks, t, _, _, _ in runs}
    # ratios against the fastest single process with 1 / 2 threads in the table (either LSTM kernel)
    one = max((r["tokens_per_s"] for label, r in res.items() if threads[label] == (1, 1)), default=None)
    two = max((r["tokens_per_s"] for label, r in res.items() if threads[label] == (1, 2)), default=None)
    print(f"\n| run ({prec}) | median step (ms) | tokens/s | pairs/s | vs single-1-thread | vs single-2-threads "
          f"| model GFLOP/s | % of peak |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, r in res.items():
        ranks, t = threads[label]
        cores = ranks * t
        machine_peak = float(peak[prec][str(min(cores, 2))])
        gflops = r["model_gflop"] / (r["step_ms_median"] / 1000)
        ratio = lambda base: f"{r['tokens_per_s'] / base:.2f}x" if base else "-"  # noqa: E731
        print(f"| {label} | {r['step_ms_median']:.0f} | {r['tokens_per_s']:.0f} | {r['pairs_per_s']:.0f} | "
              f"{ratio(one)} | {ratio(two)} | {gflops:.1f} | {100 * gflops * 1e9 / machine_peak:.1f}% |")
    print(f"\nper rank ({prec}): fraction of the step busy / waiting / communicating / idle; ms per step in "
          f"forward / backward / head / optimizer")
    print("| run | rank | busy | waiting | communicating | idle | fwd | bwd | head | opt |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, r in res.items():
        for rank, f in sorted(r["ranks"].items()):
            b = breakdown(r["timing"].get(rank, r["timing"].get(str(rank), {})))
            print(f"| {label} | {rank} | " + " | ".join(f"{f.get(c, 0):.2f}" for c in RANK_CATEGORIES) +
                  f" | {b['forward']:.0f} | {b['backward']:.0f} | {b['head']:.0f} | {b['optimizer_step']:.0f} |")
    cols = ("forward", "backward", "head", "optimizer", *goals.PHASES, "step")
    print(f"\nhybrid runs ({prec}): the timeline's sampled step, ms per rank by where it falls "
          f"(benchmarks/scaling/goals.py::where_ms)")
    print("| run | rank | " + " | ".join(cols) + " |")
    print("|---|---:|" + "---:|" * len(cols))
    for label, r in res.items():
        trace = Path(r["run_dir"]) / TIMELINE_DIR / TIMELINE_TRACE
        if label.startswith("hybrid") and trace.exists():
            for rank, row in goals.where_ms(json.loads(trace.read_text())).items():
                print(f"| {label} | {rank} | " + " | ".join(f"{row[c]:.0f}" for c in cols) + " |")

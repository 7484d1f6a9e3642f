"""Scaling of the parallel modes on this machine, measured side by side in one run.

    python benchmarks/scaling.py [--work /tmp/hybrid-nmt-bench] [--steps 40] [--precision both|bf16|fp32]
                                 [--only NAME ...] [--rounds 1] [--model small|wide]
                                 [--lstm-kernel fused|stepwise|both]
    python benchmarks/scaling.py --goals [--work ...] [--rounds 2]

enja-small (emb 256, hidden 256, 2+2 layers, general attention, 8k BPE vocabulary per side, 64 sentence
pairs per step) on ../shared/data/small_parallel_enja, trained through the real CLI: single with 1 and
2 threads, data_2 (DeepSpeed's data parallelism), pipeline_2 and hybrid_2 variants (1 thread per
rank). `--model wide`: trainer/configs/enja_wide.yaml, the same at emb/hidden 1024 (the paper's width, where
the LSTMs' compute dominates).
`--lstm-kernel`: model.lstm_kernel of the parallel runs (`both`: each run with each); a single process
always runs with both kernels, and the ratios are taken against the faster. Every run trains the same
batches (same seed); the first 3 steps are warm-up. For each precision: a table of median step time, tokens/s, pairs/s, the ratio to single with 1 and with 2
threads, model GFLOP/s (trainer/model/flops.py) and its fraction of this machine's measured matmul peak
(benchmarks/peak.py: the 1-thread peak for one thread, the 2-thread peak for both cores); then per rank
the busy / waiting / communicating / idle fractions (metrics.jsonl) and ms per step by category.
Each run's Gantt chart of one step is copied to WORK/scaling/<precision>_<run>.png. Everything goes to
WORK/scaling.json.
`--goals`: issue 23's goals from one command, both sizes and both precisions (benchmarks/scaling_goals.py):
which are met, by how much in each round, and where the shipped hybrid's milliseconds are on its timeline;
to WORK/scaling_goals.json.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path

import scaling_goals
from common import breakdown, ds_variant, matmul_peak, prepare_enja, train

# (name, DeepSpeed JSON base, ranks, threads per rank, parallel_layout changes)
RUNS = [
    ("single 1 thread", "single", 1, 1, {}),
    ("single 2 threads", "single", 1, 2, {}),
    ("data_2", "data_2", 2, 1, {}),
    ("pipeline_2 units=1", "pipeline_2", 2, 1, {"micro_batches": 1}),
    ("pipeline_2 units=4", "pipeline_2", 2, 1, {"micro_batches": 4}),
    ("hybrid_2 units=1", "hybrid_2", 2, 1, {"micro_batches": 1, "time_chunks": 1}),
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
    ("hybrid_2 chunks=4 time deferred", "hybrid_2", 2, 1, {"micro_batches": 1, "time_chunks": 4,
                                                           "head_split": "time", "defer_weight_grads": True}),
    ("hybrid_2 chunks=8 time", "hybrid_2", 2, 1, {"micro_batches": 1, "time_chunks": 8, "head_split": "time"}),
    ("hybrid_2 chunks=8 time 5:3", "hybrid_2", 2, 1, {"micro_batches": 1, "time_chunks": 8, "head_split": "time",
                                                      "head_shares": [5, 3]}),
    ("hybrid_2 per_unit units=2", "hybrid_2", 2, 1, {"micro_batches": 2, "time_chunks": 1,
                                                     "head_schedule": "per_unit"}),
    ("hybrid_2 per_unit units=4", "hybrid_2", 2, 1, {"micro_batches": 4, "time_chunks": 1,
                                                     "head_schedule": "per_unit"}),
]
CATEGORIES = ("busy", "waiting", "communicating", "idle")


def rank_fractions(run_dir: Path, warmup: int = 3) -> dict:
    """Mean per-rank fractions over the logged rows after the warm-up."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["step"] > warmup]
    out = {}
    for key in rows[0]:
        if key.startswith("rank") and key.split("/")[1] in CATEGORIES:
            rank, cat = key[4:].split("/")
            out.setdefault(int(rank), {})[cat] = statistics.mean(r[key] for r in rows if key in r)
    gflop = statistics.median(r["model_gflop"] for r in rows)
    return {"ranks": out, "model_gflop": gflop, "peak_rss_mb": max(v for r in rows for k, v in r.items()
                                                                  if k.endswith("/peak_rss_mb"))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/hybrid-nmt-bench"))
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--precision", choices=("both", "bf16", "fp32"), default="both")
    p.add_argument("--only", nargs="*", default=None, help="run names to keep (default: all)")
    p.add_argument("--rounds", type=int, default=1, help="repeat every run, interleaved; report the median")
    p.add_argument("--model", choices=tuple(MODELS), default="small", help="small: emb/hidden 256; wide: 1024")
    p.add_argument("--lstm-kernel", choices=("fused", "stepwise", "both"), default="fused")
    p.add_argument("--goals", action="store_true", help="issue 23's goals: both models and precisions, "
                   "fixed runs (--model, --only, --precision, --lstm-kernel, --steps are not used)")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    data = prepare_enja(args.work)
    peak = matmul_peak(args.work)
    pngs = args.work / "scaling"
    pngs.mkdir(exist_ok=True)
    if args.goals:  # the report after every round, so that an interrupted run keeps what it measured
        def write(results: dict, done: int) -> None:
            out = scaling_goals.report(results, done)
            (args.work / "scaling_goals.json").write_text(json.dumps({"peak": peak, **out, "results": results},
                                                                     indent=1))
        scaling_goals.measure(args.work, data, MODELS, args.rounds, pngs, on_round=write)
        return
    precisions = ("bf16", "fp32") if args.precision == "both" else (args.precision,)
    runs = with_kernels([r for r in RUNS if args.only is None or r[0] in args.only], args.lstm_kernel)
    results: dict = {prec: {} for prec in precisions}
    for rnd in range(args.rounds):
        for prec in precisions:
            for label, base, ranks, threads, layout, kernel in runs:
                name = f"{args.model}_{prec}_{label.replace(' ', '_').replace('=', '')}"
                cfg = ds_variant(args.work, base, name, layout=layout, bf16={"enabled": prec == "bf16"})
                r = train(args.work, name, cfg, ranks, threads, args.steps, data, config=MODELS[args.model],
                          extra=(f"train.timeline_every={args.steps - 1}", f"model.lstm_kernel={kernel}"))
                run_dir = args.work / "runs" / name
                r.update(rank_fractions(run_dir), run_dir=str(run_dir))
                png = run_dir / "timeline" / f"step_{args.steps - 1:08d}.png"
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


MODELS = {"small": "trainer/configs/enja_small.yaml", "wide": "trainer/configs/enja_wide.yaml"}


def with_kernels(runs: list, kernel: str) -> list:
    """RUNS rows with the LSTM kernel appended. A single process runs with each kernel (the ratios are
    taken against the faster, the strongest baseline); the parallel runs with `kernel`, or with each
    for `both`. The kernel joins the name of a run that has both."""
    both = ("fused", "stepwise")
    out = []
    for r in runs:
        kernels = both if r[2] == 1 or kernel == "both" else (kernel,)
        out += [(f"{r[0]} {k}" if len(kernels) > 1 else r[0], *r[1:], k) for k in kernels]
    return out


def report(prec: str, res: dict, peak: dict, runs: list) -> None:
    threads = {label: (ranks, t) for label, _, ranks, t, _, _ in runs}
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
            print(f"| {label} | {rank} | " + " | ".join(f"{f.get(c, 0):.2f}" for c in CATEGORIES) +
                  f" | {b['forward']:.0f} | {b['backward']:.0f} | {b['head']:.0f} | {b['optimizer_step']:.0f} |")
    cols = ("forward", "backward", "head", "optimizer", *scaling_goals.PHASES, "step")
    print(f"\nhybrid runs ({prec}): the timeline's sampled step, ms per rank by where it falls "
          f"(benchmarks/scaling_goals.where_ms)")
    print("| run | rank | " + " | ".join(cols) + " |")
    print("|---|---:|" + "---:|" * len(cols))
    for label, r in res.items():
        trace = Path(r["run_dir"]) / "timeline" / "trace.json"
        if label.startswith("hybrid") and trace.exists():
            for rank, row in scaling_goals.where_ms(json.loads(trace.read_text())).items():
                print(f"| {label} | {rank} | " + " | ".join(f"{row[c]:.0f}" for c in cols) + " |")


if __name__ == "__main__":
    main()

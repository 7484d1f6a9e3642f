"""Scaling of the parallel layouts on this machine: one command, three modes.

    python -m benchmarks.scaling [--work /tmp/hybrid-nmt-bench] [--steps 40] [--precision both|bf16|fp32]
                                 [--only NAME ...] [--rounds 1] [--model small|wide]
                                 [--lstm-kernel fused|stepwise|both]
    python -m benchmarks.scaling --goals [--work ...] [--rounds 2] [--report-only]
    python -m benchmarks.scaling --throughput [--work ...] [--steps 60] [--threads 2]

The layouts (the default; benchmarks/scaling/layouts.py): enja-small (emb 256, hidden 256, 2+2 layers,
general attention, 8k BPE vocabulary per side, 64 sentence pairs per step) on
../shared/data/small_parallel_enja, trained through the real CLI: single with 1 and 2 threads, data_2
(DeepSpeed's data parallelism), pipeline_2 and hybrid_2 variants (1 thread per rank). `--model wide`:
trainer/configs/enja_wide.yaml, the same at emb/hidden 1024 (the paper's width, where the LSTMs' compute
dominates). `--lstm-kernel`: model.lstm_kernel of the parallel runs (`both`: each run with each); a single
process always runs with both kernels, and the ratios are taken against the faster. Every run trains the
same batches (same seed); the first 3 steps are warm-up. For each precision: a table of median step time,
tokens/s, pairs/s, the ratio to single with 1 and with 2 threads, model GFLOP/s (trainer/model/flops.py)
and its fraction of this machine's measured matmul peak (python -m benchmarks.micro.peak: the 1-thread
peak for one thread, the 2-thread peak for both cores); then per rank the busy / waiting / communicating /
idle fractions (metrics.jsonl) and ms per step by category, and for the hybrid runs the timeline's
sampled step by where each ms falls. Each run's Gantt chart of one step is copied to
WORK/scaling/<precision>_<run>.png. Everything goes to WORK/scaling.json (WORK/scaling_wide.json).

Each mode writes its results as records too (benchmarks/results: `--goals` to scaling.jsonl's goals and runs,
the layouts to its layouts, `--throughput` to its runs).

`--goals` (benchmarks/scaling/goals.py): the scaling goals from one command, both sizes and both precisions: the
ceiling (two single-rank runs at once, each on its own core: the most a 2-rank layout can reach on this machine),
every 2-rank layout as a fraction of it, which goals are met in each round, and for each one not met the
milliseconds and CPU seconds per thread that stand between; "ours over OpenNMT-py" from
WORK/opennmt_peer.json when python -m benchmarks.peers.opennmt_peer wrote one; to WORK/scaling_goals.json
(--model, --only, --precision, --lstm-kernel, --steps are not used). With --report-only it measures nothing and
reports the runs WORK/scaling_goals.json names again (they must still be in WORK/runs).

`--throughput` (benchmarks/scaling/throughput.py): one process alone, the ceiling every layout is held
against: enja-small through `python launch/train.py --deepspeed_config ds_configs/single.json` with
--threads threads, in fp32 and in bf16 (DeepSpeed's bf16 wrapper: bf16 weights and activations, fp32
master weights). Reported: sentence pairs/s and src+tgt tokens/s over the steps after 3 warm-up steps, and
the per-step time split of the schedule (forward, head, backward, optimizer). The peer, OpenNMT-py 3.5.1
with the same model and batches, is measured next to ours by python -m benchmarks.peers.opennmt_peer (its
own virtual environment); when WORK/opennmt_peer.json exists, its numbers are printed beside these (from
that run, not this one). To WORK/throughput.json.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks import results as records
from benchmarks.common import matmul_peak, prepare_enja
from benchmarks.scaling import goals, layouts, throughput

DEFAULT_STEPS = {"layouts": 40, "throughput": 60}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/hybrid-nmt-bench"))
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default: 40; --throughput 60)")
    p.add_argument("--precision", choices=("both", "bf16", "fp32"), default="both")
    p.add_argument("--only", nargs="*", default=None, help="run names to keep (default: all)")
    p.add_argument("--rounds", type=int, default=1, help="repeat every run, interleaved; report the median")
    p.add_argument("--model", choices=tuple(layouts.MODELS), default="small", help="small: emb/hidden 256; wide: 1024")
    p.add_argument("--lstm-kernel", choices=("fused", "stepwise", "both"), default="fused")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--goals", action="store_true", help="the scaling goals against the ceiling: both models and precisions, "
                      "fixed runs (--model, --only, --precision, --lstm-kernel, --steps are not used)")
    mode.add_argument("--throughput", action="store_true", help="one process alone, fp32 and bf16, with the "
                      "per-part split (--threads threads; --steps, --work only)")
    p.add_argument("--report-only", action="store_true", help="with --goals: measure nothing, report the runs of "
                   "WORK/scaling_goals.json again (after a change to the report)")
    p.add_argument("--threads", type=int, default=2, help="--throughput: the process's threads")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        if not args.goals:
            p.error("--report-only goes with --goals")
        report_again(args.work)
        return
    data = prepare_enja(args.work)
    if args.throughput:
        throughput.run(args.work, data, args.steps or DEFAULT_STEPS["throughput"], args.threads)
        return
    peak = matmul_peak(args.work)
    pngs = args.work / "scaling"
    pngs.mkdir(exist_ok=True)
    if args.goals:  # the report after every round, so that an interrupted run keeps what it measured
        def write(results: dict, done: int) -> None:
            out = goals.report(results, done, args.work / "opennmt_peer.json")
            (args.work / "scaling_goals.json").write_text(json.dumps({"peak": peak, **out, "results": results},
                                                                     indent=1))
        measured = goals.measure(args.work, data, layouts.MODELS, args.rounds, pngs, on_round=write)
        records.write(goals.to_records(measured, records.command("benchmarks.scaling")))
        return
    layouts.run(args, args.steps or DEFAULT_STEPS["layouts"], data, peak, pngs)


def report_again(work: Path) -> None:
    """--goals --report-only: the report of WORK/scaling_goals.json's runs (still in WORK/runs) again, rewritten."""
    path = work / "scaling_goals.json"
    if not path.exists():
        raise SystemExit(f"--report-only: no {path}: run python -m benchmarks.scaling --goals --work {work} first")
    saved = json.loads(path.read_text())
    results = goals.from_json(saved["results"])
    rounds = min(len(rs) for precs in results.values() for rows in precs.values() for rs in rows.values())
    out = goals.report(results, rounds, work / "opennmt_peer.json")
    path.write_text(json.dumps({"peak": saved["peak"], **out, "results": results}, indent=1))


if __name__ == "__main__":
    main()

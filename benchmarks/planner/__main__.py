"""Is the layout planner right? On this machine, on a GPU, and what it predicts for GPUs: one command each.

    python -m benchmarks.planner validate [--work /tmp/hybrid-nmt-bench] [--profile FILE] [--steps 30]
                                          [--precision bf16 fp32] [--only LABEL ...] [--rounds 1] [--rescore]
    python -m benchmarks.planner predict  [--work /tmp/hybrid-nmt-bench] [--profile h200]
                                          [--devices 1 2 4 8] [--links nvlink pcie] [--scenarios ...] [--steps 16]
    python -m benchmarks.planner validate-gpu --from DIR [--gpudata .gpudata] [--profile h200] [--work ...]
    python -m benchmarks.planner gpu-prices --from DIR --out FILE [--gpudata .gpudata] [--work ...]
    python -m benchmarks.planner auto-check [--work ...] [--steps 30] [--model small wide] [--precision bf16 fp32]
                                            [--rounds 1]

`validate`: predicted against measured step time on this machine, side by side.
1. calibrates this machine (`python launch/plan.py --calibrate --config trainer/configs/enja_small.yaml
   --out WORK/cpu_profile.json`) unless --profile names a profile already measured here;
2. trains enja-small (64 pairs per step) through the real CLI in each layout: single with 1 and 2
   threads, data_2, pipeline_2 and hybrid_2 (1 thread per rank) with 1/2/4 pipeline units and 1/2/4
   time chunks, hybrid_2 with head_schedule per_unit; in bf16 and fp32;
3. predicts each run's step time with the planner (trainer.planner.plan.predict) on exactly the
   batches the run trained on (the steps after the 3 warm-up steps) and prints predicted vs
   measured mean step time and the error, then per rank the measured and predicted ms per step of
   each instruction type (RUN_DIR/timing/rank*.json vs the simulation) for rows off by more than 10%.
   Beside it, the median over the steps of each step's error (the same batch predicted and measured): a
   row whose mean is off but whose steps are not lost its mean to a few slow steps (this machine's noise),
   not to the planner's prices. With --rounds R every run is trained R times, interleaved (round 2 of a
   row after round 1 of every row): the error is against the median round's mean step, each round's error
   beside it (a row whose rounds straddle the prediction is this machine's noise), and the per-step error
   against each step's median over the rounds.
Writes everything to WORK/plan_validation.json. Numbers taken on a busy machine mean nothing: the
load average is printed before and after. `--rescore` trains nothing: it predicts the runs an earlier
validate left in WORK/runs again, with WORK/cpu_profile.json (or --profile), after a change to the planner.

`predict`: the planner's prediction for the paper-size model on GPUs (the paper's RQ3: how to split the model). trainer/configs/paper_size.yaml (emb/hidden 1024, 4+4 LSTM layers, general attention) with batches
of 128 pairs (ds_configs/single.json's optimizer and bf16, train_micro_batch_size_per_gpu 128), on real
batches of small_parallel_enja prepared with one joint 32k BPE vocabulary (both embeddings and the
softmax have 32,000 rows; the corpus supports at most ~17k/21k pieces per side alone). For each number
of GPUs and link of the profile (default: the shipped trainer/planner/profiles/h200.json): the speed-up
over one GPU of the best hybrid, data and pipeline layout on all N of them, and the planner's pick (which
may leave some GPUs out) (`python launch/plan.py --config trainer/configs/paper_size.yaml --devices N
--profile PROFILE --link LINK --deepspeed_config WORK/paper_128.json data.dir=...` prints each full
ranking). To WORK/plan_predict.json. Scenarios (--scenarios):

    shipped     the config as it is (dropout 0.2): the layout-invariant dropout masks are drawn on the
                device for the whole global micro-batch (trainer/model/dropout.py), a few elementwise passes per site
    no_dropout  model.dropout=0: the model's own work
    patent_len  no dropout, every pair's source and target repeated 4 times (~30 source and ~46 target
                pieces, about a patent sentence; small_parallel_enja's are 8.3 and 12.2 with this
                vocabulary): more GPU work per launched op and more LSTM time steps
    fast_host   patent_len with every host price of the profile x 0.2 (what capturing the step in CUDA graphs
                or compiling it would approach: the launches replayed, not dispatched)

`validate-gpu`: every training run of a GPU check's output directory (DIR: gpu_check.json, runs.tar.gz) predicted
against its measured steady-state ms per step, worst last (benchmarks/planner/gpu_validation.py), to
WORK/validate_gpu_NAME.json. `gpu-prices`: a GPU's planner profile priced from a check's files
(benchmarks/planner/gpu_prices.py says which file sets which price and which runs calibrate);
trainer/planner/profiles/h200.json is `gpu-prices --from benchmarks/results/gpu/2026-12-04-v2`. Both read the data
the check trained on: small_parallel_enja prepared as the check prepares it (--gpudata: `python -m
benchmarks.gpu.gpu_check --prepare-only --work .gpudata --corpus ../shared/data/small_parallel_enja`).

`auto-check`: parallel_layout auto's choice trained against every shipped 2-rank layout on this CPU, both widths and
precisions (benchmarks/planner/auto_check.py), to WORK/auto_check.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks import results as records
from benchmarks.common import ENJA, REPO, ds_variant, metrics, prepare_enja, rank_skew, summarise, train
from data_prep.dataformat import MANIFEST
from trainer.artifacts.run_dir import DS_CONFIG, METRICS

VALIDATE_CONFIG = "trainer/configs/enja_small.yaml"
PREDICT_CONFIG = "trainer/configs/paper_size.yaml"
WARMUP = 3  # as common.summarise
SCENARIOS = {"shipped": (0.2, 1, None), "no_dropout": (0.0, 1, None), "patent_len": (0.0, 4, None),
             "fast_host": (0.0, 4, 0.2)}  # dropout, sentence repeats, factor on every host price


# ---- validate: predicted against measured on this machine ----
def validation_rows() -> list[tuple[str, str, int, int, dict]]:
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


def validate(args: argparse.Namespace) -> None:
    config = VALIDATE_CONFIG
    if not args.rescore:
        print(f"load average at start: {os.getloadavg()}", flush=True)
    data = prepare_enja(args.work)
    profile_path = args.profile or args.work / "cpu_profile.json"
    if args.rescore and not profile_path.exists():
        sys.exit(f"--rescore: no {profile_path}: run validate without --rescore first (or name a --profile)")
    if args.profile is None and not args.rescore:
        if profile_path.exists():
            profile_path.unlink()  # ours, from an earlier run of this script
        subprocess.run([sys.executable, "launch/plan.py", "--calibrate", "--config", config, "--out", str(profile_path),
                        f"data.dir={data}"], cwd=REPO, check=True)

    from trainer.config import load_config
    from trainer.parallel.deepspeed_json import load_ds_config
    from trainer.parallel.layout import LayoutSpec
    from trainer.planner import plan
    from trainer.planner.candidates import Candidate
    from trainer.planner.profile import load

    profile = load(str(profile_path))
    cfg = load_config(str(REPO / config), [f"data.dir={data}"])
    rows = [(precision, *row) for precision in args.precision for row in validation_rows()
            if not args.only or any(row[0].startswith(o) for o in args.only)]
    runs = measure_rows(args, rows, data, config)
    results = []
    for precision, label, base, ranks, threads, layout in rows:
        done = runs[(precision, label)]
        run_dir = done[0][0]
        steps = max(r["step"] for r in metrics(run_dir))
        ds = load_ds_config(str(run_dir / DS_CONFIG), steps)  # what the runs trained with
        spec = LayoutSpec.from_ds_config(ds, ranks)
        work = plan.workload(cfg, ds, steps=steps - WARMUP, skip=WARMUP)
        pred = plan.predict(Candidate(spec, ranks, threads), work, profile)
        row = validation_row(precision, label, 1000 * pred.step_s, pred, done)
        results.append(row)
        print(f"{precision} {label:28s} measured {row['measured_ms']:7.1f} ms  predicted {row['predicted_ms']:7.1f} ms  "
              f"error {100 * row['error']:+5.1f}%  per-step median {100 * row['step_error_median']:+5.1f}%"
              + (f"  by round {', '.join(f'{100 * e:+.1f}%' for e in row['errors_by_round'])}" if len(done) > 1 else ""),
              flush=True)
    load_end = None if args.rescore else os.getloadavg()
    if not args.rescore:
        print(f"\nload average at end: {load_end}")
    validation_report(results)
    out = args.work / ("plan_rescore.json" if args.rescore else "plan_validation.json")
    out.write_text(json.dumps({"profile": str(profile_path), "load_end": load_end, "rescored": args.rescore,
                               "rounds": max(len(v) for v in runs.values()), "rows": results}, indent=1))
    records.write(validation_records(results, args, max(len(v) for v in runs.values())))


def measure_rows(args: argparse.Namespace, rows: list, data: Path, config: str) -> dict:
    """(precision, label) -> [(run_dir, summary)] by round: each row trained (or, with --rescore, read back)."""
    runs: dict = {}
    rounds = args.rounds
    if args.rescore:  # as many rounds as an earlier validate left
        rounds = 1
        while any(run_name(prec, row[0], rounds, args.work).exists() for prec, *row in rows):
            rounds += 1
    for rnd in range(rounds):  # interleaved: a row's round 2 runs after every row's round 1 (the machine's drift spreads)
        for precision, label, base, ranks, threads, layout in rows:
            run_dir = run_name(precision, label, rnd, args.work)
            if args.rescore:
                if not (run_dir / METRICS).exists():
                    if rnd == 0:
                        sys.exit(f"--rescore: no run {run_dir} (run validate without --rescore first)")
                    continue
                measured = summarise(run_dir)
            else:
                ds_path = ds_variant(args.work, base, run_dir.name, layout=layout,
                                     bf16={"enabled": precision == "bf16"})
                measured = train(args.work, run_dir.name, ds_path, ranks, threads, args.steps, data, config=config)
            runs.setdefault((precision, label), []).append((run_dir, measured))
            print(f"round {rnd + 1}: {precision} {label:28s} measured {measured['step_ms_mean']:7.1f} ms", flush=True)
    return runs


def validation_records(results: list[dict], args: argparse.Namespace, rounds: int) -> list[dict]:
    """Each row's predicted and measured step as a record, and the rows within 10% as one more."""
    command = records.command("benchmarks.planner")
    out = [records.record("planner", "validation", command=command, settings={
        "precision": r["precision"], "layout": r["label"], "model": "enja-small", "pairs_per_step": 64},
        figures={"measured_step_ms": r["measured_ms"], "predicted_step_ms": r["predicted_ms"],
                 "error_pct": 100 * r["error"], "step_error_median_pct": 100 * r["step_error_median"],
                 "errors_by_round_pct": [100 * e for e in r["errors_by_round"]]},
        note=miss_cause(r) if abs(r["error"]) > 0.10 else None) for r in results]
    within = lambda key: sum(abs(r[key]) <= 0.10 for r in results)  # noqa: E731
    settings = {"model": "enja-small", "rows": len(results), "rounds": rounds, **({"rescored": True} if args.rescore else {})}
    return out + [records.record("planner", "validation summary", command=command, settings=settings, figures={
        "rows_within_10_pct": within("error"), "rows_within_10_pct_per_step_median": within("step_error_median")})]


def run_name(precision: str, label: str, rnd: int, work: Path) -> Path:
    """A validate run's directory: round 1 keeps the name of runs from before --rounds (so --rescore reads them)."""
    name = f"val_{precision}_{label}".replace(" ", "_")
    return work / "runs" / (name if rnd == 0 else f"{name}_r{rnd + 1}")


def validation_row(precision: str, label: str, predicted_ms: float, pred, done: list) -> dict:
    """One row from the prediction and the row's runs (one per round, the same batches): the error against the
    median round's mean step, each round's error beside it, and the per-step error against each step's median
    over the rounds."""
    means = [m["step_ms_mean"] for _, m in done]
    mid = sorted(range(len(done)), key=lambda i: means[i])[len(done) // 2]
    run_dir, measured = done[mid]
    per_step = [metrics(d) for d, _ in done]
    step_times = [statistics.median(col) for col in zip(*([r["step_time_s"] for r in rows if r["step"] > WARMUP]
                                                          for rows in per_step))]
    return {"precision": precision, "label": label, "measured_ms": measured["step_ms_mean"],
            "measured_median_ms": measured["step_ms_median"], "predicted_ms": predicted_ms,
            "error": predicted_ms / measured["step_ms_mean"] - 1,
            "errors_by_round": [predicted_ms / m - 1 for m in means],
            "step_error_median": step_error_median(pred.steps_s, [{"step": WARMUP + 1 + i, "step_time_s": t}
                                                                 for i, t in enumerate(step_times)]),
            "run_dir": str(run_dir), "measured_ops": measured["timing"], "predicted_ops": pred.op_seconds,
            "predicted_fractions": pred.fractions, "skew": rank_skew(metrics(run_dir), WARMUP)}


def step_error_median(predicted_s: list, rows: list[dict]) -> float:
    """The median over the steps after the warm-up of predicted / measured - 1, step by step (the same batch):
    a few slow steps (noise) move a mean, not this."""
    measured = [r["step_time_s"] for r in rows if r["step"] > WARMUP]
    if len(measured) != len(predicted_s):
        raise ValueError(f"{len(predicted_s)} predicted steps against {len(measured)} measured after the warm-up")
    return statistics.median(p / m - 1 for p, m in zip(predicted_s, measured))


def miss_cause(r: dict) -> str:
    """One line naming why a row misses: a round within 10%, or rounds on both sides of the price, make it this
    machine's spread between runs of the same layout on the same batches (each round's error said); otherwise the
    instruction type whose measured ms per step is farthest from its price on any rank, against the step's gap."""
    rounds = r.get("errors_by_round") or []
    if len(rounds) > 1 and (min(abs(e) for e in rounds) <= 0.10 or min(rounds) < 0 < max(rounds)):
        return ("the machine's spread: its rounds " + " / ".join(f"{100 * e:+.1f}%" for e in rounds) +
                f", {100 * (max(rounds) - min(rounds)):.0f} points apart, " +
                ("one within 10%" if min(abs(e) for e in rounds) <= 0.10 else "on both sides of the price"))
    gaps = [(_priced(r, rank).get(op, 0) - measured.get(op, 0), op, rank)
            for rank, measured in (r.get("measured_ops") or {}).items() for op in set(measured) | set(_priced(r, rank))]
    if not gaps:
        return "its runs kept no time by instruction (RUN_DIR/timing): not known"
    gap, op, rank = max(gaps, key=lambda g: abs(g[0]))
    priced = _priced(r, rank).get(op, 0)
    where = "one rank" if len(r["measured_ops"]) == 1 else f"rank {rank} of {len(r['measured_ops'])}, beside the other"
    slow = lambda ms: f"{abs(ms):.1f} ms too {'slow' if ms > 0 else 'fast'}"  # noqa: E731
    return (f"{op} on {where}: {1000 * (priced - gap):.1f} ms measured, priced {slow(1000 * gap)} (the step: "
            f"{slow(r['predicted_ms'] - r['measured_ms'])}); its rounds " +
            " / ".join(f"{100 * e:+.1f}%" for e in rounds))


def _priced(r: dict, rank) -> dict:
    """A row's predicted seconds per step by instruction type on `rank` (int keys in memory, str keys once saved)."""
    ops = r["predicted_ops"]
    return ops.get(int(rank)) or ops.get(str(rank)) or {}


def validation_report(results: list[dict]) -> None:
    """The table of predicted against measured, and the instruction types of the rows off by more than 10%."""
    print("\n| precision | run | measured ms/step | predicted ms/step | error | per-step median error | by round |")
    print("|---|---|---:|---:|---:|---:|---|")
    for r in results:
        flag = "" if abs(r["error"]) <= 0.10 else " **"
        each = r.get("step_error_median")
        by_round = " / ".join(f"{100 * e:+.1f}%" for e in r.get("errors_by_round", []))
        print(f"| {r['precision']} | {r['label']} | {r['measured_ms']:.1f} | {r['predicted_ms']:.1f} | "
              f"{100 * r['error']:+.1f}%{flag} | {'-' if each is None else f'{100 * each:+.1f}%'} | {by_round or '-'} |")
    within = sum(abs(r["error"]) <= 0.10 for r in results)
    steps_within = sum(r.get("step_error_median") is not None and abs(r["step_error_median"]) <= 0.10
                       for r in results)
    print(f"\n{within} of {len(results)} rows within 10% (mean step); {steps_within} of {len(results)} by the "
          f"per-step median")
    off = [r for r in results if abs(r["error"]) > 0.10]
    if off:
        print("\nwhy each row is off by more than 10% (its rounds, then the instruction whose price misses most):")
        for r in off:
            print(f"  {r['precision']} {r['label']}: {miss_cause(r)}")
        print("\nrows off by more than 10%: ms per step by instruction type, measured / predicted, per rank")
        for r in off:
            for rank, measured_ops in sorted(r["measured_ops"].items()):
                predicted_ops = r["predicted_ops"].get(int(rank), {})
                cells = ", ".join(f"{op} {1000 * measured_ops.get(op, 0):.1f}/{1000 * predicted_ops.get(op, 0):.1f}"
                                  for op in sorted(set(measured_ops) | set(predicted_ops))
                                  if max(measured_ops.get(op, 0), predicted_ops.get(op, 0)) > 5e-4)
                print(f"  {r['precision']} {r['label']} rank {rank}: {cells}")
            if r.get("skew"):
                k = r["skew"]
                print(f"  {r['precision']} {r['label']} step by step: busy differs by {k['busy_diff_ms']:.1f} ms between "
                      f"the ranks; communicating + waiting {' / '.join(f'{v:.1f}' for v in k['comm_wait_ms'])} ms, "
                      f"the step's least of them {k['comm_wait_least_ms']:.1f}")


# ---- predict: the paper-size model on GPUs ----
def prepare_joint32k(work: Path) -> Path:
    data = work / "enja32k_joint"
    if (data / MANIFEST).exists():
        return data
    args = ["--format", "moses", "--out", data, "--vocab-size", "32000", "--model-type", "bpe", "--joint-vocab"]
    for split in ("train", "dev", "test"):
        args += [f"--{split}-src", ENJA / f"{split}.en", f"--{split}-tgt", ENJA / f"{split}.ja"]
    subprocess.run([sys.executable, "-m", "data_prep.prepare", *map(str, args)], cwd=REPO, check=True)
    return data


def stretch(batch, times: int):
    """The batch with every source and target sentence repeated `times` times (EOS/BOS re-added)."""
    import numpy as np

    from data_prep.binary import PAD_ID
    from trainer.data import collate

    if times == 1:
        return batch
    src = [batch.src[i, :int(batch.src_lengths[i]) - 1].numpy() for i in range(batch.size)]
    tgt = [batch.tgt_out[i][batch.tgt_out[i] != PAD_ID][:-1].numpy() for i in range(batch.size)]
    return collate([np.tile(x, times) for x in src], [np.tile(y, times) for y in tgt])


def predict(args: argparse.Namespace) -> None:
    data = prepare_joint32k(args.work)
    ds_path = ds_variant(args.work, "single", "paper_128", train_micro_batch_size_per_gpu=128)

    from trainer.config import load_config
    from trainer.parallel.deepspeed_json import load_ds_config
    from trainer.planner import plan
    from trainer.planner.profile import load, provenance, resolve

    ds = load_ds_config(str(ds_path), 1000)
    profile_path, rows = resolve(args.profile), []
    for scenario in args.scenarios:
        dropout, repeats, host = SCENARIOS[scenario]
        profile = load(profile_path)
        if host is not None:
            from benchmarks.planner.gpu_prices import HOST

            for key in (k for k in (*HOST, "op_overhead_us") if k in profile["roofline"]):
                value = profile["roofline"][key]["value"] * host
                profile["roofline"][key] = {"value": value, "source": f"scenario {scenario}"}
        cfg = load_config(str(REPO / PREDICT_CONFIG), [f"data.dir={data}", f"model.dropout={dropout}"])
        work = plan.workload(cfg, ds, args.steps)
        work.windows = [[stretch(b, repeats) for b in window] for window in work.windows]
        for link in args.links:
            for n in args.devices:
                rows.append(prediction_row(plan.rank_layouts(work, profile, n, link), scenario, link, n))
                print(json.dumps(rows[-1]), flush=True)
    print(f"\nprofile {profile_path}; {PREDICT_CONFIG}, 128 pairs per step, bf16, {args.steps} real steps of {data}")
    print(provenance(load(profile_path)) + ("; fast_host multiplies every host price by an assumed 0.2"
                                            if "fast_host" in args.scenarios else ""))
    print("| scenario | link | GPUs | predicted one GPU ms/step | predicted speed-up: hybrid | data | pipeline | "
          "planner picks | its predicted ms/step |")
    print("|---|---|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        cell = lambda m: f"{r[m + '_speedup']:.2f}x" if m + "_speedup" in r else "-"  # noqa: E731
        print(f"| {r['scenario']} | {r['link']} | {r['devices']} | {r['one_gpu_ms']:.1f} | {cell('hybrid')} | "
              f"{cell('data')} | {cell('pipeline')} | {r['pick']} | {r['pick_ms']:.1f} |")
    (args.work / "plan_predict.json").write_text(json.dumps(rows, indent=1))
    records.write([records.record(
        "planner", "prediction", command=records.command("benchmarks.planner"), prediction=True,
        machine_name=load(profile_path).get("device", {}).get("name") or str(args.profile), settings={
            "model": "paper-size", "scenario": r["scenario"], "link": r["link"], "devices": r["devices"],
            "pairs_per_step": 128, "precision": "bf16", "profile": str(args.profile)},
        figures={"one_gpu_step_ms": r["one_gpu_ms"], "pick": r["pick"], "pick_step_ms": r["pick_ms"]},
        ratios={f"{m}_speedup": r[f"{m}_speedup"] for m in ("hybrid", "data", "pipeline") if f"{m}_speedup" in r})
        for r in rows])


def prediction_row(ranking, scenario: str, link: str, n: int) -> dict:
    """One row of the table: one GPU, the planner's pick, and the best of each mode on all `n` GPUs."""
    from trainer.planner import plan

    ranked, one, _ = ranking
    best = plan.best_by_mode(ranked, n)
    pick = ranked[0]
    return {"scenario": scenario, "link": link, "devices": n, "one_gpu_ms": 1000 * one.step_s,
            "one_gpu_tokens_per_s": one.tokens_per_s,
            "pick": pick.candidate.label() + (f" ({pick.candidate.ranks} GPUs)" if pick.candidate.ranks < n else ""),
            "pick_ms": 1000 * pick.step_s, "pick_speedup": pick.speedup,
            **{f"{m}_speedup": best[m].speedup for m in best}, **{f"{m}_layout": best[m].candidate.label() for m in best}}


def validate_gpu(args: argparse.Namespace) -> None:
    from benchmarks.planner.gpu_validation import validate_gpu as run

    run(args.check_dir, args.gpudata, args.work, args.profile, record=args.record)


def gpu_prices(args: argparse.Namespace) -> None:
    from benchmarks.planner.gpu_prices import calibrated_profile

    if args.out.exists():
        sys.exit(f"--out {args.out}: exists; choose another path (never overwritten)")
    profile, found = calibrated_profile(args.check_dir, args.gpudata, args.work / args.check_dir.name)
    args.out.write_text(json.dumps(profile, indent=1) + "\n")
    print(json.dumps(found, indent=1))
    print(f"wrote {args.out}")


def auto_check(args: argparse.Namespace) -> None:
    from benchmarks.planner.auto_check import auto_check as run

    run(args)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.planner", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    both = argparse.ArgumentParser(add_help=False)
    both.add_argument("--work", type=Path, default=Path("/tmp/hybrid-nmt-bench"))
    sub = p.add_subparsers(dest="question", required=True)
    v = sub.add_parser("validate", parents=[both], help="predicted against measured step time on this machine")
    v.add_argument("--profile", type=Path, default=None, help="a profile measured on this machine (else calibrate)")
    v.add_argument("--steps", type=int, default=30)
    v.add_argument("--precision", nargs="+", choices=("bf16", "fp32"), default=["bf16", "fp32"])
    v.add_argument("--only", nargs="*", default=None, help="run only rows whose label starts with one of these")
    v.add_argument("--rounds", type=int, default=1, help="train every row this many times, interleaved; the error "
                   "is against the median round's step, each round's beside it")
    v.add_argument("--rescore", action="store_true", help="train nothing: predict WORK/runs' earlier validate runs "
                   "again (after a change to the planner), to WORK/plan_rescore.json")
    g = sub.add_parser("predict", parents=[both], help="the paper-size model on 1-8 GPUs of a GPU profile")
    g.add_argument("--profile", default="h200", help="a GPU profile: a file, or a shipped one's name "
                   "(trainer/planner/profiles/NAME.json)")
    g.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
    g.add_argument("--links", nargs="+", default=["nvlink", "pcie"])
    g.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    g.add_argument("--steps", type=int, default=16)
    for name, what in (("validate-gpu", "a GPU check's runs predicted against what they measured"),
                       ("gpu-prices", "a GPU's planner profile priced from a GPU check's files")):
        c = sub.add_parser(name, parents=[both], help=what)
        c.add_argument("--from", dest="check_dir", type=Path, required=True, help="a GPU check's output directory")
        c.add_argument("--gpudata", type=Path, default=REPO / ".gpudata",
                       help="the check's prepared data (gpu_check --prepare-only --work DIR)")
        if name == "validate-gpu":
            c.add_argument("--profile", default="h200", help="the GPU profile to predict with (a file or shipped name)")
            c.add_argument("--record", action="store_true", help="append each run's prediction to "
                           "benchmarks/results/planner.jsonl (its table in docs/BENCHMARKS.md)")
        else:
            c.add_argument("--out", type=Path, required=True, help="the planner profile to write (never overwritten)")
    a = sub.add_parser("auto-check", parents=[both], help="parallel_layout auto against the shipped layouts here")
    a.add_argument("--steps", type=int, default=30)
    a.add_argument("--model", nargs="+", choices=("small", "wide"), default=["small", "wide"])
    a.add_argument("--precision", nargs="+", choices=("bf16", "fp32"), default=["bf16", "fp32"])
    a.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    if getattr(args, "rounds", 1) < 1:
        p.error(f"--rounds {args.rounds}: at least 1")
    args.work.mkdir(parents=True, exist_ok=True)
    {"validate": validate, "predict": predict, "validate-gpu": validate_gpu, "gpu-prices": gpu_prices,
     "auto-check": auto_check}[args.question](args)


if __name__ == "__main__":
    main()

"""Each rank's CPU work per step against one process's: the fixed costs a layout cannot divide.

    python -m benchmarks.scaling.rank_cpu [--work /tmp/hybrid-nmt-bench] [--steps 40] [--rounds 2]
                                          [--precision bf16 fp32] [--layouts data_2 hybrid_2] [--extra K=V ...]

enja-small (64 pairs per step, ds_configs/single.json, data_2.json, hybrid_2.json as shipped), 1 thread per rank,
through the real CLI (benchmarks/common.py::train), the runs of a round one after another: one process, then each
layout on 2 ranks. For every rank, the CPU ms per step of its main and autograd threads after the warm-up
(RUN_DIR/timing/rank*.json, trainer/observe/cpu_threads.py) as a fraction of one process's: a rank that does
half the work is 0.5; the goal of the device-paced issue is at most 0.6 for every rank of hybrid_2 and data_2, in
bf16 and in fp32. CPU time, not wall time: what a rank computes, not what it waits for (a rank's waits show in its
wall ms, printed beside). With --rounds R every run is repeated R times, interleaved, and the median round is
reported. Prints a table and writes WORK/rank_cpu.json.

Each round also measures a floor, `half_batch_pair`: two single processes of
half the batch each (a data_2 replica's rows), 1 thread each, started together (benchmarks/scaling/goals.py's
half-batch ceiling). Their CPU ms per step against one process's is what halving the batch gives on this machine
when two processes share it (caches, memory bandwidth) and each still updates the whole model (its optimizer step
and per-step costs do not halve): the floor of a layout whose every rank holds the whole model (data_2 without
ZeRO). A rank above it pays that much for the layout's own costs (its gradient sums, its waits); a layout that
shards the optimizer or the model (ZeRO-1, the hybrid's stages) can go below it.

The floor is split in two by `half_batch_alone`, one such half-batch process run alone: its fraction is the work of a
step that does not halve with the batch (the optimizer, the per-call costs); the pair's fraction less it is what two
processes on the machine at once cost each other (shared cache and memory bandwidth are the candidates; this
command does not measure which).
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks import results as records
from benchmarks.common import ds_variant, prepare_enja, train
from benchmarks.scaling.goals import ceiling, half_batch

GOAL = 0.6
FLOOR = "half_batch_pair"
ALONE = "half_batch_alone"  # one half-batch process alone: the floor without the machine's sharing
# --layouts beyond the shipped JSONs: (base JSON, its top-level changes)
VARIANTS = {"data_2_zero1": ("data_2", {"zero_optimization": {"stage": 1}}),
            "hybrid_2_zero1": ("hybrid_2", {"zero_optimization": {"stage": 1}})}


def rank_cpu(summary: dict) -> dict[int, float]:
    """rank -> its main + autograd threads' CPU ms per step (a run's summarise()['cpu'])."""
    return {int(rank): sum(v for k, v in threads.items() if k == "main" or k.startswith("pt_autograd"))
            for rank, threads in summary["cpu"].items()}


def one_round(work: Path, data: Path, steps: int, precisions: list, layouts: list, extra: tuple,
              floor: bool = True) -> dict:
    out = {}
    for precision in precisions:
        bf16 = {"enabled": precision == "bf16"}
        runs = {"single": (ds_variant(work, "single", f"rank_cpu_single_{precision}", bf16=bf16), 1)}
        for name in layouts:
            base, changes = VARIANTS.get(name, (name, {}))
            runs[name] = (ds_variant(work, base, f"rank_cpu_{name}_{precision}", bf16=bf16, **changes), 2)
        for name, (ds, ranks) in runs.items():
            s = train(work, f"rank_cpu_{name}_{precision}", ds, ranks, 1, steps, data, extra=extra)
            out[f"{name} {precision}"] = {"cpu_ms": rank_cpu(s), "wall_ms": s["step_ms_mean"],
                                          "pairs_per_s": s["pairs_per_s"]}
            if name == "single" and floor:
                half = ds_variant(work, "single", f"rank_cpu_{FLOOR}_{precision}", bf16=bf16,
                                  train_micro_batch_size_per_gpu=half_batch("single"))
                pair = ceiling(work, f"rank_cpu_{FLOOR}_{precision}", half, steps, data,
                               "trainer/configs/enja_small.yaml", extra)
                out[f"{FLOOR} {precision}"] = {"cpu_ms": {i: rank_cpu(r)[0] for i, r in enumerate(pair["each"])},
                                               "wall_ms": statistics.mean(r["step_ms_mean"] for r in pair["each"]),
                                               "pairs_per_s": pair["pairs_per_s"]}
                alone = train(work, f"rank_cpu_{ALONE}_{precision}", half, 1, 1, steps, data, extra=extra)
                out[f"{ALONE} {precision}"] = {"cpu_ms": rank_cpu(alone), "wall_ms": alone["step_ms_mean"],
                                               "pairs_per_s": alone["pairs_per_s"]}
    return out


def fractions(result: dict) -> dict:
    """Each layout's ranks' CPU ms as fractions of the same precision's single of the same round (a median
    round's entry carries its own round's, `of_single`: the runs' median rounds differ)."""
    table = {}
    for key, r in result.items():
        if "of_single" in r:
            table[key] = r["of_single"]
            continue
        name, precision = key.rsplit(" ", 1)
        base = result[f"single {precision}"]["cpu_ms"][0]
        table[key] = {rank: round(ms / base, 3) for rank, ms in r["cpu_ms"].items()}
    return table


def median_round(rounds: list[dict]) -> dict:
    """Per run, the round whose ranks' worst fraction is the median, with its fractions of that round's single."""
    fr = [fractions(r) for r in rounds]
    out = {}
    for key in rounds[0]:
        order = sorted(range(len(rounds)), key=lambda i: (max(fr[i][key].values()), rounds[i][key]["cpu_ms"][0]))
        pick = order[len(order) // 2]
        out[key] = {**rounds[pick][key], "of_single": fr[pick][key], "round": pick + 1,
                    "fractions_by_round": [fr[i][key] for i in range(len(fr))]}
    return out


def from_json(rounds: list[dict]) -> list[dict]:
    """WORK/rank_cpu.json's rounds with their ranks as numbers again."""
    return [{key: {**r, "cpu_ms": {int(k): v for k, v in r["cpu_ms"].items()}} for key, r in rnd.items()}
            for rnd in rounds]


def report(result: dict, cpu: str, steps: int) -> None:
    fr = fractions(result)
    print(f"{cpu}; enja-small, 64 pairs per step, 1 thread per rank, {steps} steps (CPU ms after the warm-up)")
    print("| run | rank | main + autograd CPU ms per step | of its round's single | wall ms per step | goal (<= 0.6) |")
    print("|---|---:|---:|---:|---:|---|")
    for key, r in result.items():
        for rank, ms in sorted(r["cpu_ms"].items()):
            frac = fr[key][rank]
            goal = ("" if key.startswith("single") else "floor: whole model per rank" if key.startswith(FLOOR)
                    else "the floor alone: a step's work that does not halve" if key.startswith(ALONE)
                    else "met" if frac <= GOAL else "**not met**")
            print(f"| {key} | {rank} | {ms:.1f} | {frac:.2f} | {r['wall_ms']:.1f} | {goal} |")
        if "fractions_by_round" in r:
            print(f"|  | rounds | {r['fractions_by_round']} |  |  |  |")
    for line in above_floor(result):
        print(line)


def above_floor(result: dict) -> list[str]:
    """Per layout, its worst rank's fraction less the same precision's floor (the worse of the pair's two)."""
    fr, lines = fractions(result), []
    for key in result:
        name, precision = key.rsplit(" ", 1)
        floor, alone = fr.get(f"{FLOOR} {precision}"), fr.get(f"{ALONE} {precision}")
        if floor and name == FLOOR and alone:
            pair = max(floor.values())
            lines.append(f"{key}: the floor {pair:.2f} = {alone[0]:.2f} for a half batch alone (a step's work that "
                         f"does not halve) {pair - alone[0]:+.2f} for two processes sharing the machine")
        if floor and name not in ("single", FLOOR, ALONE):
            lines.append(f"{key}: worst rank {max(fr[key].values()):.2f}, the floor {max(floor.values()):.2f} "
                         f"(two half-batch processes at once): {max(fr[key].values()) - max(floor.values()):+.2f} "
                         f"of one process's CPU is the layout's own")
    return lines


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/hybrid-nmt-bench"))
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--precision", nargs="+", default=["bf16", "fp32"], choices=("bf16", "fp32"))
    p.add_argument("--layouts", nargs="+", default=["data_2", "hybrid_2"],
                   help=f"ds_configs/NAME.json, or one of {', '.join(VARIANTS)}")
    p.add_argument("--extra", nargs="*", default=[], help="key=value overrides for every run")
    p.add_argument("--report-only", action="store_true", help="measure nothing: the report and records of "
                   "WORK/rank_cpu.json's rounds again (after a change to the report)")
    p.add_argument("--no-floor", action="store_true", help=f"leave out {FLOOR} (two half-batch single processes at "
                   "once: the floor of a layout whose every rank holds the whole model)")
    args = p.parse_args(argv)
    cpu = records.machine()
    if args.report_only:
        path = args.work / "rank_cpu.json"
        if not path.exists():
            raise SystemExit(f"--report-only: no {path}: run python -m benchmarks.scaling.rank_cpu --work {args.work}")
        saved = json.loads(path.read_text())
        rounds, cpu = from_json(saved["rounds"]), saved["cpu"]
        args.steps, args.extra, args.rounds = saved["steps"], saved["extra"], len(rounds)
    else:
        args.work.mkdir(parents=True, exist_ok=True)
        data = prepare_enja(args.work)
        rounds = [one_round(args.work, data, args.steps, args.precision, args.layouts, tuple(args.extra),
                            floor=not args.no_floor) for _ in range(args.rounds)]
    result = median_round(rounds) if len(rounds) > 1 else rounds[0]
    report(result, cpu, args.steps)
    (args.work / "rank_cpu.json").write_text(json.dumps({"cpu": cpu, "steps": args.steps, "extra": args.extra,
                                                         "result": result, "rounds": rounds}, indent=1))
    worst = {k: max(v.values()) for k, v in fractions(result).items()
             if not k.startswith(("single", FLOOR, ALONE))}
    print(f"worst rank per run: {json.dumps(worst)}; goal met: {all(w <= GOAL for w in worst.values())}")
    records.write(rank_records(result, args))


def rank_records(result: dict, args: argparse.Namespace) -> list[dict]:
    """One record per run (table "rank cpu" of the scaling question): one process's CPU ms per step, or each rank's
    fraction of it."""
    fr, out = fractions(result), []
    for key, r in result.items():
        layout, precision = key.rsplit(" ", 1)
        single = layout == "single"
        settings = {"model": "enja-small", "precision": precision, "layout": layout, "threads": 1, "target": GOAL,
                    "steps": args.steps, "rounds": args.rounds, **({"extra": args.extra} if args.extra else {}),
                    **({"environment": env} if (env := records.environment()) else {})}
        figures = {"wall_ms": round(r["wall_ms"], 1), **({"main_autograd_cpu_ms": round(r["cpu_ms"][0], 1)} if single
                                                          else {})}
        ratios = {} if single else {"rank_cpu_of_one_process": [round(fr[key][k], 2) for k in sorted(fr[key])]}
        out.append(records.record("scaling", "rank cpu", command=records.command("benchmarks.scaling.rank_cpu"),
                                  settings=settings, figures=figures, ratios=ratios))
    return out


if __name__ == "__main__":
    main()

"""Issue 23's goals from one command: `python -m benchmarks.scaling --goals [--rounds 2]`.

Both model sizes, both precisions, every rank with 1 thread, side by side in each round:

    single 1 thread        with each LSTM kernel; the faster one is the baseline of every ratio
    single 2 threads       what a CPU user would run (not a goal)         } with the faster single's kernel,
    data_2, pipeline_2     the strongest alternatives, same global batch  } the strongest baselines
    hybrid_2 units=1, hybrid_2 chunks=4, and the shipped layout              with the model's shipped kernel

The hybrid row of goals 1-2 is the shipped layout (ds_configs/hybrid_2.json for enja-small,
hybrid_2_wide.json for the wide model; its own row "hybrid_2 shipped" unless it is one of the other two);
goal 3 compares the ranks' summed forward + backward + head of 4 chunks with 1 unit (the head split by
sentences in both, so that only the wavefront differs). Ratios are taken within a round and reported as the median round and the spread.
Then, for the shipped hybrid of the median round, where its milliseconds are: each rank's compute against
half of the single step, and its waiting split by where on the timeline it falls (`where_ms`).
"""
from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

from benchmarks.common import REPO, breakdown, cpu_model, ds_variant, train

SHIPPED = {"small": "hybrid_2", "wide": "hybrid_2_wide"}
STEPS = {"small": 40, "wide": 20}  # a wide step costs 1-2.5 s on one core; 10 steps were too noisy
TARGETS = {  # goal: (what, {model: target ratio})
    "1": ("hybrid_2 / single 1 thread", {"wide": 1.7, "small": 1.5}),
    "2a": ("hybrid_2 / data_2", {"wide": 1.2, "small": 1.2}),
    "2b": ("hybrid_2 / pipeline_2 units=4", {"wide": 1.2, "small": 1.2}),
    "3": ("summed fwd+bwd+head, 4 chunks / 1 unit", {"wide": 1.05, "small": 1.05}),
}
HYBRID = {"hybrid_2 units=1": {"micro_batches": 1, "time_chunks": 1},
          "hybrid_2 chunks=4": {"micro_batches": 1, "time_chunks": 4}}
PHASES = ("fill", "forward gaps", "before head", "head to backward", "backward gaps", "drain")


def shipped_kernel(model: str, models: dict) -> str:
    from trainer.config import load_config

    return load_config(str(REPO / models[model])).model.lstm_kernel


def shipped_layout(model: str) -> dict:
    """The shipped hybrid JSON's parallel_layout, less what every hybrid_2 run shares (mode, degrees)."""
    layout = json.loads((REPO / "ds_configs" / f"{SHIPPED[model]}.json").read_text())["parallel_layout"]
    return {"micro_batches": 1, "time_chunks": 1,
            **{k: v for k, v in layout.items() if k not in ("mode", "num_pp", "num_dp")}}


def shipped_row(model: str) -> str:
    """The label of the shipped layout's run: one of HYBRID's, or its own."""
    layout = shipped_layout(model)
    return next((label for label, lay in HYBRID.items() if lay == layout), "hybrid_2 shipped")


def measure(work: Path, data: Path, models: dict, rounds: int, pngs: Path, on_round=None) -> dict:
    """results[model][precision][label] = [summary per round] (common.summarise plus `run_dir`);
    `on_round(results, rounds_done)` after each round."""
    results: dict = {}
    for rnd in range(rounds):
        for model in ("wide", "small"):
            steps, hybrid_kernel = STEPS[model], shipped_kernel(model, models)
            for prec in ("bf16", "fp32"):
                got = results.setdefault(model, {}).setdefault(prec, {})

                def run(label, base, ranks, threads, layout, kernel):
                    name = f"goals_{model}_{prec}_{label.replace(' ', '_').replace('=', '')}"
                    cfg = ds_variant(work, base, name, layout=layout, bf16={"enabled": prec == "bf16"})
                    r = train(work, name, cfg, ranks, threads, steps, data, config=models[model],
                              extra=(f"train.timeline_every={steps - 1}", f"model.lstm_kernel={kernel}"))
                    r.update(run_dir=str(work / "runs" / name), kernel=kernel)
                    png = work / "runs" / name / "timeline" / f"step_{steps - 1:08d}.png"
                    if png.exists():
                        shutil.copy(png, pngs / f"{name}_round{rnd + 1}.png")
                    got.setdefault(label, []).append(r)
                    print(f"[{rnd + 1}/{rounds}] {model} {prec} {label:24s} ({kernel:8s}) "
                          f"{r['step_ms_median']:7.1f} ms/step {r['tokens_per_s']:8.0f} tok/s", flush=True)
                    return r

                singles = {k: run(f"single 1 thread {k}", "single", 1, 1, {}, k) for k in ("fused", "stepwise")}
                best = max(singles, key=lambda k: singles[k]["tokens_per_s"])
                run("single 2 threads", "single", 1, 2, {}, best)
                run("data_2", "data_2", 2, 1, {}, best)
                run("pipeline_2 units=4", "pipeline_2", 2, 1, {"micro_batches": 4}, best)
                for label, layout in HYBRID.items():
                    run(label, "hybrid_2", 2, 1, layout, hybrid_kernel)
                if shipped_row(model) not in HYBRID:
                    run(shipped_row(model), "hybrid_2", 2, 1, shipped_layout(model), hybrid_kernel)
        if on_round is not None:
            on_round(results, rnd + 1)
    return results


def summed_compute(r: dict) -> float:
    """The ranks' summed forward + backward + head ms per step."""
    return sum(breakdown(t)[k] for t in r["timing"].values() for k in ("forward", "backward", "head"))


def round_ratios(rows: dict, rnd: int, model: str) -> dict:
    """Goal -> ratio in round `rnd` (tokens/s ratios; goal 3: a compute ratio, lower is better)."""
    tps = lambda label: rows[label][rnd]["tokens_per_s"]  # noqa: E731
    hybrid = tps(shipped_row(model))
    single = max(tps("single 1 thread fused"), tps("single 1 thread stepwise"))
    return {"1": hybrid / single, "2a": hybrid / tps("data_2"), "2b": hybrid / tps("pipeline_2 units=4"),
            "3": summed_compute(rows["hybrid_2 chunks=4"][rnd]) / summed_compute(rows["hybrid_2 units=1"][rnd])}


def goals_table(results: dict) -> list[dict]:
    """One row per (goal, model, precision): median round, spread, target and whether every round met it
    (goal 3: at most the target; the others: at least)."""
    out = []
    for goal, (what, targets) in TARGETS.items():
        for model, precs in results.items():
            for prec, rows in precs.items():
                rounds = len(rows["hybrid_2 units=1"])
                vals = sorted(round_ratios(rows, i, model)[goal] for i in range(rounds))
                target = targets[model]
                met = all(v <= target for v in vals) if goal == "3" else all(v >= target for v in vals)
                out.append({"goal": goal, "what": what, "model": model, "precision": prec,
                            "median": statistics.median(vals), "min": vals[0], "max": vals[-1],
                            "target": target, "met": met})
    return out


def where_ms(trace: dict) -> dict:
    """Per rank of the newest step in a timeline trace.json: compute ms by op and every other ms of the
    step by where it falls: before the rank's first forward (fill), between forwards, from the last forward
    to the head, from the head to the first backward, between backwards, and after the last backward
    (drain: less the fastest rank's optimizer step, counted as the rank's own optimizer work)."""
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    step = max(e["pid"] for e in spans)
    spans = [e for e in spans if e["pid"] == step]
    wall = max(e["ts"] + e["dur"] for e in spans) - min(e["ts"] for e in spans)
    opt = min(e["dur"] for e in spans if e["name"] == "optimizer_step")
    out, t0 = {}, min(e["ts"] for e in spans)
    for rank in sorted({e["tid"] for e in spans}):
        ev = sorted((e for e in spans if e["tid"] == rank), key=lambda e: e["ts"])
        compute = {n: sum(e["dur"] for e in ev if e["name"] in (n, "weight_grads" if n == "backward" else n))
                   for n in ("forward", "backward", "head")}  # deferred weight gradients count as backward
        first = lambda n: min(e["ts"] for e in ev if e["name"] == n)  # noqa: E731
        last = lambda n: max(e["ts"] + e["dur"] for e in ev if e["name"] == n)  # noqa: E731
        marks = [t0, first("forward"), last("forward"), first("head"), last("head"), first("backward"),
                 max([last("backward"), *(e["ts"] + e["dur"] for e in ev if e["name"] == "weight_grads")]), t0 + wall]
        busy = lambda a, b: sum(max(0.0, min(e["ts"] + e["dur"], b) - max(e["ts"], a))  # noqa: E731
                                for e in ev if e["cat"] == "busy" and e["name"] != "optimizer_step")
        gaps = [(b - a) - busy(a, b) for a, b in zip(marks, marks[1:])]
        row = {k: v / 1000 for k, v in compute.items()}
        row["optimizer"] = opt / 1000
        # gaps between a head's own spans (several units) count as head to backward
        for phase, gap in zip(PHASES, [gaps[0], gaps[1], gaps[2], gaps[3] + gaps[4], gaps[5], gaps[6] - opt]):
            row[phase] = gap / 1000
        row["step"] = wall / 1000
        out[rank] = row
    return out


def report(results: dict, runs_done: int) -> dict:
    """Print the goals table and, for each model, where the shipped hybrid's milliseconds are."""
    table = goals_table(results)
    print(f"\n## Issue 23's goals: {cpu_model()}, 1 thread per rank, {runs_done} round(s); median round "
          f"(min-max)\n")
    print("| goal | model | precision | measured | target | met in every round |")
    print("|---|---|---|---:|---:|---|")
    for g in table:
        sign = "<=" if g["goal"] == "3" else ">="
        print(f"| {g['goal']}. {g['what']} | {g['model']} | {g['precision']} | {g['median']:.2f}x "
              f"({g['min']:.2f}-{g['max']:.2f}) | {sign} {g['target']:.2f}x | {'yes' if g['met'] else '**no**'} |")
    for model, precs in results.items():
        for prec, rows in precs.items():
            print(f"\n{model} {prec}: tokens/s in each round, and over the faster single with 1 thread of that round")
            print("| run | kernel | tokens/s | vs single 1 thread |")
            print("|---|---|---:|---:|")
            singles = [max(rows[f"single 1 thread {k}"][i]["tokens_per_s"] for k in ("fused", "stepwise"))
                       for i in range(len(rows["hybrid_2 units=1"]))]
            for label, rs in rows.items():
                print(f"| {label} | {rs[0]['kernel']} | " + " / ".join(f"{r['tokens_per_s']:.0f}" for r in rs) +
                      " | " + " / ".join(f"{r['tokens_per_s'] / s:.2f}x" for r, s in zip(rs, singles)) + " |")
    wheres = {}
    for model, precs in results.items():
        for prec, rows in precs.items():
            label = shipped_row(model)
            rs = rows[label]
            mid = sorted(range(len(rs)), key=lambda i: rs[i]["step_ms_median"])[len(rs) // 2]
            trace = json.loads((Path(rs[mid]["run_dir"]) / "timeline" / "trace.json").read_text())
            where = where_ms(trace)
            single = min((rows[f"single 1 thread {k}"][mid] for k in ("fused", "stepwise")),
                         key=lambda r: r["step_ms_median"])
            half = {k: v / 2 for k, v in breakdown(single["timing"][min(single["timing"])]).items()}
            wheres[f"{model}_{prec}"] = {"row": label, "round": mid + 1, "ranks": where, "half_single": half}
            print(f"\n{model} {prec}, {label} ({rs[mid]['kernel']}), round {mid + 1}: one step's ms per rank "
                  f"(timeline); half of the faster single step for comparison")
            cols = ("forward", "backward", "head", "optimizer", *PHASES, "step")
            print("| rank | " + " | ".join(cols) + " |")
            print("|---|" + "---:|" * len(cols))
            print("| half of single | " + " | ".join(
                f"{half.get(c if c != 'optimizer' else 'optimizer_step', 0):.0f}" if c in cols[:4] else "-"
                for c in cols[:-1]) + f" | {single['step_ms_median'] / 2:.0f} |")
            for rank, row in where.items():
                print(f"| {rank} | " + " | ".join(f"{row[c]:.0f}" for c in cols) + " |")
    return {"cpu": cpu_model(), "goals": table, "where_ms": wheres}

"""The scaling goals from one command: `python -m benchmarks.scaling --goals [--rounds 2]`.

Both model sizes, both precisions, every rank with 1 thread, side by side in each round:

    single 1 thread        with each LSTM kernel; the faster one is "one alone"
    ceiling                two of the faster single started together, each on its own core: the most any
                           2-rank layout can reach on this machine (their summed throughput)
    ceiling half batch     the same with half the global batch each (a data_2 rank's share of it): what
                           splitting the batch by sentences costs by itself, before any message; data_2 over
                           it is what its runtime (sums, waits) loses beyond that
    single 2 threads       what a CPU user would run (not a goal)         } with the faster single's kernel,
    data_2, pipeline_2     the strongest alternatives, same global batch  } the strongest baselines
    hybrid_2 shipped       ds_configs/hybrid_2.json (enja-small), hybrid_2_wide.json (wide), the model's kernel

Goals, by name, each a ratio of tokens/s within a round, reported as the median round and the spread: "hybrid_2 of
the ceiling" >= 0.9; "data_2 of the ceiling" >= 0.85; "hybrid_2 over data_2" >= 1.2x at the wide model (enja-small:
reported). "ours over OpenNMT-py" (fp32 >= 1.2x OpenNMT-py without input feeding) is measured by
python -m benchmarks.peers.opennmt_peer and printed from WORK/opennmt_peer.json when it is there. For each goal not met: the step the row would need,
and where its milliseconds are (each rank's compute against half of one alone, its waits on the timeline,
and its CPU seconds per thread against the step: trainer/observe/cpu_threads.py).
"""
from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

from benchmarks import results as records
from benchmarks.common import (REPO, breakdown, cpu_model, ds_variant, metrics, rank_skew, replica_lengths,
                               start_train, train, wait_train)
from trainer.artifacts.run_dir import METRICS, TIMELINE_DIR, TIMELINE_TRACE, timeline_png

HALF_ROW = "ceiling half batch"
SHIPPED = {"small": "hybrid_2", "wide": "hybrid_2_wide"}
STEPS = {"small": 40, "wide": 20}  # a wide step costs 1-2.5 s on one core; 10 steps were too noisy
CEILING_TAIL = 3  # the two ceiling runs go on this many steps past the counted ones: both are running throughout
TARGETS = {  # goal: (what, numerator row, denominator row, {model: target ratio or None (reported only)})
    "ceiling": ("two singles at once / one alone", "ceiling", "single", {"wide": None, "small": None}),
    "hybrid_2 of the ceiling": ("hybrid_2 / ceiling", "hybrid", "ceiling", {"wide": 0.9, "small": 0.9}),
    "data_2 of the ceiling": ("data_2 / ceiling", "data_2", "ceiling", {"wide": 0.85, "small": 0.85}),
    "hybrid_2 over data_2": ("hybrid_2 / data_2", "hybrid", "data_2", {"wide": 1.2, "small": None}),
    "half batch": ("two half-batch singles at once / ceiling", HALF_ROW, "ceiling", {"wide": None, "small": None}),
    "data_2 of the half-batch ceiling": ("data_2 / half-batch ceiling", "data_2", HALF_ROW,
                                         {"wide": None, "small": None}),
    "hybrid_2 over pipeline_2": ("hybrid_2 / pipeline_2 units=4", "hybrid", "pipeline_2 units=4",
                                 {"wide": None, "small": None}),
    "hybrid_2 over one process": ("hybrid_2 / single 1 thread", "hybrid", "single", {"wide": None, "small": None}),
}
PHASES = ("fill", "forward gaps", "before head", "head to backward", "backward gaps", "drain")


def shipped_kernel(model: str, models: dict) -> str:
    from trainer.config import load_config

    return load_config(str(REPO / models[model])).model.lstm_kernel


def shipped_layout(model: str) -> dict:
    """The shipped hybrid JSON's parallel_layout, less what every hybrid_2 run shares (mode, degrees)."""
    layout = json.loads((REPO / "ds_configs" / f"{SHIPPED[model]}.json").read_text())["parallel_layout"]
    return {"micro_batches": 1, "time_chunks": 1,
            **{k: v for k, v in layout.items() if k not in ("mode", "num_pp", "num_dp")}}


HYBRID_ROW = "hybrid_2 shipped"


def ceiling(work: Path, name: str, cfg: Path, steps: int, data: Path, config: str, extra: tuple) -> dict:
    """Two single-rank runs of the same config with 1 thread each, started together: their summed
    throughput over the same counted steps (both run CEILING_TAIL steps longer, so neither counts a step
    taken alone). A 2-rank layout's tokens/s over this is the part of the machine it uses."""
    started = [start_train(work, f"{name}_{i}", cfg, 1, 1, steps + CEILING_TAIL, data, config=config,
                           extra=extra) for i in (0, 1)]
    runs = [wait_train(f"{name}_{i}", proc, run_dir, last_step=steps)
            for i, (proc, run_dir) in enumerate(started)]
    return {"tokens_per_s": sum(r["tokens_per_s"] for r in runs), "pairs_per_s": sum(r["pairs_per_s"] for r in runs),
            "step_ms_median": statistics.mean(r["step_ms_median"] for r in runs), "each": runs,
            "timing": runs[0]["timing"], "cpu": runs[0].get("cpu", {})}


def half_batch(base: str) -> int:
    """Half the global micro-batch of ds_configs/BASE.json (a data_2 replica's rows of it)."""
    return json.loads((REPO / "ds_configs" / f"{base}.json").read_text())["train_micro_batch_size_per_gpu"] // 2


def measure(work: Path, data: Path, models: dict, rounds: int, pngs: Path, on_round=None) -> dict:
    """results[model][precision][label] = [summary per round] (common.summarise plus `run_dir`, `kernel`);
    `on_round(results, rounds_done)` after each round."""
    results: dict = {}
    for rnd in range(rounds):
        for model in ("wide", "small"):
            steps, hybrid_kernel = STEPS[model], shipped_kernel(model, models)
            for prec in ("bf16", "fp32"):
                got = results.setdefault(model, {}).setdefault(prec, {})

                def run(label, base, ranks, threads, layout, kernel, pair=False, **ds):
                    name = f"goals_{model}_{prec}_{label.replace(' ', '_').replace('=', '')}"
                    cfg = ds_variant(work, base, name, layout=layout, bf16={"enabled": prec == "bf16"}, **ds)
                    extra = (f"train.timeline_every={steps - 1}", f"model.lstm_kernel={kernel}")
                    if pair:
                        r = ceiling(work, name, cfg, steps, data, models[model], extra)
                    else:
                        r = train(work, name, cfg, ranks, threads, steps, data, config=models[model], extra=extra)
                    r.update(run_dir=str(work / "runs" / (name + ("_0" if pair else ""))), kernel=kernel)
                    png = Path(r["run_dir"]) / TIMELINE_DIR / timeline_png(steps - 1)
                    if png.exists():
                        shutil.copy(png, pngs / f"{name}_round{rnd + 1}.png")
                    got.setdefault(label, []).append(r)
                    print(f"[{rnd + 1}/{rounds}] {model} {prec} {label:24s} ({kernel:8s}) "
                          f"{r['step_ms_median']:7.1f} ms/step {r['tokens_per_s']:8.0f} tok/s", flush=True)
                    return r

                singles = {k: run(f"single 1 thread {k}", "single", 1, 1, {}, k) for k in ("fused", "stepwise")}
                best = max(singles, key=lambda k: singles[k]["tokens_per_s"])
                run("ceiling", "single", 1, 1, {}, best, pair=True)
                run(HALF_ROW, "single", 1, 1, {}, best, pair=True,
                    train_micro_batch_size_per_gpu=half_batch("single"))
                run("single 2 threads", "single", 1, 2, {}, best)
                run("data_2", "data_2", 2, 1, {}, best)
                run("pipeline_2 units=4", "pipeline_2", 2, 1, {"micro_batches": 4}, best)
                run(HYBRID_ROW, "hybrid_2", 2, 1, shipped_layout(model), hybrid_kernel)
        if on_round is not None:
            on_round(results, rnd + 1)
    return results


def from_json(results: dict) -> dict:
    """`measure`'s results as read back from WORK/scaling_goals.json: the ranks of each run's timing and CPU
    tables are ints again (JSON wrote them as strings)."""
    def run(r: dict) -> dict:
        return {**r, **{k: {int(rank): v for rank, v in r[k].items()} for k in ("timing", "cpu") if k in r}}
    return {model: {prec: {label: [run(r) for r in rs] for label, rs in rows.items()} for prec, rows in precs.items()}
            for model, precs in results.items()}


def _single(rows: dict, rnd: int) -> dict:
    """The faster single with 1 thread of round `rnd` ("one alone")."""
    return max((rows[f"single 1 thread {k}"][rnd] for k in ("fused", "stepwise")), key=lambda r: r["tokens_per_s"])


def _row(rows: dict, key: str, rnd: int) -> dict:
    return _single(rows, rnd) if key == "single" else rows[HYBRID_ROW if key == "hybrid" else key][rnd]


def _goals(rows: dict) -> dict:
    """TARGETS whose rows this result has (a result from before the half-batch ceiling lacks its goals)."""
    return {goal: t for goal, t in TARGETS.items() if all(k in ("single", "hybrid") or k in rows for k in t[1:3])}


def round_ratios(rows: dict, rnd: int) -> dict:
    """Goal -> tokens/s ratio in round `rnd`."""
    return {goal: _row(rows, num, rnd)["tokens_per_s"] / _row(rows, den, rnd)["tokens_per_s"]
            for goal, (_, num, den, _) in _goals(rows).items()}


def goals_table(results: dict) -> list[dict]:
    """One row per (goal, model, precision): median round, spread, target (None: reported only) and whether
    every round met it."""
    out = []
    for goal, (what, num, _, targets) in TARGETS.items():
        for model, precs in results.items():
            for prec, rows in precs.items():
                if goal not in _goals(rows):
                    continue
                rounds = len(rows[HYBRID_ROW])
                vals = sorted(round_ratios(rows, i)[goal] for i in range(rounds))
                target = targets[model]
                out.append({"goal": goal, "what": what, "model": model, "precision": prec,
                            "median": statistics.median(vals), "min": vals[0], "max": vals[-1], "target": target,
                            "met": None if target is None else all(v >= target for v in vals)})
    return out


def gap(rows: dict, goal: str, target: float, rnd: int) -> dict:
    """What stands between a goal's row and its target in round `rnd`: the row's step, the step it would
    need (same batches), and the difference, in ms."""
    _, num, den, _ = TARGETS[goal]
    r = _row(rows, num, rnd)
    need = r["tokens_per_s"] * r["step_ms_median"] / (target * _row(rows, den, rnd)["tokens_per_s"])
    return {"row": num, "step_ms": r["step_ms_median"], "needed_ms": need, "gap_ms": r["step_ms_median"] - need}


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


MODEL_NAMES = {"small": "enja-small", "wide": "wide"}  # as the records name them
LAYOUT_NAMES = {HYBRID_ROW: "hybrid_2 (shipped)", "ceiling": "ceiling: two singles at once",
                HALF_ROW: "ceiling: two half-batch singles at once"}


def to_records(results: dict, command: str) -> list[dict]:
    """What a goals run measured, as records: each goal per model and precision (the median round and the spread),
    and each row's median round (tokens/s, pairs/s, ms per step; tokens/s of every round)."""
    out = [records.record("scaling", "goals", command=command, settings={
        "goal": g["goal"], "what": g["what"], "model": MODEL_NAMES[g["model"]], "precision": g["precision"],
        "rounds": len(results[g["model"]][g["precision"]][HYBRID_ROW]), **({"target": g["target"]} if g["target"] else {})},
        figures={}, ratios={"measured": g["median"], "min": g["min"], "max": g["max"]}) for g in goals_table(results)]
    batch = 2 * half_batch("single")
    for model, precs in results.items():
        for prec, rows in precs.items():
            for label, rs in rows.items():
                r = rs[_median_round(rs)]
                settings = {"model": MODEL_NAMES[model], "precision": prec, "layout": LAYOUT_NAMES.get(label, label),
                            "threads": 2 if label == "single 2 threads" else 1, "lstm_kernel": r.get("kernel"),
                            "pairs_per_step": batch // 2 if label == HALF_ROW else batch}
                out.append(records.record("scaling", "runs", command=command, settings=settings, figures={
                    "tokens_per_s": r["tokens_per_s"], "pairs_per_s": r["pairs_per_s"],
                    "step_ms_median": r["step_ms_median"], "tokens_per_s_by_round": [x["tokens_per_s"] for x in rs]}))
    return out


def report(results: dict, runs_done: int, peer_file: Path | None = None) -> dict:
    """Print the goals table, every run's tokens/s against one alone and the ceiling, and for each goal not
    met where the milliseconds and CPU seconds between it and its target are."""
    table = goals_table(results)
    print(f"\n## The goals: {cpu_model()}, 1 thread per rank, {runs_done} round(s); median round (min-max)\n")
    print("| goal | model | precision | measured | target | met in every round |")
    print("|---|---|---|---:|---:|---|")
    for g in table:
        target = "-" if g["target"] is None else f">= {g['target']:.2f}x"
        met = "-" if g["met"] is None else ("yes" if g["met"] else "**no**")
        print(f"| {g['goal']}: {g['what']} | {g['model']} | {g['precision']} | {g['median']:.2f}x "
              f"({g['min']:.2f}-{g['max']:.2f}) | {target} | {met} |")
    for model, precs in results.items():
        for prec, rows in precs.items():
            rounds = range(len(rows[HYBRID_ROW]))
            print(f"\n{model} {prec}: tokens/s in each round, over one alone (the faster single with 1 thread) "
                  f"and over the ceiling of that round")
            print("| run | kernel | tokens/s | vs one alone | of the ceiling |")
            print("|---|---|---:|---:|---:|")
            for label, rs in rows.items():
                per = lambda key: " / ".join(f"{r['tokens_per_s'] / _row(rows, key, i)['tokens_per_s']:.2f}"  # noqa: E731
                                             for i, r in zip(rounds, rs))
                print(f"| {label} | {rs[0]['kernel']} | " + " / ".join(f"{r['tokens_per_s']:.0f}" for r in rs) +
                      f" | {per('single')} | {per('ceiling')} |")
    gaps = {}
    for g in table:
        if g["met"] is False:
            gaps[f"{g['goal']}_{g['model']}_{g['precision']}"] = where(results[g["model"]][g["precision"]], g)
    return {"cpu": cpu_model(), "goals": table, "gaps": gaps, "peer": peer_goal(peer_file)}


PEER_GOAL = "ours over OpenNMT-py"  # ours single fp32 against OpenNMT-py without input feeding, the same threads
PEER_TARGET = 1.2


def peer_goal(path: Path | None) -> dict | None:
    """The goal "ours over OpenNMT-py" from python -m benchmarks.peers.opennmt_peer's WORK/opennmt_peer.json (its own run, side by side with
    OpenNMT-py in its own virtual environment), printed; None when there is none."""
    if path is None or not path.exists():
        print(f"\n{PEER_GOAL} (fp32 >= 1.2x OpenNMT-py): not in this run; python -m benchmarks.peers.opennmt_peer --work WORK "
              "measures it (OpenNMT-py in its own virtual environment), and --goals prints it from there")
        return None
    peer = json.loads(path.read_text())
    runs = peer["runs"]
    ratio = runs["ours single fp32"]["pairs_per_s"] / runs["OpenNMT-py, no input feeding fp32"]["pairs_per_s"]
    out = {"ratio": ratio, "target": PEER_TARGET, "met": ratio >= PEER_TARGET, "cpu": peer.get("cpu"),
           "threads": peer.get("threads"), "busy": peer.get("busy"), "command": peer.get("command")}
    print(f"\n{PEER_GOAL}: ours single fp32 / OpenNMT-py without input feeding = {ratio:.2f}x (target >= {PEER_TARGET}x, "
          f"{'met' if out['met'] else '**not met**'}; {peer.get('threads')} threads, {peer.get('cpu')}, from {path}"
          f"{'; measured on a busy machine' if peer.get('busy') else ''})")
    prof = peer.get("profile")
    if prof and not out["met"]:  # that run's --profile: the milliseconds and the operators that stand between
        ms = prof["goal_ms"]
        more = sorted(prof["groups"].items(), key=lambda kv: kv[1]["peer"] - kv[1]["ours"])[:4]
        print(f"  ours {ms['ours']:.1f} ms per step of 64 pairs, 1.2x needs {ms['needed']:.1f}: "
              f"{ms['ours'] - ms['needed']:.1f} ms stand between; operator groups (self CPU ms per step, ours / "
              f"OpenNMT-py) where ours spends most beyond it: "
              + ", ".join(f"{k} {g['ours']:.1f} / {g['peer']:.1f}" for k, g in more))
        out["stand_between_ms"] = ms["ours"] - ms["needed"]
    return out


def _median_round(rs: list) -> int:
    return sorted(range(len(rs)), key=lambda i: rs[i]["step_ms_median"])[len(rs) // 2]


def where(rows: dict, goal: dict) -> dict:
    """For a goal not met, in its row's median round: the step it would need, each rank's compute and waits on
    the sampled step's timeline against half of one alone (the ceiling's per-rank share, its two runs' mean
    step) and against one of the half-batch ceiling's runs where the result has them, and each rank's CPU ms
    per step by thread against the step's wall time."""
    _, num, _, _ = TARGETS[goal["goal"]]
    label = HYBRID_ROW if num == "hybrid" else num
    rnd = _median_round(rows[label])
    r, ceil = rows[label][rnd], rows["ceiling"][rnd]
    g = gap(rows, goal["goal"], goal["target"], rnd)
    half = {k: v / 2 for k, v in breakdown(ceil["timing"][min(ceil["timing"])]).items()}
    print(f"\n{goal['model']} {goal['precision']}, {goal['goal']} ({goal['what']} >= {goal['target']}): "
          f"{label} round {rnd + 1} steps {g['step_ms']:.0f} ms, needs {g['needed_ms']:.0f} ms: "
          f"{g['gap_ms']:.0f} ms stand between. Per rank (ms per step; 'share' = half of one ceiling run's step, "
          f"{ceil['step_ms_median'] / 2:.0f} ms):")
    trace = Path(r["run_dir"]) / TIMELINE_DIR / TIMELINE_TRACE
    spans = where_ms(json.loads(trace.read_text())) if trace.exists() else {}
    cols = ("forward", "backward", "head", "optimizer", *PHASES, "step")
    print("| rank | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    def reference(name: str, ms: dict, step_ms: float) -> None:  # compute by op; no timeline phases
        print(f"| {name} | " + " | ".join(f"{ms.get('optimizer_step' if c == 'optimizer' else c, 0):.0f}"
                                         if c in cols[:4] else "-" for c in cols[:-1]) + f" | {step_ms:.0f} |")

    reference("share", half, ceil["step_ms_median"] / 2)
    halved = rows[HALF_ROW][rnd] if HALF_ROW in rows else None
    if halved is not None:  # one of the two half-batch runs: what half the batch costs one core beside another
        reference("half-batch run", breakdown(halved["timing"][min(halved["timing"])]), halved["step_ms_median"])
    for rank, row in spans.items():
        print(f"| {rank} | " + " | ".join(f"{row[c]:.0f}" for c in cols) + " |")
    skew = rank_skew(metrics(Path(r["run_dir"]))) if (Path(r["run_dir"]) / METRICS).exists() else None
    if skew:  # every step, not the sampled one: what the ranks lose to each other's step-to-step differences
        print(f"Step by step ({label}'s steps after the warm-up): the ranks' busy ms differ by {skew['busy_diff_ms']:.0f} "
              f"on average; communicating + waiting {' / '.join(f'{v:.0f}' for v in skew['comm_wait_ms'])} ms "
              f"(rank 0 / 1 / ...), the step's least of them {skew['comm_wait_least_ms']:.0f} (what the transfers "
              f"themselves take, about; the rest is one rank waiting for the other)")
    shapes = replica_lengths(Path(r["run_dir"])) if skew else None
    if shapes:  # data_2: what each replica was handed, replayed from the run's own batches
        print(f"The replicas' slices, step by step: padded target positions "
              f"{' / '.join(f'{v:.1f}' for v in shapes['tgt_positions'])}, source positions "
              f"{' / '.join(f'{v:.1f}' for v in shapes['src_positions'])}, rows "
              f"{' / '.join(f'{v:.0f}' for v in shapes['rows'])}, real tokens "
              f"{' / '.join(f'{v:.0f}' for v in shapes['tokens'])} (replica 0 / 1 / ...)"
              + (f"; rank 1's busy ms minus rank 0's, {shapes['busy_diff_mean_ms']:.0f} on average, follows rank 1's "
                 f"extra target positions (correlation {shapes['corr']:.2f}, {shapes['ms_per_position']:.1f} ms per "
                 f"position)" if "corr" in shapes else ""))
    cpu = {"ceiling run": ceil.get("cpu", {}).get(0, {}), **{f"rank {k}": v for k, v in r.get("cpu", {}).items()}}
    if any(cpu.values()):
        print(f"CPU ms per step by thread (wall: {label} {g['step_ms']:.0f} ms, a ceiling run "
              f"{ceil['step_ms_median']:.0f} ms):")
        for who, threads in cpu.items():
            top = sorted(threads.items(), key=lambda kv: -kv[1])
            print(f"  {who}: total {sum(threads.values()):.0f}; " +
                  ", ".join(f"{name} {ms:.1f}" for name, ms in top[:6] if ms >= 0.1))
    return {**g, "round": rnd + 1, "ranks": spans, "share": half, "cpu": cpu, "skew": skew,
            "half_batch_step_ms": None if halved is None else halved["step_ms_median"]}

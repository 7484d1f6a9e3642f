"""Where the hybrid's milliseconds go: its ranks' CPU time, operator by operator, against one process.

    python -m benchmarks.micro.cpu_accounting [--work /tmp/hybrid-nmt-bench] [--precision bf16|fp32] [--steps 40]
                                        [--rounds 1]

enja-small, 64 pairs per step, trained through the real CLI with `train.profile_steps` (torch.profiler
over steps 15-34 of 40; trainer/observe/profiling.py) in three settings, run one after another:

    single        one process, 1 thread: the work of a step
    single x2     two such processes at once: what a process pays when another one shares the machine
                  (caches, memory, the cores' clocks), with no parallelism and no communication
    hybrid_2      hybrid_2 as shipped (1 unit), 1 thread per rank: the same batches split over two ranks

It prints, per setting, the median wall ms per step and the self CPU ms per step of every rank, then the
operators with the largest excess of the hybrid's two ranks together over single, and how much of that
excess single x2 shows too (sharing the machine) and how much is the hybrid's own (the head on half
batches, its replica, communication, assembling and splitting the top outputs). A 2-rank layout can beat
one process on both cores only if its two ranks' CPU time together, divided by two and plus its waits,
is below that process's step. `--rounds N` repeats all three settings, interleaved, and reports the
median of the totals (the per-operator table is from the last round).
"""
from __future__ import annotations

import argparse
import json
from statistics import mean, median
import sys
from pathlib import Path

from benchmarks.common import ds_variant, prepare_enja, rank_fractions, start_train, wait_train
from trainer.artifacts.run_dir import PROFILE_DIR

PROFILE = ("train.profile_from=14", "train.profile_steps=20")


def profiles(run_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((run_dir / PROFILE_DIR).glob("rank*.json"))]


def finish(label: str, started: tuple) -> dict:
    out = wait_train(label, *started)
    run = started[1]
    out.update(profiles=profiles(run), fractions=rank_fractions(run)["ranks"])
    return out


def one_round(work: Path, precision: str, steps: int, data: Path) -> dict:
    bf16 = {"enabled": precision == "bf16"}
    single = ds_variant(work, "single", f"acct_{precision}_single", bf16=bf16)
    hybrid = ds_variant(work, "hybrid_2", f"acct_{precision}_hybrid_2", bf16=bf16,
                        layout={"micro_batches": 1, "time_chunks": 1})
    def start(name, ds, ranks):
        return start_train(work, f"acct_{precision}_{name}", ds, ranks, 1, steps, data, extra=PROFILE)

    res = {"single": finish("single", start("single", single, 1))}
    pair = [start(f"pair{i}", single, 1) for i in (0, 1)]
    res["single x2"] = [finish(f"single x2 ({i})", p) for i, p in enumerate(pair)]
    res["hybrid_2"] = finish("hybrid_2", start("hybrid_2", hybrid, 2))
    return res


def op_ms(profile: dict) -> dict:
    return {k: v["self_ms"] for k, v in profile["ops"].items()}


def report(precision: str, rounds: list[dict], top: int) -> dict:
    single = median(r["single"]["profiles"][0]["self_cpu_ms_per_step"] for r in rounds)
    shared = median(mean(p["profiles"][0]["self_cpu_ms_per_step"] for p in r["single x2"]) for r in rounds)
    ranks = [median(r["hybrid_2"]["profiles"][k]["self_cpu_ms_per_step"] for r in rounds) for k in (0, 1)]
    walls = {"single": median(r["single"]["step_ms_median"] for r in rounds),
             "single x2": median(r["single x2"][0]["step_ms_median"] for r in rounds),
             "hybrid_2": median(r["hybrid_2"]["step_ms_median"] for r in rounds)}
    last = rounds[-1]
    print(f"\n| {precision}, 1 thread per process | median step (ms) | self CPU ms per step | vs single |")
    print("|---|---:|---:|---:|")
    print(f"| single | {walls['single']:.1f} | {single:.1f} | 1.00x |")
    print(f"| single x2 (each of two at once) | {walls['single x2']:.1f} | {shared:.1f} | {shared / single:.2f}x |")
    print(f"| hybrid_2, rank 0 + rank 1 | {walls['hybrid_2']:.1f} | {ranks[0]:.1f} + {ranks[1]:.1f} = "
          f"{sum(ranks):.1f} | {sum(ranks) / single:.2f}x |")
    fr = last["hybrid_2"]["fractions"]
    for k in (0, 1):
        print(f"\nhybrid_2 rank {k}: busy {fr[k]['busy']:.2f}, waiting {fr[k]['waiting']:.2f}, "
              f"communicating {fr[k]['communicating']:.2f}, idle {fr[k]['idle']:.2f} of the step", end="")
    print()
    s = op_ms(last["single"]["profiles"][0])
    x2 = [op_ms(p["profiles"][0]) for p in last["single x2"]]
    h = [op_ms(p) for p in last["hybrid_2"]["profiles"]]
    names = set(s) | set(h[0]) | set(h[1])
    rows = []
    for n in names:
        hyb = h[0].get(n, 0.0) + h[1].get(n, 0.0)
        sharing = mean(x.get(n, 0.0) for x in x2) - s.get(n, 0.0)
        rows.append((hyb - s.get(n, 0.0), n, s.get(n, 0.0), h[0].get(n, 0.0), h[1].get(n, 0.0), sharing))
    rows.sort(reverse=True)
    print(f"\n| operator ({precision}, ms per step) | single | hybrid rank 0 | rank 1 | excess (r0 + r1 - single) "
          f"| of it, sharing the machine (single x2 - single) |")
    print("|---|---:|---:|---:|---:|---:|")
    for ex, n, sv, r0, r1, sh in rows[:top]:
        print(f"| {n[:48]} | {sv:.2f} | {r0:.2f} | {r1:.2f} | {ex:+.2f} | {sh:+.2f} |")
    total_sharing = shared - single
    print(f"| **all operators** | {single:.1f} | {ranks[0]:.1f} | {ranks[1]:.1f} | {sum(ranks) - single:+.1f} | "
          f"{total_sharing:+.1f} |")
    return {"single_cpu_ms": single, "shared_cpu_ms": shared, "hybrid_cpu_ms": ranks, "wall_ms": walls,
            "ops": [dict(zip(("excess", "op", "single", "rank0", "rank1", "sharing"), r)) for r in rows[:top]]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/hybrid-nmt-bench"))
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--top", type=int, default=16, help="operators listed")
    args = p.parse_args(argv)
    if args.steps < 35:
        sys.exit("--steps must be at least 35 (the profile covers steps 15-34)")
    args.work.mkdir(parents=True, exist_ok=True)
    data = prepare_enja(args.work)
    rounds = [one_round(args.work, args.precision, args.steps, data) for _ in range(args.rounds)]
    out = report(args.precision, rounds, args.top)
    (args.work / f"cpu_accounting_{args.precision}.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

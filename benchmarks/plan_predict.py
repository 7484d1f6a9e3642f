"""The planner's prediction for the paper-size model on GPUs (issue 10: RQ3, how to split the model).

    python benchmarks/plan_predict.py [--work /tmp/hybrid-nmt-bench] [--profile benchmarks/profiles/h200.json]
                                      [--devices 1 2 4 8] [--links nvlink pcie] [--scenarios ...] [--steps 16]

trainer/configs/paper_size.yaml (emb/hidden 1024, 4+4 LSTM layers, general attention) with batches of
128 pairs (ds_configs/single.json's optimizer and bf16, train_micro_batch_size_per_gpu 128), on real
batches of small_parallel_enja prepared with one joint 32k BPE vocabulary (both embeddings and the
softmax have 32,000 rows; the corpus supports at most ~17k/21k pieces per side alone). For each number
of GPUs and link of the profile: the speed-up over one GPU of the best hybrid, data and pipeline
layout on all N of them, and the planner's pick (which may leave some GPUs out) (`python launch/plan.py --config trainer/configs/paper_size.yaml
--devices N --profile PROFILE --link LINK --deepspeed_config WORK/paper_128.json data.dir=...` prints
each full ranking). Scenarios (--scenarios):

    shipped     the config as it is (dropout 0.2): the layout-invariant dropout masks are drawn on the
                device for the whole global micro-batch (trainer/model/dropout.py), a few elementwise passes per site
    no_dropout  model.dropout=0: the model's own work
    patent_len  no dropout, every pair's source and target repeated 4 times (~30 source and ~46 target
                pieces, about a patent sentence; small_parallel_enja's are 8.3 and 12.2 with this
                vocabulary): more GPU work per launched op and more LSTM time steps
    fast_host   patent_len with 1 us of host time per launched op instead of the profile's 5 (what
                capturing the step in a CUDA graph or compiling it would approach)
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


import numpy as np

from common import ENJA, REPO, ds_variant

CONFIG = "trainer/configs/paper_size.yaml"


def prepare_joint32k(work: Path) -> Path:
    data = work / "enja32k_joint"
    if (data / "manifest.json").exists():
        return data
    args = ["--format", "moses", "--out", data, "--vocab-size", "32000", "--model-type", "bpe", "--joint-vocab"]
    for split in ("train", "dev", "test"):
        args += [f"--{split}-src", ENJA / f"{split}.en", f"--{split}-tgt", ENJA / f"{split}.ja"]
    subprocess.run([sys.executable, "-m", "data_prep.prepare", *map(str, args)], cwd=REPO, check=True)
    return data


SCENARIOS = {"shipped": (0.2, 1, None), "no_dropout": (0.0, 1, None), "patent_len": (0.0, 4, None),
             "fast_host": (0.0, 4, 1.0)}  # dropout, sentence repeats, host us per op


def stretch(batch, times: int):
    """The batch with every source and target sentence repeated `times` times (EOS/BOS re-added)."""
    from trainer.data import collate
    from data_prep.binary import PAD_ID

    if times == 1:
        return batch
    src = [batch.src[i, :int(batch.src_lengths[i]) - 1].numpy() for i in range(batch.size)]
    tgt = [batch.tgt_out[i][batch.tgt_out[i] != PAD_ID][:-1].numpy() for i in range(batch.size)]
    return collate([np.tile(x, times) for x in src], [np.tile(y, times) for y in tgt])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/hybrid-nmt-bench"))
    p.add_argument("--profile", default=str(REPO / "benchmarks" / "profiles" / "h200.json"))
    p.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--links", nargs="+", default=["nvlink", "pcie"])
    p.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    p.add_argument("--steps", type=int, default=16)
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    data = prepare_joint32k(args.work)
    ds_path = ds_variant(args.work, "single", "paper_128", train_micro_batch_size_per_gpu=128)

    from trainer.config import load_config
    from trainer.ds_config import load_ds_config
    from trainer.planner import plan
    from trainer.planner.profile import load

    ds = load_ds_config(str(ds_path), 1000)
    rows = []
    for scenario in args.scenarios:
        dropout, repeats, host_us = SCENARIOS[scenario]
        profile = load(args.profile)
        if host_us is not None:
            profile["roofline"]["op_overhead_us"] = {"value": host_us, "source": f"scenario {scenario}"}
        cfg = load_config(str(REPO / CONFIG), [f"data.dir={data}", f"model.dropout={dropout}"])
        work = plan.workload(cfg, ds, args.steps)
        work.windows = [[stretch(b, repeats) for b in window] for window in work.windows]
        for link in args.links:
            for n in args.devices:
                ranked, one, _ = plan.rank_layouts(work, profile, n, link)
                best = plan.best_by_mode(ranked, n)
                row = {"scenario": scenario, "link": link, "devices": n, "one_gpu_ms": 1000 * one.step_s,
                       "one_gpu_tokens_per_s": one.tokens_per_s, "pick": ranked[0].candidate.label() + (f" ({ranked[0].candidate.ranks} GPUs)"
                                                               if ranked[0].candidate.ranks < n else ""),
                       "pick_ms": 1000 * ranked[0].step_s, "pick_speedup": ranked[0].speedup,
                       **{f"{m}_speedup": best[m].speedup for m in best}, **{f"{m}_layout": best[m].candidate.label()
                                                                             for m in best}}
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\nprofile {args.profile}; {CONFIG}, 128 pairs per step, bf16, {args.steps} real steps of {data}")
    print("| scenario | link | GPUs | one GPU ms/step | hybrid | data | pipeline | planner picks | its ms/step |")
    print("|---|---|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        cell = lambda m: f"{r[m + '_speedup']:.2f}x" if m + "_speedup" in r else "-"  # noqa: E731
        print(f"| {r['scenario']} | {r['link']} | {r['devices']} | {r['one_gpu_ms']:.1f} | {cell('hybrid')} | "
              f"{cell('data')} | {cell('pipeline')} | {r['pick']} | {r['pick_ms']:.1f} |")
    (args.work / "plan_predict.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

"""How closely a run resumed in another layout continues the loss (docs/RELIABILITY.md).

For each (from, to) pair: train `from` for steps 1-4 (its step-4 checkpoint), resume it with `to` for
steps 5-8, and compare every logged loss with an uninterrupted `single` run of 8 steps on the same
batches (fp32, dropout 0, Adam with warm-up and decay over a fixed 8 steps, 4 pair layers so hybrid_4
fits). Also the same-layout resume of each layout, with dropout on, which must be bitwise.

    python -m benchmarks.reliability.resume_layouts [--work DIR] [--steps 8]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


from benchmarks.common import REPO, free_port, metrics

LAYOUTS = {
    "single": (1, {"mode": "single", "num_pp": 1, "num_dp": 1}),
    "data_2": (2, {"mode": "data", "num_pp": 1, "num_dp": 2}),
    "hybrid_2": (2, {"mode": "hybrid", "num_pp": 2, "num_dp": 1, "micro_batches": 2, "time_chunks": 1}),
    "hybrid_4": (4, {"mode": "hybrid", "num_pp": 4, "num_dp": 1, "micro_batches": 2, "time_chunks": 1}),
}
PAIRS = [("hybrid_2", "single"), ("single", "hybrid_2"), ("hybrid_4", "hybrid_2"), ("hybrid_2", "hybrid_4"),
         ("single", "hybrid_4"), ("data_2", "hybrid_2")]


def ds_config(work: Path, name: str, steps: int) -> Path:
    ranks, layout = LAYOUTS[name]
    cfg = json.loads((REPO / "ds_configs" / "single.json").read_text())
    dp = layout["num_dp"]
    cfg.update(train_micro_batch_size_per_gpu=16 // dp, bf16={"enabled": False}, parallel_layout=layout)
    cfg["scheduler"]["params"].update(total_num_steps=steps, warmup_num_steps=2)
    path = work / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return path


def run(work: Path, data: Path, run_dir: Path, layout: str, steps: int, *extra, faults: str = "") -> None:
    from trainer.config import merge_overrides  # a later key=value replaces an earlier one: one key, one value

    ranks, _ = LAYOUTS[layout]
    args = ["launch/train.py", "--deepspeed_config", str(ds_config(work, layout, steps)), f"data.dir={data}",
            f"run.dir={run_dir}", "model.layers=4", "model.emb_dim=32", "model.hidden=32", "train.seed=7",
            f"train.max_steps={steps}", "train.eval_every=1000", "train.save_every=4", "train.log_every=1",
            "data.min_batch_sentences=8", "decode.dev_max_sentences=8", "logging.wandb_mode=disabled",
            "logging.progress=false"]
    args = merge_overrides(args, extra)
    cmd = [sys.executable, *args] if ranks == 1 else [sys.executable, "-m", "deepspeed.launcher.runner",
                                                      "--num_gpus", str(ranks), "--master_port", str(free_port()), *args]
    env = {"HNMT_FAULTS": faults, "WANDB_MODE": "disabled"} if faults else {"WANDB_MODE": "disabled"}
    subprocess.run(cmd, cwd=REPO, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=900)


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in metrics(run_dir)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default=None, help="work directory (default: a temporary one)")
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="resume-layouts-"))
    work.mkdir(parents=True, exist_ok=True)
    text = work / "text"
    subprocess.run([sys.executable, "-m", "data_prep.demo_corpus", "--out", str(text), "--pairs", "2000",
                    "--dev", "40", "--test", "40", "--seed", "3"], cwd=REPO, check=True, capture_output=True)
    data = work / "data"
    subprocess.run([sys.executable, "-m", "data_prep.prepare", "--format", "moses", "--train-src",
                    str(text / "train.en"), "--train-tgt", str(text / "train.ja"), "--dev-src", str(text / "dev.en"),
                    "--dev-tgt", str(text / "dev.ja"), "--out", str(data), "--vocab-size", "500",
                    "--model-type", "bpe"], cwd=REPO, check=True, capture_output=True)
    half, steps = args.steps // 2, args.steps
    rows = []
    ref = losses(_fresh(work / "ref_single", lambda d: run(work, data, d, "single", steps, "model.dropout=0")))
    for a, b in PAIRS:
        d = work / f"{a}_to_{b}"
        shutil.rmtree(d, ignore_errors=True)
        run(work, data, d, a, steps, "model.dropout=0", faults=f"die@{half + 1}:0")
        run(work, data, d, b, steps, "model.dropout=0", "train.resume=auto")
        got = losses(d)
        rows.append((f"{a} -> {b}", max(abs(got[s] - ref[s]) for s in ref if s > half),
                     max(abs(got[s] - ref[s]) for s in ref if s <= half)))
    for name in LAYOUTS:  # same layout, dropout on: bitwise
        r, d = work / f"{name}_ref", work / f"{name}_resumed"
        _fresh(r, lambda x: run(work, data, x, name, steps, "model.dropout=0.3"))
        shutil.rmtree(d, ignore_errors=True)
        run(work, data, d, name, steps, "model.dropout=0.3", faults=f"die@{half + 1}:0")
        run(work, data, d, name, steps, "model.dropout=0.3", "train.resume=auto")
        a, b = losses(r), losses(d)
        rows.append((f"{name} -> {name} (dropout 0.3, vs itself)", max(abs(a[s] - b[s]) for s in a if s > half), 0.0))
    print(f"| resume | max abs loss diff, steps {half + 1}-{steps} (after resume) | before resume |")
    print("|---|---|---|")
    for label, after, before in rows:
        print(f"| {label} | {after:.3g} | {before:.3g} |")
    (work / "resume_layouts.json").write_text(json.dumps(rows, indent=1))


def _fresh(d: Path, fn) -> Path:
    shutil.rmtree(d, ignore_errors=True)
    fn(d)
    return d


if __name__ == "__main__":
    main()

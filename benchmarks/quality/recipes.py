"""Optimizer recipe comparison on enja-small, and the raw-Japanese BLEU row, in a fixed STEP budget.

    python -m benchmarks.quality.recipes [--work /tmp/hybrid-nmt-bench] [--steps 3000] [--eval-every 500] [--jobs 3]
                                 [--only NAME ...]

Three single-rank runs of trainer/configs/enja_small.yaml (bf16, 1 thread each, the same seed, batches
and number of optimizer steps; a step budget, not a time budget, so other jobs on the machine cannot
bias the comparison):

  transformer_adam  the shipped recipe (ds_configs/single.json): Adam lr 2e-3, betas (0.9, 0.98),
                    eps 1e-9, clipping 1.0, 100 warm-up steps then linear decay to 0 at --steps
  lstm_adam         the usual LSTM NMT recipe (OpenNMT-py's RNN defaults): Adam lr 1e-3, betas
                    (0.9, 0.999), eps 1e-8, clipping 5.0, constant learning rate
  raw_transformer   the shipped recipe on small_parallel_enja with the spaces removed from the
                    Japanese side (benchmarks/common.py::raw_enja), as real patent text comes
  raw_unigram       the same with a unigram SentencePiece model (8k) instead of BPE (8k): on text
                    without spaces BPE merges across word boundaries
  raw_words         raw_transformer with the Japanese pieces bounded by MeCab's words
                    (`prepare --pretokenize auto`; the other rows: none)

Dev BLEU (greedy, all 500 dev sentences, every --eval-every steps) is scored with the tokenizer the
trainer picks for Japanese (ja-mecab). Each run's best checkpoint is then evaluated on the 500 test
sentences with beam 5 (launch/evaluate.py): ja-mecab BLEU and chrF against the references it was trained
on; the spaced runs also with 13a (the tokenizer of the earlier BLEU rows) and, with the spaces removed
from hypothesis and reference, with ja-mecab on raw text: the number comparable with raw_transformer.
Runs already complete in WORK/runs/recipe_* are not trained again. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import ENJA, REPO, ds_variant, metrics, prepare_enja, raw_enja
from trainer.artifacts.run_dir import TEST_HYP
from trainer.metrics import score

LSTM_OPTIMIZER = {"type": "Adam", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0,
                                             "torch_adam": True, "adam_w_mode": False, "fused": True}}


def _variants(work: Path, steps: int) -> dict[str, Path]:
    base = json.loads((REPO / "ds_configs" / "single.json").read_text())
    shipped = {**base["scheduler"], "params": {**base["scheduler"]["params"], "total_num_steps": steps}}
    bf16 = {"enabled": True}  # as documented (the shipped JSON's "auto" would follow the CPU)
    return {"transformer": ds_variant(work, "single", "recipe_transformer", scheduler=shipped, bf16=bf16),
            "lstm": ds_variant(work, "single", "recipe_lstm", optimizer=LSTM_OPTIMIZER, gradient_clipping=5.0,
                               scheduler=None, bf16=bf16)}


def _command(ds: Path, data: Path, run_dir: Path, steps: int, eval_every: int) -> list[str]:
    return [sys.executable, "launch/train.py", "--deepspeed_config", str(ds), "--config",
            "trainer/configs/enja_small.yaml", f"data.dir={data}", f"run.dir={run_dir}", f"train.max_steps={steps}",
            f"train.eval_every={eval_every}", "train.keep_last=2", "train.threads=1", "decode.dev_max_sentences=500",
            "logging.wandb_mode=disabled", "logging.progress=false"]


def _done(run_dir: Path, steps: int) -> bool:
    from trainer.artifacts.run_dir import CKPT_DIR
    from trainer.checkpoint.files import step_name

    return (run_dir / CKPT_DIR / step_name(steps)).is_dir()


def _train_all(runs: dict, steps: int, eval_every: int, jobs: int) -> None:
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1")
    todo = [(name, cmd) for name, (cmd, run_dir) in runs.items() if not _done(run_dir, steps)]
    running: list[tuple[str, subprocess.Popen, float]] = []
    while todo or running:
        while todo and len(running) < jobs:
            name, cmd = todo.pop(0)
            run_dir = runs[name][1]
            subprocess.run(["rm", "-rf", str(run_dir)], check=True)
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            log = open(run_dir.parent / f"{run_dir.name}.log", "w")
            print(f"train {name}: {' '.join(cmd)}", file=sys.stderr, flush=True)
            running.append((name, subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT),
                            time.time()))
        time.sleep(5)
        for item in list(running):
            name, proc, started = item
            if proc.poll() is not None:
                running.remove(item)
                if proc.returncode != 0:
                    sys.exit(f"{name} failed ({proc.returncode}); see {runs[name][1].parent}/{runs[name][1].name}.log")
                print(f"train {name}: done in {(time.time() - started) / 60:.1f} min", file=sys.stderr, flush=True)


def _evaluate(run_dir: Path, ref: Path, out: Path) -> dict:
    proc = subprocess.run([sys.executable, "launch/evaluate.py", "--run", str(run_dir), "--src", str(ENJA / "test.en"),
                           "--ref", str(ref), "--output", str(out), "--json"], cwd=REPO, check=True,
                          capture_output=True, text=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/hybrid-nmt-bench"))
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--jobs", type=int, default=3, help="runs trained at the same time (1 thread each)")
    p.add_argument("--only", nargs="*", default=None, help="run names to train and evaluate (default: all)")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    data = {"spaced": lambda: prepare_enja(args.work), "raw": lambda: prepare_enja(args.work, raw_ja=True),
            "raw_unigram": lambda: prepare_enja(args.work, raw_ja=True, model_type="unigram"),
            "raw_words": lambda: prepare_enja(args.work, raw_ja=True, pretokenize="auto")}
    ds = _variants(args.work, args.steps)
    runs_dir = args.work / "runs"
    wanted = {"transformer_adam": ("transformer", "spaced"), "lstm_adam": ("lstm", "spaced"),
              "raw_transformer": ("transformer", "raw"), "raw_unigram": ("transformer", "raw_unigram"),
              "raw_words": ("transformer", "raw_words")}
    plan = {name: (ds[recipe], data[corpus]()) for name, (recipe, corpus) in wanted.items()
            if not args.only or name in args.only}
    runs = {name: (_command(cfg, data, runs_dir / f"recipe_{name}", args.steps, args.eval_every),
                   runs_dir / f"recipe_{name}") for name, (cfg, data) in plan.items()}
    _train_all(runs, args.steps, args.eval_every, args.jobs)
    raw_ref = raw_enja(args.work, "test").read_text(encoding="utf-8").splitlines()
    spaced_ref = (ENJA / "test.ja").read_text(encoding="utf-8").splitlines()
    result = {"steps": args.steps}
    for name, (_, run_dir) in runs.items():
        rows = metrics(run_dir)
        dev = {r["step"]: (round(r["dev_bleu"], 2), round(r["dev_chrf"], 2)) for r in rows if "dev_bleu" in r}
        is_raw = name.startswith("raw")
        test = _evaluate(run_dir, raw_enja(args.work, "test") if is_raw else ENJA / "test.ja", run_dir / TEST_HYP)
        entry = {"dev_bleu_chrf": dev, "best_dev_bleu": max(b for b, _ in dev.values()),
                 "test": {k: test[k] for k in ("bleu", "chrf", "signature")}}
        if not is_raw:
            hyps = (run_dir / TEST_HYP).read_text(encoding="utf-8").splitlines()
            entry["test_13a"] = round(score(hyps, spaced_ref, "13a").bleu, 2)
            despaced = score([h.replace(" ", "") for h in hyps], raw_ref, "ja-mecab")
            entry["test_raw_ja_mecab"] = {"bleu": round(despaced.bleu, 2), "chrf": round(despaced.chrf, 2)}
        result[name] = entry
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

"""enja-small test BLEU in a CPU time budget, and BLEU parity of single vs hybrid_2.

    python -m benchmarks.quality.bleu [--work /tmp/hybrid-nmt-bench] [--minutes 15] [--steps 6000] [--compare-step 5000]

1. single (the shipped ds_configs/single.json, bf16, 2 threads) trains enja-small for at most
   `--steps` optimizer steps or `--minutes` of wall time, whichever comes first, validating every 1000
   steps; its best checkpoint (by dev BLEU) is evaluated on the test set.
2. hybrid_2 (ds_configs/hybrid_2.json, 2 ranks x 1 thread) trains the same number of steps with the
   same seed, batches and LR schedule (both JSONs get scheduler.total_num_steps = --steps).
3. Both runs' checkpoints at `--compare-step` (a multiple of 1000 that both reached) are evaluated on the
   test set: same step, same data, same schedule.
Prints one JSON object; the runs stay under WORK/runs/bleu_{single,hybrid2}.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks import results as records
from benchmarks.common import ENJA, REPO, ds_variant, metrics, prepare_enja


def _train(cmd_prefix: list[str], cfg: Path, data: Path, run_dir: Path, steps: int, extra: list[str]) -> None:
    from trainer.config import merge_overrides  # a later key=value replaces an earlier one: one key, one value

    subprocess.run(merge_overrides([*cmd_prefix, "launch/train.py", "--deepspeed_config", str(cfg), "--config",
                    "trainer/configs/enja_small.yaml", f"data.dir={data}", f"run.dir={run_dir}",
                    f"train.max_steps={steps}", "train.eval_every=1000", "train.keep_last=20", "logging.wandb_mode=offline",
                    "decode.bleu_tokenize=13a",  # as the first enja-small rows (benchmarks/quality/recipes.py: ja-mecab)
                    "logging.progress=false"], extra), cwd=REPO, check=True)


def _evaluate(run_dir: Path, checkpoint: str) -> dict:
    out = subprocess.run([sys.executable, "launch/evaluate.py", "--run", str(run_dir), "--checkpoint", checkpoint,
                          "--src", str(ENJA / "test.en"), "--ref", str(ENJA / "test.ja"), "--json", "--tokenize", "13a"],
                         cwd=REPO, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/hybrid-nmt-bench"))
    p.add_argument("--minutes", type=float, default=15.0)
    p.add_argument("--steps", type=int, default=6000)
    p.add_argument("--compare-step", type=int, default=5000)
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    data = prepare_enja(args.work)
    result = {}
    single_run, hybrid_run = args.work / "runs" / "bleu_single", args.work / "runs" / "bleu_hybrid2"
    for run in (single_run, hybrid_run):  # this benchmark's own runs of an earlier call: start afresh
        shutil.rmtree(run, ignore_errors=True)
    for base in ("single", "hybrid_2"):
        cfg = json.loads((REPO / "ds_configs" / f"{base}.json").read_text())
        schedule = {**cfg["scheduler"], "params": {**cfg["scheduler"]["params"], "total_num_steps": args.steps}}
        ds_variant(args.work, base, f"{base}_bleu", scheduler=schedule, bf16={"enabled": True})  # as recorded
    _train([sys.executable], args.work / "single_bleu.json", data, single_run, args.steps,
           [f"train.max_time_min={args.minutes}", "train.threads=2"])
    rows = metrics(single_run)
    steps = rows[-1]["step"]
    result["single"] = {"steps": steps, "test_best": _evaluate(single_run, "best"),
                        "dev_bleu": {r["step"]: r["dev_bleu"] for r in rows if "dev_bleu" in r}}
    _train([sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2"], args.work / "hybrid_2_bleu.json",
           data, hybrid_run, steps, ["train.threads=1"])
    rows = metrics(hybrid_run)
    result["hybrid_2"] = {"steps": rows[-1]["step"], "dev_bleu": {r["step"]: r["dev_bleu"] for r in rows if "dev_bleu" in r}}
    from trainer.artifacts.run_dir import CKPT_DIR
    from trainer.checkpoint.files import step_name

    for name, run in (("single", single_run), ("hybrid_2", hybrid_run)):
        ckpt = run / CKPT_DIR / step_name(args.compare_step)
        result[name][f"test_at_{args.compare_step}"] = _evaluate(run, str(ckpt))
    print(json.dumps(result, indent=1))
    records.write(to_records(result, args.compare_step))


def to_records(result: dict, compare_step: int) -> list[dict]:
    """Test BLEU and chrF of both layouts at the compared step, and of single's best checkpoint, as records."""
    command = records.command("benchmarks.quality.bleu")
    corpus, tokenize = "small_parallel_enja (500 test sentences, beam 5)", "13a"
    out = []
    for layout, which in (("single", f"test_at_{compare_step}"), ("hybrid_2", f"test_at_{compare_step}"),
                          ("single", "test_best")):
        r = result[layout][which]
        steps = compare_step if which != "test_best" else result[layout]["steps"]
        out.append(records.record("bleu", "scores", command=command, settings={
            "what": f"enja-small, {layout}, bf16, " + ("best checkpoint" if which == "test_best" else f"at step {steps}"),
            "corpus": corpus, "tokenize": tokenize, "steps": steps, "layout": layout},
            figures={"test_bleu": r.get("bleu"), "test_chrf": r.get("chrf"),
                     "dev_bleu_greedy_by_eval": list(result[layout]["dev_bleu"].values())}))
    return out


if __name__ == "__main__":
    main()

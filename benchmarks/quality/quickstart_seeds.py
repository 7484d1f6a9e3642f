"""Does the quickstart convince on this CPU? The real `launch/quickstart.sh`, once per seed, scored as a user sees it.

    python -m benchmarks.quality.quickstart_seeds --work DIR --seeds 1 2 3 --machine "AMD EPYC (2 cores)"

Per seed N: `WORK=DIR/seed_N bash launch/quickstart.sh train.seed=N` (the corpus, prepare, training on 2 ranks,
test translation with beam 5, the plot: every phase, as shipped), timed from outside. Then from its files:
the CPU seconds of its processes (the quickstart's own last line, launch/phases.sh: what a quiet machine's
wall time follows), test BLEU and chrF of RUN's test translations (sacreBLEU, the target language's tokenizer, as launch/evaluate.py scores
it), the share of the reference's ordinals (第N) the translation has (`number_copy.ordinals`, the measure
`python -m benchmarks.quality.number_copy` prints as ordinals_right), and dev BLEU at each validation
(metrics.jsonl). The bar (issue 42): test BLEU >= 95 and ordinals right >= 95% on every seed, the whole
quickstart under 4 minutes.

Appends one record per seed, as each finishes, to benchmarks/results/bleu.jsonl (table "scores": the BLEU
table of docs/BENCHMARKS.md; `python -m benchmarks.results render` writes the page again), with the load
average before and after: on a shared machine the wall time is an upper bound, the scores are not affected.
--no-record prints only.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import REPO, metrics
from benchmarks.quality.number_copy import ordinals
from benchmarks.results import command, record, write
from data_prep import userfiles
from trainer.artifacts.run_dir import CONFIG, DS_CONFIG, TEST_HYP
from trainer.config import read_yaml
from trainer.ds_config import MAX_BYTES

BAR = {"test_bleu": 95.0, "ordinals_right": 0.95, "wall_s": 240.0}
PHASE = re.compile(r"^quickstart: .*?\btrain ([\d.]+) s", re.M)
TOTAL = re.compile(r"^quickstart: .*; total [\d.]+ s \(CPU ([\d.]+) s\)", re.M)  # launch/phases.sh's last line


def run_quickstart(work: Path, seed: int) -> tuple[float, str]:
    """One quickstart into `work` with train.seed=`seed`: (wall seconds, its output). Raises on failure."""
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "WORK": str(work)}
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "launch/quickstart.sh", f"train.seed={seed}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - t0
    (work / "quickstart.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        sys.exit(f"quickstart (seed {seed}) exited {proc.returncode}; its output: {work / 'quickstart.log'}\n"
                 + (proc.stdout + proc.stderr)[-3000:])
    return wall, proc.stdout + proc.stderr


def scores(work: Path) -> dict:
    """Test BLEU, chrF and ordinals of the quickstart's run in `work`, and dev BLEU at each validation."""
    from trainer.inference.text import read_lines
    from trainer.metrics import resolve_tokenize, score

    text, run = work / "data" / "demo_text", work / "runs" / "demo"
    src, ref, hyp = (read_lines(str(p)) for p in (text / "test.en", text / "test.ja", run / TEST_HYP))
    tokenize = resolve_tokenize("auto", "ja", ref)
    s = score(hyp, ref, tokenize)
    dev = [(r["step"], r["dev_bleu"]) for r in metrics(run) if "dev_bleu" in r]
    model = read_yaml(str(run / CONFIG)).model  # the run's own files, through the project's strict readers
    lr = userfiles.read_json(str(run / DS_CONFIG), MAX_BYTES, "the run's DeepSpeed JSON")["optimizer"]["params"]["lr"]
    recipe = (f"{'residual layers, ' if model.get('residual') else ''}{model['attention']} attention, lr {lr:g}")
    return {"test_bleu": round(s.bleu, 2), "test_chrf": round(s.chrf, 2), **ordinals(src, ref, hyp),
            "dev_bleu_steps": [step for step, _ in dev], "dev_bleu": [round(b, 2) for _, b in dev],
            "tokenize": f"{tokenize} ({s.bleu_signature})", "recipe": recipe}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, required=True, help="each seed's data and run go under WORK/seed_N")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--machine", default=None, help="the machine as the records name it (default: this CPU)")
    p.add_argument("--no-record", action="store_true", help="print only; append no record")
    args = p.parse_args()
    cmd = command("benchmarks.quality.quickstart_seeds")
    print("| seed | test BLEU | chrF | ordinals right | dev BLEU by validation | wall s | train s | CPU s | load before -> "
          "after |\n|---:|---:|---:|---:|---|---:|---:|---:|---|", flush=True)
    failed = []
    for seed in args.seeds:
        work = (args.work / f"seed_{seed}").resolve()
        load0 = os.getloadavg()[0]
        wall, out = run_quickstart(work, seed)
        load1 = os.getloadavg()[0]
        train, cpu = PHASE.findall(out), TOTAL.findall(out)
        f = scores(work)
        steps = f["dev_bleu_steps"][-1] if f["dev_bleu_steps"] else None
        figures = {"test_bleu": f["test_bleu"], "test_chrf": f["test_chrf"],
                   "ordinals_right_pct": round(100 * f["ordinals_right"], 1), "ordinals": f["ordinals"],
                   "wrong_ordinals": f["wrong_ordinals"],
                   f"dev_bleu_by_{f['dev_bleu_steps'][0] if steps else 0}_steps": f["dev_bleu"], "wall_s": round(wall, 1), "train_s": float(train[-1]) if train else None,
                   "cpu_s": float(cpu[-1]) if cpu else None}
        met = {"test_bleu": f["test_bleu"] >= BAR["test_bleu"], "ordinals_right": f["ordinals_right"] >= BAR[
            "ordinals_right"], "wall_s": wall <= BAR["wall_s"]}
        failed += [f"seed {seed}: {k}" for k, ok in met.items() if not ok]
        print(f"| {seed} | {f['test_bleu']:.2f} | {f['test_chrf']:.2f} | {100 * f['ordinals_right']:.1f}% "
              f"({f['ordinals']}) | {', '.join(f'{b:.2f}' for b in f['dev_bleu'])} | {wall:.1f} | "
              f"{figures['train_s']} | {figures['cpu_s']} | {load0:.1f} -> {load1:.1f} |", flush=True)
        if not args.no_record:
            rec = record("bleu", "scores", command=cmd, machine_name=args.machine, figures=figures,
                         settings={"what": f"the quickstart ({f['recipe']}, {steps} steps), seed {seed}", "corpus": "demo claims (test set)",
                                   "tokenize": f["tokenize"], "steps": steps, "layout": "hybrid_2", "seed": seed},
                         note=f"the whole quickstart's wall time, timed from outside, on a machine shared with other "
                              f"work: load average {load0:.1f} before, {load1:.1f} after (scores are deterministic "
                              f"per machine; the time is an upper bound)")
            write([rec])
    print("the bar (test BLEU >= 95, ordinals right >= 95%, under 4 minutes): "
          + ("met by every seed" if not failed else "missed: " + "; ".join(failed)))


if __name__ == "__main__":
    main()

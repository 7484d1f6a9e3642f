"""What the quickstart's demo corpus learns in 1000 steps, by corpus and recipe (docs/BENCHMARKS.md 6.6).

    python -m benchmarks.quality.demo_recipes [--work /tmp/hybrid-nmt-bench] [--steps 1000] [--only NAME ...]

Each row: the demo corpus (`python -m data_prep.demo_corpus --pairs 20000 --seed 1 --max-words W`),
prepared with `--src-lang en --tgt-lang ja --vocab-size V --model-type T` and the row's flags, trained through the real CLI on
one process with 2 threads (`ds_configs/demo_hybrid_2.json`'s optimizer, precision and schedule with a
single layout; the recipe is layout-invariant) with `trainer/configs/demo.yaml` and the row's overrides,
then its dev BLEU (greedy, ja-mecab, 200 sentences) at the last step. About a minute and a half per row.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.common import REPO, ds_variant, metrics, train
from data_prep.dataformat import MANIFEST

# name, max words, vocabulary size, model type, prepare's extra flags, bf16, config overrides[, DeepSpeed JSON
# changes]. The first rows
# predate `--pretokenize` and learn pieces from the raw Japanese (none); "auto" bounds them by MeCab's words.
RAW = ("--pretokenize", "none")
WORDS = ("--pretokenize", "auto")
NUMBERS = ("--pretokenize", "auto", "--number-placeholders", "8")
ROWS = [
    ("50 words, 8k BPE", 50, 8000, "bpe", RAW, True, ()),
    ("50 words, dropout 0", 50, 8000, "bpe", RAW, True, ("model.dropout=0",)),
    ("50 words, bidirectional bottom layer", 50, 8000, "bpe", RAW, True, ("model.bidirectional_bottom=true",)),
    ("50 words, hidden 256", 50, 8000, "bpe", RAW, True, ("model.hidden=256", "model.emb_dim=256")),
    ("50 words, 2k BPE", 50, 2000, "bpe", RAW, True, ()),
    ("50 words, 2k unigram", 50, 2000, "unigram", RAW, True, ()),
    ("20 words, fp32", 20, 8000, "bpe", RAW, False, ()),
    ("20 words, 8k BPE", 20, 8000, "bpe", RAW, True, ()),
    ("12 words, 8k BPE", 12, 8000, "bpe", RAW, True, ()),
    ("20 words, 8k BPE within MeCab words", 20, 8000, "bpe", WORDS, True, ()),
    ("20 words, 8k BPE within MeCab words, number placeholders", 20, 8000, "bpe", NUMBERS, True, ()),
    ("20 words, 8k BPE, number placeholders", 20, 8000, "bpe", RAW + NUMBERS[2:], True, ()),
    ("20 words, 8k BPE within MeCab words, number placeholders, bidirectional bottom layer", 20, 8000, "bpe",
     NUMBERS, True, ("model.bidirectional_bottom=true",)),
    ("the same, 128 pairs per step", 20, 8000, "bpe", NUMBERS, True, ("model.bidirectional_bottom=true",),
     {"train_micro_batch_size_per_gpu": 128}),
]


def prepare_demo(work: Path, words: int, size: int, model_type: str, extra: tuple = RAW) -> Path:
    flags = "".join(c for c in "_".join(extra) if c.isalnum() or c == "_")
    text, data = work / f"demo_text_{words}", work / f"demo_{words}_{model_type}_{size}{flags}"
    if not (data / MANIFEST).exists():
        subprocess.run([sys.executable, "-m", "data_prep.demo_corpus", "--out", str(text), "--pairs", "20000",
                        "--seed", "1", "--max-words", str(words)], cwd=REPO, check=True, capture_output=True)
        subprocess.run([sys.executable, "-m", "data_prep.prepare", "--format", "moses", "--src-lang", "en",
                        "--tgt-lang", "ja", "--out", str(data), "--vocab-size", str(size), "--model-type", model_type,
                        *extra, "--overwrite", *(f"--{s}-{side}={text}/{s}.{lang}" for s in ("train", "dev", "test")
                                         for side, lang in (("src", "en"), ("tgt", "ja")))],
                       cwd=REPO, check=True, capture_output=True)
    return data


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/hybrid-nmt-bench"))
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--only", nargs="*", default=None, help="row names to run (default: all)")
    p.add_argument("--seeds", nargs="*", type=int, default=[1], help="train.seed of each run of a row (default: 1)")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    single = {"mode": "single", "num_pp": 1, "num_dp": 1, "micro_batches": 1, "time_chunks": 1}
    print("| corpus / recipe | seed | dev BLEU | dev chrF | dev loss |\n|---|---:|---:|---:|---:|")
    results = {}
    for name, words, size, model_type, extra, bf16, overrides, *ds_changes in ROWS:
        if args.only and name not in args.only:
            continue
        data = prepare_demo(args.work, words, size, model_type, extra)
        for seed in args.seeds:
            key = "demo_recipe_" + "".join(c if c.isalnum() else "_" for c in name)
            key += f"_seed{seed}" if seed != 1 else ""
            ds = ds_variant(args.work, "demo_hybrid_2", key, bf16={"enabled": bf16}, layout=single,
                            **(ds_changes[0] if ds_changes else {}))
            train(args.work, key, ds, 1, 2, args.steps, data, config="trainer/configs/demo.yaml",
                  extra=(f"train.eval_every={args.steps}", "decode.dev_max_sentences=200", f"train.seed={seed}",
                         *overrides))
            rows = metrics(args.work / "runs" / key)
            dev = [r for r in rows if "dev_bleu" in r][-1]
            results[f"{name} (seed {seed})"] = dev
            print(f"| {name} | {seed} | {dev['dev_bleu']:.2f} | {dev['dev_chrf']:.2f} | {dev['dev_loss']:.3f} |",
                  flush=True)
    (args.work / "demo_recipes.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

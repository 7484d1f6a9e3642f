"""Are numbers copied into the translation? (What number placeholders, `prepare --number-placeholders`, buy.)

    python -m benchmarks.quality.number_copy --run RUN_DIR [--checkpoint C] --src test.en --ref test.ja [--beam 5] [--seed 1]
    python -m benchmarks.quality.number_copy --masking --src train.en --ref train.ja [--slots 8]

Patents are full of numbers: claim references ("according to claim 3"), reference numerals ("the housing
12"), values. SentencePiece here splits digits (data_prep/vocab.py), so without placeholders a number is spelt
digit by digit and the model has to copy it; with them (data_prep/numbers.py) the translator puts the
source's numbers back. This measures how often it does, on the given test set as it is and on a
copy whose claim numbers ("claim N" / "請求項N") are replaced, in source and reference alike, by seeded
random numbers of 2-4 digits that the demo corpus never has (its claims refer to 1-20):

  numbers kept   share of the source's numbers (digit runs, NFKC) found in the hypothesis, as a multiset
  lines all kept share of lines with a number whose hypothesis has all of them
  ordinals right share of the reference's ordinals (第N: "the first ..." is 第1の) found in the hypothesis,
                 as a multiset; wrong ordinals: the hypothesis' ordinals the reference does not have (a
                 claim number written as an ordinal shows here); source numbers as ordinals: wrong
                 ordinals whose value is one of the source's numbers (with unseen claim numbers, almost
                 only a claim number copied into an ordinal can be that)
  BLEU           with the target language's tokenizer (trainer.metrics)

With --masking, no model: what data_prep/numbers.py does to training pairs, with the target matched as a
multiset (as prepare does) and by value alone (every run of a source value, the rule before): target runs
masked, and ordinals among them (第⟨nK⟩, an ordinal taken for a source number).

Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import unicodedata
from collections import Counter

from trainer.metrics import resolve_tokenize, score

DIGITS = re.compile(r"\d+")
ORDINAL = re.compile(r"第\s*(\d+)")
CLAIM_EN, CLAIM_JA = re.compile(r"(?<=claim )\d+"), re.compile(r"(?<=請求項)\d+|(?<=請求 項 )\d+")


def numbers(text: str) -> Counter:
    return Counter(DIGITS.findall(unicodedata.normalize("NFKC", text)))


def kept(src: list[str], hyps: list[str]) -> dict:
    total = found = lines = lines_ok = 0
    for s, h in zip(src, hyps):
        want, got = numbers(s), numbers(h)
        if want:
            total += sum(want.values())
            found += sum((want & got).values())
            lines += 1
            lines_ok += not (want - got)
    return {"numbers": total, "numbers_kept": round(found / max(total, 1), 4), "lines_with_numbers": lines,
            "lines_all_kept": round(lines_ok / max(lines, 1), 4)}


def ordinals(src: list[str], ref: list[str], hyps: list[str]) -> dict:
    total = found = wrong = copied = 0
    for s, r, h in zip(src, ref, hyps):
        want = Counter(ORDINAL.findall(unicodedata.normalize("NFKC", r)))
        got = Counter(ORDINAL.findall(unicodedata.normalize("NFKC", h)))
        total += sum(want.values())
        found += sum((want & got).values())
        extra = got - want
        wrong += sum(extra.values())
        copied += sum(n for v, n in extra.items() if v in numbers(s) and v not in want)
    return {"ordinals": total, "ordinals_right": round(found / max(total, 1), 4), "wrong_ordinals": wrong,
            "source_numbers_as_ordinals": copied}


def unseen_numbers(src: list[str], ref: list[str], seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    out_src, out_ref = [], []
    for s, r in zip(src, ref):
        if CLAIM_EN.search(s) and CLAIM_JA.search(r):
            n = str(rng.choice([rng.randint(21, 99), rng.randint(100, 999), rng.randint(1000, 9999)]))
            s, r = CLAIM_EN.sub(n, s), CLAIM_JA.sub(n, r)
        out_src.append(s)
        out_ref.append(r)
    return out_src, out_ref


def masking(src: list[str], tgt: list[str], slots: int) -> dict:
    from data_prep import numbers as placeholders

    out = {rule: {"target_runs_masked": 0, "ordinals_masked": 0, "pairs": len(src)}
           for rule in ("multiset", "by_value")}
    for s, t in zip(src, tgt):
        masked, nums = placeholders.mask_source(s, slots)
        budgets = {"multiset": placeholders.slot_counts(masked, len(nums)), "by_value": [len(t)] * len(nums)}
        for rule, counts in budgets.items():
            text, runs, _ = placeholders.mask_target(t, nums, counts)
            out[rule]["target_runs_masked"] += runs
            out[rule]["ordinals_masked"] += len(re.findall(r"第\s*⟨n", text))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", help="a trained run (its best checkpoint translates); not with --masking")
    p.add_argument("--checkpoint", default="best", help="with --run: best | last | a checkpoint directory")
    p.add_argument("--src", required=True)
    p.add_argument("--ref", required=True)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--masking", action="store_true", help="count what masking does to --src/--ref; no model")
    p.add_argument("--slots", type=int, default=8, help="with --masking: placeholders per sentence")
    args = p.parse_args()
    from trainer.inference.loading import load_run
    from trainer.inference.text import read_lines

    if args.masking:
        print(json.dumps(masking(read_lines(args.src), read_lines(args.ref), args.slots), indent=1))
        return
    if not args.run:
        p.error("--run is required (or --masking)")
    translator = load_run(args.run, args.checkpoint)
    src, ref = read_lines(args.src), read_lines(args.ref)
    tokenize = resolve_tokenize("auto", translator.tgt_lang, ref)
    result = {}
    for name, (s, r) in {"as_is": (src, ref), "unseen_claim_numbers": unseen_numbers(src, ref, args.seed)}.items():
        hyps = translator.translate(s, beam=args.beam)
        result[name] = {**kept(s, hyps), **ordinals(s, r, hyps), "bleu": round(score(hyps, r, tokenize).bleu, 2),
                        "changed_lines": sum(a != b for a, b in zip(s, src))}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

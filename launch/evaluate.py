"""Evaluate: `python launch/evaluate.py (--run RUN_DIR [--checkpoint C ...] | --model FILE ...) --src F --ref F
[--tokenize auto|13a|ja-mecab|zh|ko-mecab|...] [--baseline HYP] [--show N] [--json]`: translates the source and prints sacreBLEU BLEU and
chrF with their signatures. The tokenizer follows the target language (auto: ja-mecab, zh, ko-mecab, else 13a)."""
import argparse

from trainer.entry import fail
from trainer.training import memory

if __name__ == "__main__":
    try:  # before torch is loaded: the allocator a training process runs with (the process may exec itself)
        memory.prepare()
    except FileNotFoundError as e:
        fail(e)

from trainer.checkpoint.files import CheckpointError
from trainer.inference.cli import add_decode_arguments, add_model_arguments, evaluate_main


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    add_model_arguments(p)
    p.add_argument("--src", required=True)
    p.add_argument("--ref", required=True)
    p.add_argument("--tokenize", default=None, help="sacreBLEU tokenizer (default: decode.bleu_tokenize, auto)")
    p.add_argument("--output", default=None, help="also write the translations here")
    p.add_argument("--json", action="store_true", help="print one JSON object (bleu, chrf, signatures)")
    p.add_argument("--baseline", default=None,
                   help="another system's translations of --src (one per line): scored the same way, printed beside")
    p.add_argument("--show", type=int, default=0, metavar="N",
                   help="print the first N sentences: source, reference, hypothesis")
    add_decode_arguments(p)
    args = p.parse_args(argv)
    try:
        return evaluate_main(args)
    except (ValueError, OSError, CheckpointError) as e:  # OSError: also unreadable files
        fail(e)


if __name__ == "__main__":
    main()

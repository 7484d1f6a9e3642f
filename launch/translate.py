"""Translate: `python launch/translate.py (--run RUN_DIR [--checkpoint best|last|PATH] | --model model.pt) --input F --output F
[--beam 5] [--max-len-ratio R] [--length-penalty A]`: one output line per input line, on one process."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trainer.checkpoint import CheckpointError  # noqa: E402
from trainer.cli import fail, translate_main  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--run", help="run directory written by launch/train.py")
    model.add_argument("--model", help="a model file written by launch/export.py")
    p.add_argument("--checkpoint", default="best", help="with --run: best | last | a checkpoint directory")
    p.add_argument("--allow-unverified", action="store_true",
                   help="with --run: load a checkpoint without (or with a malformed) manifest.json, unchecked")
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--beam", type=int, default=None, help="beam size (1 = greedy; default: decode.beam)")
    p.add_argument("--max-len-ratio", type=float, default=None, help="max target length / source length")
    p.add_argument("--length-penalty", type=float, default=None, help="score / length^A (0 = raw log-prob)")
    p.add_argument("--batch-size", type=int, default=None)
    args = p.parse_args(argv)
    try:
        return translate_main(args)
    except (ValueError, OSError, CheckpointError) as e:  # OSError: also unreadable files
        fail(e)


if __name__ == "__main__":
    main()

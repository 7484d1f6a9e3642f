"""Evaluate: `python launch/evaluate.py (--run RUN_DIR | --model model.pt) --src F --ref F [--json]`: translates the source
and prints sacreBLEU BLEU and chrF with their signatures."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trainer.checkpoint import CheckpointError  # noqa: E402
from trainer.cli import evaluate_main, fail  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--run", help="run directory written by launch/train.py")
    model.add_argument("--model", help="a model file written by launch/export.py")
    p.add_argument("--checkpoint", default="best", help="with --run: best | last | a checkpoint directory")
    p.add_argument("--allow-unverified", action="store_true",
                   help="with --run: load a checkpoint without (or with a malformed) manifest.json, unchecked")
    p.add_argument("--src", required=True)
    p.add_argument("--ref", required=True)
    p.add_argument("--beam", type=int, default=None)
    p.add_argument("--output", default=None, help="also write the translations here")
    p.add_argument("--json", action="store_true", help="print one JSON object (bleu, chrf, signatures)")
    args = p.parse_args(argv)
    try:
        return evaluate_main(args)
    except (ValueError, OSError, CheckpointError) as e:  # OSError: also unreadable files
        fail(e)


if __name__ == "__main__":
    main()

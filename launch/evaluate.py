"""Evaluate: `python launch/evaluate.py --run RUN_DIR --src F --ref F [--json]`: translates the source
and prints sacreBLEU BLEU and chrF with their signatures."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trainer.cli import evaluate_main, fail  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--run", required=True, help="run directory written by launch/train.py")
    p.add_argument("--checkpoint", default="best", help="best | last | a checkpoint directory")
    p.add_argument("--src", required=True)
    p.add_argument("--ref", required=True)
    p.add_argument("--beam", type=int, default=None)
    p.add_argument("--output", default=None, help="also write the translations here")
    p.add_argument("--json", action="store_true", help="print one JSON object (bleu, chrf, signatures)")
    args = p.parse_args(argv)
    try:
        return evaluate_main(args)
    except (ValueError, FileNotFoundError) as e:
        fail(e)


if __name__ == "__main__":
    main()

"""Export: `python launch/export.py --run RUN_DIR [--checkpoint best|last|PATH] --out model.pt`: one
consolidated file (weights keyed like the whole model, config, SentencePiece models, normalisation)
that `launch/translate.py --model model.pt` and `launch/evaluate.py --model model.pt` use without the run."""
import argparse

from trainer.checkpoint.files import CheckpointError
from trainer.entry import fail
from trainer.inference.cli import export_main


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--run", required=True, help="run directory written by launch/train.py")
    p.add_argument("--checkpoint", default="best", help="best | last | a checkpoint directory")
    p.add_argument("--allow-unverified", action="store_true",
                   help="load a checkpoint without (or with a malformed) manifest.json, unchecked")
    p.add_argument("--out", required=True, help="the model file to write")
    args = p.parse_args(argv)
    try:
        return export_main(args)
    except (ValueError, OSError, CheckpointError) as e:  # OSError: also unreadable files
        fail(e)


if __name__ == "__main__":
    main()

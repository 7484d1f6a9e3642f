"""Average checkpoints: `python launch/average.py --run RUN_DIR (--last N | --checkpoints C ...) --out model.pt`:
one model file (as launch/export.py writes) whose weights are the mean of the run's last N complete
checkpoints (train with train.keep_last >= N) or of the given ones."""
import argparse

from trainer.checkpoint.files import CheckpointError
from trainer.entry import fail
from trainer.inference.cli import average_main


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--run", required=True, help="run directory written by launch/train.py")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--last", type=int, help="the newest N complete checkpoints")
    which.add_argument("--checkpoints", nargs="+", help="checkpoint directories (or best / last)")
    p.add_argument("--out", required=True, help="the model file to write")
    args = p.parse_args(argv)
    try:
        return average_main(args)
    except (ValueError, OSError, CheckpointError) as e:  # OSError: the file layer's one line (files.FileError)
        fail(e)


if __name__ == "__main__":
    main()

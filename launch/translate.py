"""Translate: `python launch/translate.py (--run RUN_DIR [--checkpoint C ...] | --model FILE ...) [--input F|-]
[--output F|-] [--n-best K] [--alignments] [--beam 5] ...`: one output line per input line (K with --n-best),
streamed in chunks, so it works in a pipe (omitted or "-": stdin / stdout). Several checkpoints or model
files decode as an ensemble. Progress on a terminal, sentences/s and tokens/s at the end, on stderr.
Output formats: trainer/inference/cli.py."""
import argparse
import os
import sys

from trainer.entry import fail
from trainer.training import memory

if __name__ == "__main__":
    try:  # before torch is loaded: the allocator a training process runs with (the process may exec itself)
        memory.prepare()
    except FileNotFoundError as e:
        fail(e)

from trainer.checkpoint.files import CheckpointError
from trainer.inference.cli import add_decode_arguments, add_model_arguments, translate_main


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(p)
    p.add_argument("--input", default="-", help="text, one segment per line (default -: stdin)")
    p.add_argument("--output", default="-", help="where the translations go (default -: stdout)")
    p.add_argument("--n-best", type=int, default=1, help="K > 1: K lines per input: INDEX<TAB>SCORE<TAB>HYPOTHESIS")
    p.add_argument("--alignments", action="store_true", help="append a column of source-target piece links")
    p.add_argument("--buffer-size", type=int, default=None,
                   help="input lines read before decoding (default 256; 1 for interactive use)")
    add_decode_arguments(p)
    args = p.parse_args(argv)
    try:
        return translate_main(args)
    except BrokenPipeError:  # `... | head`: the reader left; not an error, and nothing more to write
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, OSError, CheckpointError) as e:  # OSError: the file layer's one line (files.FileError)
        fail(e)


if __name__ == "__main__":
    main()

"""Score: `python launch/score.py (--run RUN_DIR [--checkpoint C ...] | --model FILE ...) --src F --ref F
[--output F|-] [--json]`: forced decoding, the model's log-probability of each given reference (for reranking
and data filtering): LOGPROB<TAB>TOKENS<TAB>PER_TOKEN per line (trainer/inference/cli.py)."""
import argparse

from trainer.checkpoint.files import CheckpointError
from trainer.entry import fail
from trainer.inference.cli import add_model_arguments, score_main


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    add_model_arguments(p)
    p.add_argument("--src", required=True)
    p.add_argument("--ref", required=True, help="the targets to score, line by line with --src")
    p.add_argument("--output", default="-", help="default -: stdout")
    p.add_argument("--json", action="store_true", help="one JSON object per line (logprob, tokens, per_token)")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=None)
    args = p.parse_args(argv)
    try:
        return score_main(args)
    except (ValueError, OSError, CheckpointError) as e:  # OSError: the file layer's one line (files.FileError)
        fail(e)


if __name__ == "__main__":
    main()

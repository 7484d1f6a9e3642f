"""Plot: `python launch/plot.py RUN_DIR [--out PNG]`: loss, dev BLEU and tokens/s over steps from
RUN_DIR/metrics.jsonl (default output RUN_DIR/training.png)."""
import argparse

from trainer.entry import fail


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("run", help="run directory written by launch/train.py")
    p.add_argument("--out", default=None, help="the PNG to write (default RUN_DIR/training.png)")
    args = p.parse_args(argv)
    from data_prep.dataformat import files
    from trainer.observe.plots import plot_run

    try:
        with files.command():
            print(plot_run(args.run, args.out))
    except (ValueError, OSError) as e:  # OSError: the file layer's one line (files.FileError)
        fail(e)


if __name__ == "__main__":
    main()

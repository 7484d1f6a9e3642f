"""Plan the layout: `python launch/plan.py --config MODEL.yaml --devices N --profile PROFILE
[--deepspeed_config BASE.json] [--write-config OUT.json]` ranks the parallel layouts by predicted step
time; `python launch/plan.py --calibrate --config MODEL.yaml --out PROFILE` measures this machine."""
import sys

from trainer.entry import fail
from trainer.training import memory

if __name__ == "__main__":
    try:  # before torch is loaded: a calibration times the model under the allocator training runs with
        memory.prepare()
    except FileNotFoundError as e:
        fail(e)


def main(argv=None):
    from data_prep.dataformat import files
    from trainer.planner.cli import main as plan_main

    try:
        with files.command():  # its reads remembered, a stop signal one line with the output under way removed
            sys.exit(plan_main(argv))
    except (ValueError, OSError) as e:  # OSError: the file layer's one line (files.FileError)
        fail(e)


if __name__ == "__main__":
    main()

"""Train: `deepspeed [--num_gpus N] launch/train.py --deepspeed_config ds_configs/X.json [--config YAML] [k=v ...]`
(or plain `python launch/train.py ...` for one process); key=value overrides may stand anywhere on the line.
`--dry-run` checks the layout against the config as a run would and prints each rank's schedule;
`--print-config` prints the resolved config, each key with its help."""
import argparse
import os
import signal
import sys

from trainer.entry import fail
from trainer.training import job_control, memory
from trainer.training.cli import leave, print_config, run_dry, train_main

if __name__ == "__main__":
    try:  # before torch is loaded: oneDNN's cache size, and the allocator (the process may exec itself)
        memory.prepare()
    except FileNotFoundError as e:
        fail(e)

from trainer.checkpoint.files import CheckpointError
from data_prep.dataformat import files
from trainer.parallel.deepspeed_adapter import DeepSpeedVersionError
from trainer.parallel.runtime import RendezvousError
from trainer.training.loop import TrainingError


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--deepspeed_config", default=None, help="DeepSpeed JSON (ds_configs/); required to train")
    p.add_argument("--config", default=None, help="model/data/train YAML (default trainer/configs/demo.yaml)")
    p.add_argument("--dry-run", action="store_true",
                   help="check the layout against the config (as a run does) and print each rank's instruction list")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config (YAML + overrides), each key with its help, and exit")
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # set by the launcher
    p.add_argument("overrides", nargs="*", help="key=value config overrides, e.g. train.max_steps=100 (anywhere)")
    args = p.parse_intermixed_args(argv)
    try:
        if args.print_config:
            return print_config(args.config, args.overrides)
        if not args.deepspeed_config:
            p.error("the following arguments are required: --deepspeed_config")
        if args.dry_run:
            return run_dry(args.config, args.overrides, args.deepspeed_config)
        job_control.start()  # the console, stop requests, the terminal, the launcher watch
        leave(train_main(args.config, args.overrides, args.deepspeed_config))
    except job_control.Interrupted as e:  # before the first step: nothing to save
        print(f"rank {os.environ.get('RANK', '0')}: stopped by {e.signal_name} before training started",
              file=sys.stderr, flush=True)
        leave(128 + signal.Signals[e.signal_name])
    except (ValueError, FileNotFoundError, CheckpointError, DeepSpeedVersionError, RendezvousError,
            files.FileError) as e:
        fail(e, exit=leave)
    except TrainingError as e:
        fail(e, code=1, exit=leave)


if __name__ == "__main__":
    main()

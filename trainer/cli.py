"""What the thin entry points in launch/ call."""
from __future__ import annotations

import json
import sys


def fail(err: Exception) -> None:
    """A user error: one line on stderr, exit code 2, no traceback."""
    print(f"error: {err}", file=sys.stderr, flush=True)
    sys.exit(2)


def run_dry(ds_config_path: str) -> int:
    from trainer.layout import SECTION, LayoutSpec
    from trainer.schedule import format_schedule, global_programs

    with open(ds_config_path) as f:
        ds = json.load(f)
    section = ds.get(SECTION, {})
    world = section.get("num_pp", 1) * section.get("num_dp", 1)
    spec = LayoutSpec.from_ds_config(ds, world)
    print(f"mode={spec.mode} num_pp={spec.num_pp} num_dp={spec.num_dp} micro_batches={spec.micro_batches} "
          f"time_chunks={spec.time_chunks} head_parallel={spec.head_parallel}")
    print(format_schedule(global_programs(spec.num_pp, spec.num_dp, spec.micro_batches, spec.time_chunks,
                                          spec.head_parallel)))
    return 0


def train_main(config_path, overrides, ds_config_path) -> int:
    from trainer.config import load_config
    from trainer.trainer import Trainer

    cfg = load_config(config_path, overrides)
    Trainer(cfg, ds_config_path).fit()
    return 0

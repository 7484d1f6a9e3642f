"""What launch/train.py calls: train, --dry-run, --print-config, and how a training process leaves."""
from __future__ import annotations

import os
import sys


def leave(code: int) -> None:
    """End a training process once its work is done and its files are closed, skipping interpreter
    teardown: there, gloo/DeepSpeed background threads have now and then aborted a finished process
    ("terminate called without an active exception", exit -6), turning a clean run into a failure.
    A terminal this rank took (trainer.training.job_control) goes back to the job first, and run.dir's lock is let go."""
    from trainer.training import job_control
    from trainer.artifacts import run_files

    run_files.release_run_dir()
    remove_temporary_dirs()
    job_control.flush_and_release()
    os._exit(code)


def remove_temporary_dirs() -> None:
    """What interpreter exit would have removed: the process's `tempfile.TemporaryDirectory`s (wandb makes two
    when imported, `tmp*wandb-media` and `tmp*wandb-artifacts`; every run left both in /tmp)."""
    import tempfile
    import weakref

    cleanup = tempfile.TemporaryDirectory._cleanup.__func__
    registry = getattr(weakref.finalize, "_registry", {})
    for finalizer, info in list(registry.items()):
        if getattr(info.func, "__func__", None) is cleanup:
            try:
                finalizer()  # runs once, and is then unregistered
            except Exception:  # noqa: BLE001 (a temporary directory that cannot go stays, as before)
                pass


def _lost_peer_exit(err: Exception, cfg, runtime) -> None:
    """A peer died or stopped answering: say who and what was kept, then leave at once (exit 3)
    without the collective teardown, which would wait on the lost peer."""
    from trainer.checkpoint.checkpointer import latest as latest_checkpoint
    from trainer.parallel.runtime import current_rank

    lines = [f"error: rank {current_rank()}: lost contact with a peer rank: {str(err).splitlines()[0][:400]}"]
    if runtime is not None:
        lines.append(f"  ranks on this host: {runtime.peer_status()}")
        ended = runtime.end_stopped_peers()
        if ended:
            lines.append(f"  ended with SIGKILL, the job cannot go on: {', '.join(ended)} (stopped)")
    lines.append(f"  timeout for an unresponsive peer: train.comm_timeout_s={cfg.train.comm_timeout_s}")
    latest = latest_checkpoint(cfg.run.dir)
    lines.append(f"  newest complete checkpoint: {latest or 'none'} (continue with train.resume=auto)")
    print("\n".join(lines), file=sys.stderr, flush=True)
    leave(3)


def print_config(config_path, overrides) -> int:
    from trainer.config import describe, load_config

    print(describe(load_config(config_path, overrides)), end="")
    return 0


def run_dry(config_path, overrides, ds_config_path: str) -> int:
    """The checks of a real run (config, DeepSpeed JSON, layout against the model and batch), for the world
    the layout asks for, then every rank's instruction list."""
    from trainer.config import load_config
    from trainer.parallel.deepspeed_json import load_ds_config
    from trainer.parallel.layout import layout_world
    from trainer.parallel.schedule import format_schedule, global_programs
    from trainer.training.build import plan

    from trainer.parallel.layout import LayoutSpec
    from trainer.ds_config import bf16_auto, with_bf16
    from trainer.parallel.runtime import accelerator_name, launched_world
    from trainer.training import auto_layout, tuning

    cfg = load_config(config_path, overrides)
    loaded = load_ds_config(ds_config_path, None)
    world = launched_world()[1] if auto_layout.requested(loaded) else layout_world(loaded)
    _, spec = plan(cfg, ds_config_path, world=world)
    if not isinstance(spec, LayoutSpec):  # parallel_layout auto: what a run of this world would choose
        if bf16_auto(loaded):  # in the precision it would choose (trainer.training.build.Build.start_runtime)
            on, line = tuning.bf16_choice(accelerator_name()[0], cfg.model.hidden)
            loaded = with_bf16(loaded, on)
            print(line)
        spec, choice = auto_layout.choose(cfg, loaded, spec)
        print("\n".join(choice.lines))
    print(f"mode={spec.mode} num_pp={spec.num_pp} num_dp={spec.num_dp} micro_batches={spec.micro_batches} "
          f"time_chunks={spec.time_chunks} head_parallel={spec.head_parallel}")
    print(format_schedule(global_programs(spec)))
    return 0


def train_main(config_path, overrides, ds_config_path) -> int:
    from trainer.config import check_threads, check_wandb_environment, load_config
    from trainer.data import load_run_data
    from trainer.parallel.runtime import is_comm_failure
    from trainer.training.build import Build, plan

    cfg = load_config(config_path, overrides)
    check_threads(cfg.train.threads)
    check_wandb_environment(cfg)
    ds, spec = plan(cfg, ds_config_path)  # a bad config or layout fails here, before any process talks
    data = load_run_data(cfg.data.dir, cfg.data.verify)  # and damaged data: checked as it is loaded, once
    build = Build(cfg, ds, spec, data)
    try:
        build.trainer().fit()
    except Exception as e:
        if is_comm_failure(e):
            _lost_peer_exit(e, cfg, build.runtime)
        build.abandon()
        raise
    build.close()
    return 0

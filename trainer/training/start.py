"""What a run does with its directory before its first step: rank 0 holds run.dir (one trainer per run.dir),
checks that none of the names the run writes is a link or a special file, asks the checkpointer what to resume
from and, for a new run, checks that it may write there; every rank gets that answer or its error. Then rank 0
writes the run's own files and every rank checks that it sees them. Once a checkpoint is restored: the length of
its LR schedule against this run's (train.resume_schedule)."""
from __future__ import annotations

import json
import os

from data_prep.dataformat import OutputDirError, files
from trainer.artifacts import run_files
from trainer.artifacts.run_dir import (CKPT_DIR, CONFIG, DATA_MANIFEST, DS_CONFIG, RUN_DIR_DIRS, RUN_DIR_FILES,
                                       RUN_FILES, check_new_run_dir)
from trainer.checkpoint.checkpointer import CheckpointError
from trainer.config import schedule_steps, to_yaml


def open_run_dir(runtime, run_cfg, resume: str, checkpointer, log=print) -> str | None:
    """The checkpoint to resume from (`resume`: train.resume), or None for a new run; the same answer, or the
    same CheckpointError, on every rank."""
    answer = (None, None)
    if runtime.is_rank0:
        try:
            run_files.check_run_dir(run_cfg.dir, RUN_DIR_FILES, RUN_DIR_DIRS)
            note = run_files.lock_run_dir(run_cfg.dir)
            if note:
                log(note)
            found = checkpointer.choose(resume, log=log)
            if found is None:
                check_new_run_dir(run_cfg.dir, run_cfg.overwrite)
            answer = (found, None)
        except (CheckpointError, OutputDirError, run_files.RunDirBusy) as e:
            answer = (None, str(e))
        except OSError as e:  # the file layer's one line (a read-only or full run.dir, a link where we write)
            answer = (None, str(files.failed(run_cfg.dir, "use run.dir", e)))
    found, error = runtime.broadcast_object(answer, src=0)
    if error:
        raise CheckpointError(error)
    return found


def write_run_files(cfg, ds: dict, manifest: dict) -> None:
    """Rank 0: the run's own files (regular files of run.dir only: trainer.artifacts.run_files)."""
    run_dir = cfg.run.dir
    run_files.make_dirs(run_dir, CKPT_DIR)
    run_files.write_text(run_dir, CONFIG, to_yaml(cfg))
    write_ds_config(run_dir, ds)
    run_files.write_text(run_dir, DATA_MANIFEST, json.dumps(manifest, indent=1))
    for name in RUN_FILES:  # the run translates on its own, even if DATA_DIR moves
        model = files.read_bytes(os.path.join(cfg.data.dir, name), run_files.MAX_SPM_BYTES,
                                 "a SentencePiece model of data.dir")
        run_files.write_bytes(run_dir, name, model)


def check_shared_run_dir(runtime, run_dir: str) -> None:
    """Every rank writes its checkpoint files into run.dir: on several nodes it must be one shared directory.
    Found at start, not at the first save hours later."""
    sees = os.path.exists(os.path.join(run_dir, CONFIG))
    blind = [(r, p["host"]) for r, (ok, p) in enumerate(zip(runtime.all_gather_object(sees), runtime.peers)) if not ok]
    if blind:
        where = ", ".join(f"rank {r} on {h}" for r, h in blind)
        raise ValueError(f"run.dir={run_dir}: {where} does not see the run directory rank 0 created; every "
                         f"node needs it on a shared filesystem at the same path")


def write_ds_config(run_dir: str, ds: dict) -> None:
    run_files.write_text(run_dir, DS_CONFIG, json.dumps(ds, indent=1))


def resume_schedule(train_cfg, ds: dict, state, engine, ckpt: str | None) -> list[str]:
    """A resumed run whose LR schedule spanned another number of steps than this run's (train.max_steps or
    train.schedule_steps changed since): go on with the checkpoint's schedule (train.resume_schedule=keep) or span
    it over this run's (stretch). Every rank sets its engine's scheduler; `ds` (the run's DeepSpeed JSON) gets the
    length that applies. Returns one line saying which, what the learning rate is now, and how to choose the other."""
    if ckpt is None or engine.lr_schedule_length() is None:
        return []
    now = engine.lr_schedule_length()
    then = state.lr_schedule_steps or schedule_steps(state.config.get("train", {}))  # (before it was recorded)
    if not then or then == now:
        return []
    lr_then, lr_now = engine.set_lr_schedule_length(then), engine.set_lr_schedule_length(now)
    keep = train_cfg.resume_schedule == "keep"
    engine.set_lr_schedule_length(then if keep else now)
    ds["scheduler"]["params"]["total_num_steps"] = then if keep else now
    where = f"{os.path.basename(os.path.normpath(ckpt))} was trained on an LR schedule of {then} steps, this run's " \
            f"spans {now}"
    if keep:
        past = f", so steps {then + 1}-{train_cfg.max_steps} run past its end" if train_cfg.max_steps > then else ""
        return [f"resume: {where}; kept at {then} (train.resume_schedule=keep){past}; the next step's learning rate: "
                f"{lr_then:.2e}. train.resume_schedule=stretch spans it over {now} steps instead (the next step's "
                f"learning rate: {lr_now:.2e})"]
    return [f"resume: {where}; stretched to {now} (train.resume_schedule=stretch): the next step's learning rate is "
            f"{lr_now:.2e}, where the checkpoint's schedule gives {lr_then:.2e}. train.resume_schedule=keep goes on "
            f"with the checkpoint's schedule instead"]

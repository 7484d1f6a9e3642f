"""Continuing a run (`train.resume`): which checkpoint, whether it fits this run, and loading it."""
from __future__ import annotations

import os
from dataclasses import dataclass

from data_prep.dataformat import OutputDirError, check_output_dir, json_marker, userfiles
from trainer.artifacts import checkpoint, run_files
from trainer.artifacts.run_dir import METRICS, RUN_DIR_DIRS, RUN_DIR_FILES, RUN_DIR_MARKER, RUN_DIR_NAMES
from trainer.parallel.layout import LayoutSpec
from trainer.training.state import TrainState, reseed




def check_new_run_dir(run_dir: str, overwrite: bool) -> None:
    """A new run writes only into a new or empty run.dir, or an earlier run's own (never into a directory
    holding files the trainer did not write, unless run.overwrite=true); its old metrics are dropped."""
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise OutputDirError(f"run.dir={run_dir}: exists and is not a directory")
    check_output_dir(run_dir, owned=RUN_DIR_NAMES, marker=RUN_DIR_MARKER, is_marker_ours=json_marker(["checksum"]),
                     overwrite=overwrite, flag="run.overwrite=true", program="the trainer",
                     leftovers=[run_files.LOCK_FILE])
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.isfile(metrics) and not os.path.islink(metrics):
        os.remove(metrics)  # an earlier run's rows (it saved no checkpoint): this run starts the file anew


@dataclass(frozen=True)
class RunIdentity:
    """What makes a checkpoint's run this run: a resume onto anything else is refused unless forced."""

    model: dict  # the model config (plain values)
    data_dir: str
    data_checksum: str | None
    batching: dict  # what fixes the sequence of global batches (Session.batching)
    seed: int
    force: bool  # train.resume_force


def find(rt, run_dir: str, which: str, overwrite: bool, log=print) -> str | None:
    """Rank 0 holds run.dir for the run (one trainer per run.dir), checks that none of the names the run
    writes is a link or a special file, picks the checkpoint (`which`: train.resume), checks that a new run
    may write into run.dir (`overwrite`: run.overwrite), and every rank gets its answer or its error."""
    answer = (None, None)
    if rt.is_rank0:
        try:
            run_files.check_run_dir(run_dir, RUN_DIR_FILES, RUN_DIR_DIRS)
            note = run_files.lock_run_dir(run_dir)
            if note:
                log(note)
            existing = checkpoint.complete_checkpoints(run_dir)
            found = None
            if which:
                found = checkpoint.find_resume(run_dir, which, log=log)
                if found is None:
                    log(f"resume: {checkpoint.root(run_dir)} holds no usable checkpoint; starting from scratch")
            elif existing:
                raise checkpoint.CheckpointError(
                    f"run.dir={run_dir} already holds checkpoints (newest {existing[-1]}): continue "
                    f"that run with train.resume=auto, or choose another run.dir")
            if found is None:
                check_new_run_dir(run_dir, overwrite)
            answer = (found, None)
        except (checkpoint.CheckpointError, OutputDirError, run_files.RunFileError, run_files.RunDirBusy) as e:
            answer = (None, str(e))
    found, error = rt.broadcast_object(answer, src=0)
    if error:
        raise checkpoint.CheckpointError(error)
    return found


def check_compatible(identity: RunIdentity, ckpt: str, ts: TrainState) -> list[str]:
    """What differs between the checkpoint's run and this one; refused unless train.resume_force."""
    problems = []
    model_now = identity.model
    model_then = ts.config.get("model", {})
    diff = [f"model.{k}: {model_then.get(k)!r} -> {v!r}" for k, v in model_now.items() if model_then.get(k) != v]
    if diff:
        problems.append("model config differs (" + ", ".join(diff) + ")")
    if ts.data_checksum != identity.data_checksum:
        problems.append(f"training data differs: the checkpoint's data checksum is {ts.data_checksum[:12]}..., "
                        f"{identity.data_dir} has {str(identity.data_checksum)[:12]}...")
    now = identity.batching
    diff = [f"{k}: {ts.batching.get(k)!r} -> {v!r}" for k, v in now.items() if ts.batching.get(k) != v]
    if diff:
        problems.append("batching differs, so the saved data position would be meaningless (" + ", ".join(diff) + ")")
    if problems and not identity.force:
        raise checkpoint.CheckpointError(f"cannot resume from {ckpt}: " + "; ".join(problems) +
                                         ". Set train.resume_force=true to resume anyway.")
    return problems


def load(ckpt: str, *, identity: RunIdentity, rt, engine, persist, stream, run_dir: str
         ) -> tuple[TrainState, list[str]]:
    """Load `ckpt` into this rank (weights and optimizer through `persist`, the engine's LR schedule and
    counters, the data position of `stream`, RNG); returns its TrainState and what to tell the user."""
    ts = TrainState.from_dict(checkpoint.read_json(os.path.join(ckpt, checkpoint.TRAIN_STATE)))
    notes = [f"resume: from {ckpt} (step {ts.step})"]
    notes += [f"resume: FORCED although {p}" for p in check_compatible(identity, ckpt, ts)]
    spec = rt.spec
    same_layout = LayoutSpec.from_dict(ts.layout) == spec and ts.world_size == rt.world_size
    error = None
    try:  # every rank loads its own layers: all of them learn of any rank's failure, or the others would wait
        persist.load(ckpt, ts.optimizer, same_layout)
    except checkpoint.CheckpointError as e:
        error = str(e)
    errors = [e for e in rt.all_gather_object(error) if e]
    if errors:
        forced = (" (train.resume_force=true resumes onto other data, batching or model settings, but weights of "
                  "another shape cannot be loaded: start a new run)" if identity.force else "")
        raise checkpoint.CheckpointError(f"cannot resume from {ckpt}: {errors[0]}{forced}")
    if not same_layout:
        reseed(identity.seed, ts.step, rt.rank)
        then = ts.layout
        notes.append(f"resume: layout changed ({then.get('mode')} {then.get('num_pp')}x{then.get('num_dp')} on "
                     f"{ts.world_size} ranks -> {spec.mode} {spec.num_pp}x{spec.num_dp}): weights and optimizer "
                     f"state restored, RNG streams reseeded")
    engine.load_lr_scheduler_state(ts.lr_scheduler)
    engine.load_counters(ts.engine, ts.step)
    stream.load_state_dict(ts.stream)  # forced with other batching: same epoch and batch count
    if rt.is_rank0:
        note = truncate_metrics(os.path.join(run_dir, METRICS), ts.step)
        if note:
            notes.append(f"resume: {note}")
    return ts, notes


def truncate_metrics(path: str, step: int) -> str | None:
    """Drop rows a crashed run logged after the checkpoint it resumes from (they are re-run), and rows that
    are not whole JSON objects: a write cut short (a full disk, a kill mid-write) leaves its last row torn.
    Says what it dropped besides the later steps, or None."""
    if not os.path.exists(path):
        return None
    rows, torn = [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = userfiles.parse_json(line, path, line=number)  # a torn, repeated-key or too deep row
                if not isinstance(row, dict):
                    raise ValueError("not an object")
            except ValueError:
                torn.append(number)
                continue
            if row.get("step", 0) <= step:
                rows.append(line if line.endswith("\n") else line + "\n")
    with run_files.open_write(os.path.dirname(path), os.path.basename(path) + ".tmp") as f:
        f.writelines(rows)
    os.replace(path + ".tmp", path)
    if not torn:
        return None
    where = ", ".join(map(str, torn[:5])) + (" ..." if len(torn) > 5 else "")
    return (f"{path}: dropped {len(torn)} unreadable row(s) (line {where}; a write cut short, e.g. by a full "
            f"disk)")

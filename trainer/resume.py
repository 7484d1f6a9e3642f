"""Continuing a run (`train.resume`): which checkpoint, whether it fits this run, and loading it."""
from __future__ import annotations

import json
import os

from omegaconf import OmegaConf

from trainer import checkpoint
from trainer.parallel.layout import LayoutSpec
from trainer.state import TrainState, reseed


def find(session, log=print) -> str | None:
    """Rank 0 picks the checkpoint (train.resume) and every rank gets its answer or its error."""
    rt, cfg, run_dir = session.runtime, session.cfg, session.run_dir
    answer = (None, None)
    if rt.is_rank0:
        try:
            which, existing = cfg.train.resume, checkpoint.complete_checkpoints(run_dir)
            if which:
                found = checkpoint.find_resume(run_dir, which, log=log)
                if found is None:
                    log(f"resume: {checkpoint.root(run_dir)} holds no usable checkpoint; starting from scratch")
                answer = (found, None)
            elif existing:
                raise checkpoint.CheckpointError(
                    f"run.dir={run_dir} already holds checkpoints (newest {existing[-1]}): continue "
                    f"that run with train.resume=auto, or choose another run.dir")
        except checkpoint.CheckpointError as e:
            answer = (None, str(e))
    found, error = rt.broadcast_object(answer, src=0)
    if error:
        raise checkpoint.CheckpointError(error)
    return found


def check_compatible(session, ckpt: str, ts: TrainState) -> list[str]:
    """What differs between the checkpoint's run and this one; refused unless train.resume_force."""
    cfg, manifest = session.cfg, session.manifest
    problems = []
    model_now = OmegaConf.to_container(cfg.model)
    model_then = ts.config.get("model", {})
    diff = [f"model.{k}: {model_then.get(k)!r} -> {v!r}" for k, v in model_now.items() if model_then.get(k) != v]
    if diff:
        problems.append("model config differs (" + ", ".join(diff) + ")")
    if ts.data_checksum != manifest.get("checksum"):
        problems.append(f"training data differs: the checkpoint's data checksum is {ts.data_checksum[:12]}..., "
                        f"{cfg.data.dir} has {str(manifest.get('checksum'))[:12]}...")
    now = session.batching()
    diff = [f"{k}: {ts.batching.get(k)!r} -> {v!r}" for k, v in now.items() if ts.batching.get(k) != v]
    if diff:
        problems.append("batching differs, so the saved data position would be meaningless (" + ", ".join(diff) + ")")
    if problems and not cfg.train.resume_force:
        raise checkpoint.CheckpointError(f"cannot resume from {ckpt}: " + "; ".join(problems) +
                                         ". Set train.resume_force=true to resume anyway.")
    return problems


def load(session, ckpt: str) -> tuple[TrainState, list[str]]:
    """Load `ckpt` into this rank (weights, optimizer, LR schedule, counters, data position, RNG);
    returns its TrainState and what to tell the user."""
    rt, engine = session.runtime, session.engine
    ts = TrainState.from_dict(checkpoint.read_json(os.path.join(ckpt, checkpoint.TRAIN_STATE)))
    notes = [f"resume: from {ckpt} (step {ts.step})"]
    notes += [f"resume: FORCED although {p}" for p in check_compatible(session, ckpt, ts)]
    spec = rt.spec
    same_layout = LayoutSpec.from_dict(ts.layout) == spec and ts.world_size == rt.world_size
    session.persist.load(ckpt, ts.optimizer, same_layout)
    if not same_layout:
        reseed(session.cfg.train.seed, ts.step, rt.rank)
        then = ts.layout
        notes.append(f"resume: layout changed ({then.get('mode')} {then.get('num_pp')}x{then.get('num_dp')} on "
                     f"{ts.world_size} ranks -> {spec.mode} {spec.num_pp}x{spec.num_dp}): weights and optimizer "
                     f"state restored, RNG streams reseeded")
    engine.load_lr_scheduler_state(ts.lr_scheduler)
    engine.load_counters(ts.engine, ts.step)
    session.stream.load_state_dict(ts.stream)  # forced with other batching: same epoch and batch count
    if rt.is_rank0:
        truncate_metrics(os.path.join(session.run_dir, "metrics.jsonl"), ts.step)
    return ts, notes


def truncate_metrics(path: str, step: int) -> None:
    """Drop rows a crashed run logged after the checkpoint it resumes from (they are re-run)."""
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        rows = [line for line in f if line.strip() and json.loads(line).get("step", 0) <= step]
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(rows)
    os.replace(path + ".tmp", path)

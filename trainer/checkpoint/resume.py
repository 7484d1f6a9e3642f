"""Continuing a run (`train.resume`): which checkpoint, and whether it fits this run."""
from __future__ import annotations

from dataclasses import dataclass

from trainer.checkpoint import files as checkpoint
from trainer.checkpoint.state import TrainState


@dataclass(frozen=True)
class RunIdentity:
    """What makes a checkpoint's run this run: a resume onto anything else is refused unless forced."""

    model: dict  # the model config (plain values)
    data_dir: str
    data_checksum: str | None
    batching: dict  # what fixes the sequence of global batches (trainer.training.build.batching)
    seed: int
    force: bool  # train.resume_force


def choose(run_dir: str, which: str, log=print) -> str | None:
    """Rank 0: the checkpoint to resume from (`which`: train.resume; '' starts a new run), or None. A new run
    refuses a run.dir that already holds checkpoints."""
    if which:
        found = checkpoint.find_resume(run_dir, which, log=log)
        if found is None:
            log(f"resume: {checkpoint.root(run_dir)} holds no usable checkpoint; starting from scratch")
        return found
    existing = checkpoint.complete_checkpoints(run_dir)
    if existing:
        raise checkpoint.CheckpointError(
            f"run.dir={run_dir} already holds checkpoints (newest {existing[-1]}): continue "
            f"that run with train.resume=auto, or choose another run.dir")
    return None


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

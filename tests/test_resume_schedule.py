"""A resume whose LR schedule spanned another number of steps than the run now asks for (issue 30, part B item 4):
resuming a finished run of 3000 steps with train.max_steps=6000 re-stretched the schedule silently (LR 1.7e-6 at
step 3000, 1.35e-4 at 3020). Now the checkpoint's schedule goes on (train.resume_schedule=keep, the default) or is
spanned over the new length (stretch), said in one line either way, with the other choice named."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from deepspeed.runtime.lr_schedules import WarmupDecayLR

from tests.conftest import read_metrics
from tests.test_reliability import SINGLE, ds_config, train
from trainer.checkpoint.state import TrainState
from trainer.config import load_config
from trainer.parallel import deepspeed_adapter as dsa
from trainer.training.start import resume_schedule


def _engine(total: int, step: int) -> dsa.Engine:
    """The adapter's Engine around DeepSpeed's own WarmupDecayLR (the issue's schedule), at `step`."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    scheduler = WarmupDecayLR(optimizer, total, warmup_max_lr=2e-3, warmup_num_steps=100, warmup_type="linear")
    scheduler.load_state_dict({"last_batch_iteration": step})
    engine = object.__new__(dsa.Engine)  # only its scheduler is used here
    engine.ds = SimpleNamespace(lr_scheduler=scheduler)
    return engine


@pytest.mark.parametrize("choice", ["keep", "stretch"])
def test_a_longer_run_keeps_or_stretches_the_checkpoints_schedule_and_says_so(choice):
    train_cfg = load_config(None, ["train.max_steps=6000", f"train.resume_schedule={choice}"]).train
    engine = _engine(6000, 3000)  # built for this run: 6000 steps
    ds = {"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 6000}}}
    state = TrainState(step=3000, lr_schedule_steps=3000)
    [line] = resume_schedule(train_cfg, ds, state, engine, "/runs/x/checkpoints/step_00003000")
    kept = engine.lr_schedule_length() == 3000
    assert kept == (choice == "keep") and ds["scheduler"]["params"]["total_num_steps"] == (3000 if kept else 6000)
    assert "step_00003000 was trained on an LR schedule of 3000 steps, this run's spans 6000" in line
    if kept:
        assert "kept at 3000 (train.resume_schedule=keep), so steps 3001-6000 run past its end; the next step's " \
               "learning rate: 0.00e+00. train.resume_schedule=stretch spans it over 6000 steps instead (the next " \
               "step's learning rate: 1.02e-03)" in line
    else:
        assert "stretched to 6000 (train.resume_schedule=stretch): the next step's learning rate is 1.02e-03, where " \
               "the checkpoint's schedule gives 0.00e+00. train.resume_schedule=keep goes on" in line


def test_a_schedule_of_the_same_length_or_a_checkpoint_that_did_not_record_it():
    train_cfg = load_config(None, ["train.max_steps=6000"]).train
    ds = {"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 6000}}}
    engine = _engine(6000, 3000)
    assert resume_schedule(train_cfg, ds, TrainState(step=3000, lr_schedule_steps=6000), engine, "c") == []
    assert resume_schedule(train_cfg, ds, TrainState(step=0), engine, None) == []  # a new run
    older = TrainState(step=3000, config={"train": {"max_steps": 3000, "schedule_steps": 0}})  # before it was recorded
    assert "an LR schedule of 3000 steps" in resume_schedule(train_cfg, ds, older, engine, "c")[0]
    assert engine.lr_schedule_length() == 3000


@pytest.mark.slow
def test_resuming_a_finished_run_for_longer_keeps_its_schedule_unless_told_to_stretch(tiny_data, tmp_path):
    """Through the CLI: a run of 4 steps (warm-up 3), resumed to 8. keep: the learning rate stays where the schedule
    ended (0); stretch: it rises again; either way one line says so, and the next checkpoint records the length."""
    import shutil

    ds = ds_config(tmp_path, SINGLE)
    train(tiny_data, tmp_path / "run", 1, ds, "train.max_steps=4")
    shutil.copytree(tmp_path / "run", tmp_path / "stretched")
    kept = train(tiny_data, tmp_path / "run", 1, ds, "train.max_steps=8", "train.resume=auto")
    assert "an LR schedule of 4 steps, this run's spans 8; kept at 4 (train.resume_schedule=keep)" in kept.stdout
    lr = {r["step"]: r["lr"] for r in read_metrics(tmp_path / "run")}
    assert [lr[s] for s in range(5, 9)] == [0.0] * 4, lr
    state = json.loads((tmp_path / "run" / "checkpoints" / "step_00000008" / "train_state.json").read_text())
    assert state["lr_schedule_steps"] == 4
    assert json.loads((tmp_path / "run" / "ds_config.json").read_text())["scheduler"]["params"]["total_num_steps"] == 4
    stretched = train(tiny_data, tmp_path / "stretched", 1, ds, "train.max_steps=8", "train.resume=auto",
                      "train.resume_schedule=stretch")
    assert "stretched to 8 (train.resume_schedule=stretch)" in stretched.stdout
    lr = {r["step"]: r["lr"] for r in read_metrics(tmp_path / "stretched")}
    assert all(lr[s] > 0 for s in range(5, 8)), lr


def test_a_checkpoint_written_before_the_length_was_recorded_still_restores():
    from trainer.checkpoint.files import CheckpointError
    from trainer.checkpoint.structure import train_state

    data = TrainState(step=7, stream={"epoch": 0, "index": 7}, config={"train": {"max_steps": 9}}).to_dict()
    assert train_state(data, "ts.json").lr_schedule_steps == 0
    del data["lr_schedule_steps"]
    assert train_state(data, "ts.json").lr_schedule_steps == 0  # its default: the length comes from its config
    del data["lr_scheduler"]
    with pytest.raises(CheckpointError, match="ts.json: no 'lr_scheduler'"):  # the others are still required
        train_state(data, "ts.json")
    data["lr_scheduler"], data["lr_schedule_steps"] = {}, "9"
    with pytest.raises(CheckpointError, match="'lr_schedule_steps' is '9', expected an integer"):
        train_state(data, "ts.json")

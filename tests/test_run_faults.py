"""Issue 22, items 15, 16 and 18 (resume): faults that used to lose work or crash late.

* a full disk while logging: metrics.jsonl is never left cut mid-row, training stops after saving the current
  step, and a torn last row (a kill mid-write) is dropped and counted on resume instead of failing it;
* corrupt binarized data (ids outside the vocabulary) is refused at start naming the file and position, and
  `data.verify=checksums` compares every file with the manifest;
* a forced resume onto weights of another shape is one line naming the tensor, not a size-mismatch traceback.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import REPO, read_metrics, run_cli
from trainer.checkpoint import files as checkpoint
from trainer.config import load_config
from trainer.data import read_manifest, verify
from trainer.observe.logger import RunLogger
from trainer.training.faults import parse
from trainer.observe.logger import truncate_metrics


# ---- item 15: logging on a full disk, a torn last row ----------------------------------------------------

def test_a_row_that_hits_a_full_disk_is_cut_back_and_the_logger_says_why(tmp_path):
    cfg = load_config(None, ["logging.wandb_mode=disabled", "logging.progress=false"])
    log = RunLogger(str(tmp_path), cfg, 10, faults=parse("lognospace@3"))
    for step in range(1, 6):
        log.log({"step": step, "loss": 1.0, "ppl": 2.7, "lr": 1e-3, "tokens_per_s": 1.0})
    log.close()
    text = (tmp_path / "metrics.jsonl").read_text()
    assert [json.loads(line)["step"] for line in text.splitlines()] == [1, 2]  # whole rows only; none after
    assert text.endswith("\n")
    assert log.failed == f"writing {tmp_path / 'metrics.jsonl'} failed at step 3: No space left on device (HNMT_FAULTS)"


def test_a_torn_last_row_is_dropped_and_counted_on_resume(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = "".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 6))
    path.write_text(rows + '{"step": 6, "loss": 0.9, "lr"')  # what a write cut short leaves behind
    note = truncate_metrics(str(path), 4)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3, 4]
    assert note == f"{path}: dropped 1 unreadable row(s) (line 6; a write cut short, e.g. by a full disk)"
    assert truncate_metrics(str(path), 4) is None  # nothing left to drop


@pytest.fixture(scope="module")
def ds_single(tmp_path_factory) -> Path:
    ds = json.loads((REPO / "ds_configs" / "single.json").read_text())
    ds.update(train_micro_batch_size_per_gpu=16, bf16={"enabled": False})
    ds["scheduler"]["params"].update(warmup_num_steps=3)
    path = tmp_path_factory.mktemp("ds") / "single.json"
    path.write_text(json.dumps(ds))
    return path


def train(data, run, ds, *overrides, faults: str = "", check: bool = True):
    args = [sys.executable, "launch/train.py", "--deepspeed_config", ds, f"data.dir={data}", f"run.dir={run}",
            "model.layers=2", "model.emb_dim=16", "model.hidden=16", "train.seed=7", "train.eval_every=100",
            "train.log_every=1", "train.threads=1", "decode.dev_max_sentences=8", "logging.wandb_mode=disabled",
            "logging.progress=false", *overrides]
    return run_cli(args, timeout=300, check=check, env_extra={"HNMT_FAULTS": faults} if faults else None)


@pytest.mark.slow
def test_logging_on_a_full_disk_stops_after_a_checkpoint_and_resumes(tiny_data, tmp_path, ds_single):
    run = tmp_path / "run"
    proc = train(tiny_data, run, ds_single, "train.max_steps=8", faults="lognospace@3", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert (f"error: writing {run / 'metrics.jsonl'} failed at step 3: No space left on device (HNMT_FAULTS); "
            f"saved step_00000004 and stopped: free some space and continue with train.resume=auto") in proc.stderr
    assert checkpoint.read_pointer(str(run), "latest") == "step_00000004"
    assert [r["step"] for r in read_metrics(run)] == [1, 2]
    with open(run / "metrics.jsonl", "a") as f:  # and a crash mid-row on top of it
        f.write('{"step": 3, "lo')
    proc = train(tiny_data, run, ds_single, "train.max_steps=6", "train.resume=auto")
    out = proc.stdout + proc.stderr
    assert "resume: from" in out and "dropped 1 unreadable row(s) (line 3" in out
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 5, 6]  # 3 and 4 were lost with the disk, never torn


# ---- item 16: corrupt binarized data -------------------------------------------------------------------------

def _copy_data(tiny_data, tmp_path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    return data


def test_token_ids_outside_the_vocabulary_are_found_at_start_with_their_position(tiny_data, tmp_path):
    data = _copy_data(tiny_data, tmp_path)
    manifest = read_manifest(str(data))
    verify(str(data), manifest)  # the prepared data passes
    tokens = np.fromfile(data / "train.tgt.bin", dtype="<i4")
    offsets = np.fromfile(data / "train.tgt.idx", dtype="<i8")
    at = int(offsets[7]) + 2  # the third token of sentence 7
    tokens[at] = 1 << 24 | tokens[at]  # one flipped high byte
    tokens.tofile(data / "train.tgt.bin")
    with pytest.raises(ValueError, match=rf"train.tgt.bin: token {at} \(sentence 7, its token 2\) has id "
                                         rf"{tokens[at]}, outside the target vocabulary of "
                                         rf"{manifest['vocab']['tgt_size']} pieces"):
        verify(str(data), manifest)
    verify(str(data), manifest, "none")  # checked only when asked


def test_checksums_name_the_changed_file(tiny_data, tmp_path):
    data = _copy_data(tiny_data, tmp_path)
    manifest = read_manifest(str(data))
    assert set(manifest["file_sha256"]) == set(manifest["checksum_files"])
    verify(str(data), manifest, "checksums")
    ids = np.fromfile(data / "dev.src.bin", dtype="<i4")
    ids[[0, 1]] = ids[[1, 0]]  # still inside the vocabulary: only the checksum can tell
    ids.tofile(data / "dev.src.bin")
    verify(str(data), manifest, "ids")
    with pytest.raises(ValueError, match=r"dev.src.bin: sha256 differs from the data manifest's"):
        verify(str(data), manifest, "checksums")
    older = {k: v for k, v in manifest.items() if k != "file_sha256"}  # a manifest from before per-file hashes
    with pytest.raises(ValueError, match=r"do not match the manifest's checksum"):
        verify(str(data), older, "checksums")


def test_the_trainer_refuses_corrupt_data_before_building_anything(tiny_data, tmp_path):
    from trainer.training.cli import train_main

    data = _copy_data(tiny_data, tmp_path)
    tokens = np.fromfile(data / "train.src.bin", dtype="<i4")
    tokens[5] = -7
    tokens.tofile(data / "train.src.bin")
    with pytest.raises(ValueError, match=r"train.src.bin: token 5 .* has id -7, outside the source vocabulary"):
        train_main(None, [f"data.dir={data}", f"run.dir={tmp_path / 'run'}"], str(REPO / "ds_configs" / "single.json"))
    assert not (tmp_path / "run").exists()


# ---- item 18: a forced resume onto weights of another shape ----------------------------------------------------

def test_weights_of_another_shape_are_one_error_naming_the_tensor(tmp_path):
    from trainer.checkpoint import structure

    small, wide = torch.nn.Linear(4, 3), torch.nn.Linear(4, 5)
    path = tmp_path / "layer_00-model_states.pt"
    torch.save(small.state_dict(), path)
    with pytest.raises(checkpoint.CheckpointError, match=r"weight has shape \(3, 4\), this run's model needs \(5, 4\)"):
        structure.weights(checkpoint.load(str(path)), wide, str(path))
    structure.weights(checkpoint.load(str(path)), torch.nn.Linear(4, 3), str(path))


@pytest.mark.slow
def test_a_forced_resume_onto_another_hidden_size_is_one_line(tiny_data, tmp_path, ds_single):
    run = tmp_path / "run"
    train(tiny_data, run, ds_single, "train.max_steps=2")
    proc = train(tiny_data, run, ds_single, "train.max_steps=4", "train.resume=auto", "train.resume_force=true",
                 "model.hidden=24", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "has shape" in error[0] and "this run's model needs" in error[0]
    assert "weights of another shape cannot be loaded: start a new run" in error[0]


# ---- item 7: a run without a dev set says so -------------------------------------------------------------------

@pytest.mark.slow
def test_training_without_a_dev_set_says_no_dev_set(tiny_data, tmp_path, ds_single):
    data = _copy_data(tiny_data, tmp_path)
    for path in data.glob("dev.*"):
        path.unlink()
    proc = train(data, tmp_path / "run", ds_single, "train.max_steps=2", "train.eval_every=1")
    out = proc.stdout + proc.stderr
    assert "done: step 2, no dev set (no dev BLEU)" in out and "-1.00" not in out

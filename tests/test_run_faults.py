"""Issue 22, items 15, 16 and 18 (resume): faults that used to lose work or crash late.

* a full disk while logging: metrics.jsonl is never left cut mid-row, training stops after saving the current
  step, and a torn last row (a kill mid-write) is dropped and counted on resume instead of failing it;
* corrupt binarized data (ids outside the vocabulary) is refused at start naming the file and position, and
  `data.verify=checksums` compares every file with the manifest; data that disagrees with its manifest (pairs
  cut or added, consistently on both sides) and data files that are FIFOs or devices are refused (issue 30);
* a forced resume onto weights of another shape is one line naming the tensor, not a size-mismatch traceback.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import REPO, read_metrics, run_cli
from trainer.checkpoint import files as checkpoint
from trainer.config import load_config, merge_overrides
from data_prep.dataformat import TokenArray, load_pair
from trainer.data import load_run_data, read_manifest, verify
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
            "logging.progress=false"]
    return run_cli(merge_overrides(args, overrides), timeout=300, check=check, env_extra={"HNMT_FAULTS": faults} if faults else None)


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
    load_run_data(str(data))  # the prepared data passes
    tokens = np.fromfile(data / "train.tgt.bin", dtype="<i4")
    offsets = np.fromfile(data / "train.tgt.idx", dtype="<i8")
    at = int(offsets[7]) + 2  # the third token of sentence 7
    tokens[at] = 1 << 24 | tokens[at]  # one flipped high byte
    tokens.tofile(data / "train.tgt.bin")
    for mode in ("ids", "none"):  # whatever data.verify says: the ids are checked as they are loaded
        with pytest.raises(ValueError, match=rf"train.tgt.bin: token {at} \(sentence 7, its token 2\) has id "
                                             rf"{tokens[at]}, outside the target vocabulary of "
                                             rf"{manifest['vocab']['tgt_size']} pieces"):
            load_run_data(str(data), mode)


def _out_of_vocabulary(path: Path, size: int) -> np.ndarray:
    """The same number of ids, each equal to the vocabulary's size: one past the last piece."""
    return np.full(os.path.getsize(path) // 4, size, dtype="<i4")


def test_the_data_checked_is_the_data_loaded(tiny_data, tmp_path, monkeypatch):
    """train.tgt.bin replaced by a same-size file of out-of-vocabulary ids just after data.verify read it: the check
    and the load opened the file separately, and the trainer died in an IndexError. Now the ids are checked on the
    arrays loaded (one open per file), and every batch's ids too (the file is memory-mapped: written over in place
    after the load, the next batch names it)."""
    import trainer.data as data_module

    data = _copy_data(tiny_data, tmp_path)
    size = read_manifest(str(data))["vocab"]["tgt_size"]
    real_verify = data_module.verify

    def verify_then_swap(data_dir, manifest, mode):
        real_verify(data_dir, manifest, mode)
        swapped = data / "swapped.bin"
        _out_of_vocabulary(data / "train.tgt.bin", size).tofile(swapped)
        os.replace(swapped, data / "train.tgt.bin")

    monkeypatch.setattr(data_module, "verify", verify_then_swap)
    with pytest.raises(ValueError, match=rf"train.tgt.bin: token 0 \(sentence 0, its token 0\) has id {size}, "
                                         rf"outside the target vocabulary of {size} pieces"):
        load_run_data(str(data), "checksums")
    monkeypatch.undo()
    data = _copy_data(tiny_data, tmp_path / "b")
    loaded = load_run_data(str(data)).train
    loaded.batch([0, 1])
    with open(data / "train.tgt.bin", "r+b") as f:  # the same file, written over in place while it is mapped
        f.write(_out_of_vocabulary(data / "train.tgt.bin", size).tobytes())
    with pytest.raises(ValueError, match=rf"train.tgt.bin: id {size} in a batch of the train split, outside the "
                                         rf"target vocabulary of {size} pieces: the file was written over"):
        loaded.batch([0, 1])


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


# ---- issue 30, item 4: data that disagrees with its manifest; data files that are not regular files --------------

def _cut_pairs(data: Path, split: str, keep) -> None:
    """Both sides of `split` cut (or grown) consistently to the sentences `keep` picks: .bin and .idx agree."""
    for side in ("src", "tgt"):
        tokens = np.fromfile(data / f"{split}.{side}.bin", dtype="<i4")
        offsets = np.fromfile(data / f"{split}.{side}.idx", dtype="<i8")
        sentences = [tokens[offsets[i]:offsets[i + 1]] for i in keep(len(offsets) - 1)]
        np.concatenate(sentences).astype("<i4").tofile(data / f"{split}.{side}.bin")
        np.concatenate([[0], np.cumsum([len(x) for x in sentences])]).astype("<i8").tofile(data / f"{split}.{side}.idx")


@pytest.mark.parametrize("split,keep,expected", [
    ("train", lambda n: range(n - 1), r"train.src.idx: holds 599 pairs where the data manifest says 600"),  # the issue's
    ("dev", lambda n: [*range(n), n - 1], r"dev.src.idx: holds 41 pairs where the data manifest says 40"),
    ("test", lambda n: [0, *range(2, n), 1], None),  # reordered: same counts and sizes, only a hash can tell
])
def test_data_that_disagrees_with_its_manifest_is_refused_at_start(tiny_data, tmp_path, split, keep, expected):
    data = _copy_data(tiny_data, tmp_path)
    manifest = read_manifest(str(data))
    _cut_pairs(data, split, keep)
    assert all(len(a) > 0 for a in load_pair(str(data), split))  # consistent: the reader alone would take it
    if expected is None:
        verify(str(data), manifest, "ids")
        expected = rf"{split}.src.bin: sha256 differs from the data manifest's"
    for mode in ("ids", "checksums", "full") if "pairs" in expected else ("checksums", "full"):
        with pytest.raises(ValueError, match=expected):
            verify(str(data), manifest, mode)
    verify(str(data), manifest, "none")


def test_token_counts_and_splits_are_checked_by_size(tiny_data, tmp_path):
    data = _copy_data(tiny_data, tmp_path)
    manifest = read_manifest(str(data))
    tokens = np.fromfile(data / "dev.tgt.bin", dtype="<i4")
    offsets = np.fromfile(data / "dev.tgt.idx", dtype="<i8")
    np.append(tokens, tokens[-1]).tofile(data / "dev.tgt.bin")  # the last sentence one token longer
    offsets[-1] += 1
    offsets.tofile(data / "dev.tgt.idx")
    want = manifest["splits"]["dev"]["tokens"]["tgt"]
    with pytest.raises(ValueError, match=rf"dev.tgt.bin: holds {want + 1} tokens where the data manifest says {want}:"):
        verify(str(data), manifest)
    data = _copy_data(tiny_data, tmp_path / "b")
    no_test = {**manifest, "splits": {k: v for k, v in manifest["splits"].items() if k != "test"}}
    with pytest.raises(ValueError, match="test.src.bin: the data manifest lists no test split"):
        verify(str(data), no_test)
    (data / "dev.src.idx").unlink()
    with pytest.raises(ValueError, match=r"dev.src.idx: missing \(the data manifest lists its split\)"):
        verify(str(data), manifest)


def test_full_verification_also_hashes_the_sentencepiece_models(tiny_data, tmp_path):
    data = _copy_data(tiny_data, tmp_path)
    manifest = read_manifest(str(data))
    verify(str(data), manifest, "full")
    model = bytearray((data / "spm.src.model").read_bytes())
    model[-1] ^= 1
    (data / "spm.src.model").write_bytes(bytes(model))
    with pytest.raises(ValueError, match=r"spm.src.model: not a SentencePiece model"):  # every mode reads its size
        verify(str(data), manifest, "checksums")
    with pytest.raises(ValueError, match=r"spm.src.model: sha256 differs from the data manifest's"):
        verify(str(data), manifest, "full")
    assert load_config(None, ["data.verify=full"]).data.verify == "full"


@pytest.mark.timeout(60)  # reading a FIFO would block forever
@pytest.mark.parametrize("name,make,expected", [
    ("train.src.idx", lambda p: os.mkfifo(p), "a data file must be a regular file, not a FIFO"),  # the issue's
    ("train.tgt.bin", lambda p: os.symlink("/dev/zero", p),
     r"a data file must be a regular file, not a character device \(a link to /dev/zero\)"),
    ("dev.src.idx", lambda p: os.mkdir(p), "a data file must be a regular file, not a directory"),
])
def test_a_data_file_that_is_not_a_regular_file_is_refused_unread(tiny_data, tmp_path, name, make, expected):
    data = _copy_data(tiny_data, tmp_path)
    manifest = read_manifest(str(data))
    (data / name).unlink()
    make(data / name)
    split, side = name.split(".")[:2]
    with pytest.raises(ValueError, match=rf"{name}: {expected}"):
        TokenArray.load(str(data), split, side)  # the one place data files are opened: with data.verify=none too
    for mode in ("ids", "checksums"):
        with pytest.raises(ValueError, match=rf"{name}: {expected}"):
            verify(str(data), manifest, mode)


def test_the_trainer_refuses_data_cut_behind_its_manifest_before_building_anything(tiny_data, tmp_path):
    from trainer.training.cli import train_main

    data = _copy_data(tiny_data, tmp_path)
    _cut_pairs(data, "train", lambda n: range(n - 1))
    with pytest.raises(ValueError, match=r"train.src.idx: holds 599 pairs where the data manifest says 600"):
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


@pytest.fixture(scope="module")
def saved_at_2(tiny_data, tmp_path_factory, ds_single) -> Path:
    """A run that saved step 2 and died at step 3 (HNMT_FAULTS die@3:0), before any validation: what the two resumes
    below start from, each on a copy of its own."""
    run = tmp_path_factory.mktemp("saved_at_2") / "run"
    train(tiny_data, run, ds_single, "train.max_steps=4", "train.save_every=2", faults="die@3:0", check=False)
    return run


def _copy_run(run: Path, tmp_path: Path) -> Path:
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


@pytest.mark.slow
def test_a_forced_resume_onto_another_hidden_size_is_one_line(tiny_data, tmp_path, ds_single, saved_at_2):
    run = _copy_run(saved_at_2, tmp_path)
    assert checkpoint.read_pointer(str(run), "latest") == "step_00000002"
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


def test_the_final_line_says_why_there_is_no_dev_bleu():
    """Issue 30 B5: "best dev BLEU -1.00" (TrainState's "none yet") when no validation had run."""
    from trainer.training.loop import dev_bleu_summary

    assert dev_bleu_summary(-1.0, True, 200) == ("no dev BLEU yet (no validation has run: every "
                                                 "train.eval_every=200 steps and at train.max_steps)")
    assert dev_bleu_summary(0.0, True, 200) == "best dev BLEU 0.00"  # a validation that scored 0 did run
    assert dev_bleu_summary(-1.0, False, 200) == "no dev set (no dev BLEU)"


@pytest.mark.slow
def test_a_run_resumed_before_its_first_validation_says_no_dev_bleu_yet(tiny_data, tmp_path, ds_single, saved_at_2):
    run = _copy_run(saved_at_2, tmp_path)
    proc = train(tiny_data, run, ds_single, "train.max_steps=2", "train.resume=auto")
    out = proc.stdout + proc.stderr
    assert "nothing to do: the run is at step 2" in out and "-1.00" not in out, out[-3000:]
    assert "done: step 2, no dev BLEU yet (no validation has run: every train.eval_every=100 steps" in out

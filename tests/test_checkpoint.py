"""Checkpoint files without a training run: checksums, fallback, pruning, the data position, faults."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from trainer.checkpoint import files as ck
from trainer.data import BatchStream
from trainer.training.faults import parse
from trainer.observe.logger import truncate_metrics as _truncate_metrics
from trainer.checkpoint.state import TrainState, capture_rng, restore_rng


def make_checkpoint(run_dir, step: int) -> str:
    """A complete checkpoint as the CollectiveWriter writes it (two files + train_state + meta + manifest)."""
    tmp = ck.begin(str(run_dir), step)
    files = {"layer_00-model_states.pt": ck.write_torch(ck.model_file(tmp, "layer_00"), {"w": torch.randn(4, 3)}),
             "head-model_states.pt": ck.write_torch(ck.model_file(tmp, ck.HEAD), {"b": torch.zeros(3)})}
    files[ck.TRAIN_STATE] = ck.write_json(f"{tmp}/{ck.TRAIN_STATE}", TrainState(step=step).to_dict())
    files[ck.META] = ck.write_json(f"{tmp}/{ck.META}", {"step": step})
    return ck.finalize(str(run_dir), step, files)


def test_a_finalized_checkpoint_verifies_and_is_latest(tmp_path):
    path = make_checkpoint(tmp_path, 3)
    assert ck.verify(path) == []
    assert ck.read_pointer(str(tmp_path), "latest") == "step_00000003"
    assert not (tmp_path / "checkpoints" / "step_00000003.tmp").exists()
    manifest = json.loads((tmp_path / "checkpoints" / "step_00000003" / ck.MANIFEST).read_text())
    assert set(manifest["files"]) == {"layer_00-model_states.pt", "head-model_states.pt", ck.TRAIN_STATE, ck.META}


@pytest.mark.parametrize("damage,expected", [
    (lambda p: p.write_bytes(p.read_bytes()[:-7]), "truncated"),
    (lambda p: p.write_bytes(bytes([p.read_bytes()[0] ^ 1]) + p.read_bytes()[1:]), "sha256 mismatch"),
    (lambda p: p.unlink(), "missing"),
])
def test_verify_names_the_damaged_file(tmp_path, damage, expected):
    path = make_checkpoint(tmp_path, 1)
    target = tmp_path / "checkpoints" / "step_00000001" / "layer_00-model_states.pt"
    damage(target)
    problems = ck.verify(path)
    assert len(problems) == 1 and str(target) in problems[0] and expected in problems[0]


def test_auto_resume_falls_back_past_corrupt_and_unfinished_checkpoints(tmp_path):
    for step in (2, 4, 6):
        make_checkpoint(tmp_path, step)
    ck.begin(str(tmp_path), 8)  # a save that never finished: step_8.tmp
    bad = tmp_path / "checkpoints" / "step_00000006" / "head-model_states.pt"
    bad.write_bytes(b"")
    said = []
    found = ck.find_resume(str(tmp_path), "auto", log=said.append)
    assert found.endswith("step_00000004")
    assert len(said) == 1 and "step_00000006" in said[0] and "falling back" in said[0]
    with pytest.raises(ck.CheckpointError, match="head-model_states.pt"):
        ck.find_resume(str(tmp_path), str(tmp_path / "checkpoints" / "step_00000006"))
    assert ck.find_resume(str(tmp_path / "elsewhere"), "auto") is None


def test_prune_keeps_the_newest_and_the_best(tmp_path):
    for step in (1, 2, 3, 4, 5):
        make_checkpoint(tmp_path, step)
    ck.mark_best(str(tmp_path), 2)
    ck.prune(str(tmp_path), keep_last=2)
    assert ck.complete_checkpoints(str(tmp_path)) == ["step_00000002", "step_00000004", "step_00000005"]


def test_a_failed_save_leaves_no_complete_checkpoint(tmp_path):
    make_checkpoint(tmp_path, 1)
    tmp = ck.begin(str(tmp_path), 2)
    ck.write_torch(ck.model_file(tmp, "layer_00"), {"w": torch.zeros(2)})
    ck.abandon(str(tmp_path), 2)
    assert ck.complete_checkpoints(str(tmp_path)) == ["step_00000001"]
    assert ck.read_pointer(str(tmp_path), "latest") == "step_00000001"
    assert not (tmp_path / "checkpoints" / "step_00000002.tmp").exists()


def test_unreadable_checkpoint_file_is_a_clear_error(tmp_path):
    path = tmp_path / "x.pt"
    path.write_bytes(b"PK\x03\x04 truncated zip")
    with pytest.raises(ck.CheckpointError, match="x.pt: cannot be read"):
        ck.load(str(path))


class _Data:
    def __init__(self, n):
        rng = np.random.default_rng(0)
        self.src_len, self.tgt_len = rng.integers(1, 30, n), rng.integers(1, 30, n)
        self.data_dir = "mem"


def test_batch_stream_resumes_at_the_same_batch_across_epochs():
    """No batch is repeated or skipped: a stream restored from state_dict() yields exactly what the
    original would have, including across an epoch boundary."""
    kw = dict(max_sentences=8, max_tokens=0, seed=3, bucket_batches=4, min_batch=4)
    a = BatchStream(_Data(100), **kw)
    for _ in range(11):
        a.next_indices()
    state = a.state_dict()
    b = BatchStream(_Data(100), **kw)
    b.load_state_dict(json.loads(json.dumps(state)))
    for _ in range(30):  # ~13 batches per epoch: crosses two epoch boundaries
        assert np.array_equal(a.next_indices(), b.next_indices())
    assert a.epoch == b.epoch >= 2


class _Pairs(_Data):
    """_Data with token ids, so that batches can be built (ParallelData.batch)."""

    def batch(self, indices):
        from trainer.data import collate

        return collate([np.full(int(self.src_len[i]), 4 + i % 50) for i in indices],
                       [np.full(int(self.tgt_len[i]), 5 + i % 40) for i in indices])


def test_prefetched_stream_hands_out_the_same_batches_and_the_consumers_position():
    """The prefetcher reads ahead on a thread, but its state is that of the batches handed out: a run
    restored from it continues with exactly the batch the plain stream would give next."""
    from trainer.data import Prefetcher

    kw = dict(max_sentences=8, max_tokens=0, seed=3, bucket_batches=4, min_batch=4)
    plain, ahead = BatchStream(_Pairs(100), **kw), Prefetcher(BatchStream(_Pairs(100), **kw), ahead=3)
    for _ in range(12):
        assert torch.equal(plain.next().src, ahead.next().src)
    assert ahead.state_dict() == plain.state_dict() and ahead.epoch == plain.epoch
    for pending in ahead._queue:  # let the thread finish reading ahead
        pending.result()
    three_on = BatchStream(_Pairs(100), **kw)
    three_on.load_state_dict(plain.state_dict())
    for _ in range(3):
        three_on.next_indices()
    assert ahead._stream.state_dict() == three_on.state_dict() != ahead.state_dict()  # the thread is ahead, not the state
    restored = Prefetcher(BatchStream(_Pairs(100), **kw), ahead=2)
    restored.load_state_dict(json.loads(json.dumps(ahead.state_dict())))
    for _ in range(20):  # across an epoch boundary
        assert torch.equal(plain.next().src, restored.next().src)
    assert restored.epoch == plain.epoch
    ahead.close()
    restored.close()


def test_rng_states_round_trip_through_a_checkpoint_file(tmp_path):
    import random

    state = capture_rng()
    ck.write_torch(str(tmp_path / "rng.pt"), state)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    restore_rng(ck.load(str(tmp_path / "rng.pt")))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_metrics_rows_after_the_resumed_step_are_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, 8)))
    _truncate_metrics(str(path), 4)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3, 4]


def test_fault_spec_parsing():
    f = parse("nan@3, die@5:1,nospace@4")
    assert f.nan_steps == {3} and f.exit_steps_for(1) == {5} and f.exit_steps_for(0) == frozenset()
    assert f.nospace == {4: 0}
    with pytest.raises(ValueError, match="bad item 'boom@1'"):
        parse("boom@1")


def test_a_layer_whose_weights_are_views_of_a_larger_buffer_is_written_compact(tmp_path):
    """ZeRO-1's flat group and a cuDNN stack's flat weights make the weights views of one buffer; torch.save writes a
    view's whole storage, which put that buffer into every layer's file: the layer files hold their own tensors."""
    import io

    from trainer.checkpoint.files import compact, write_torch

    buffer = torch.zeros(100_000)
    state = {"weight": buffer[:10].view(2, 5), "bias": torch.ones(3), "steps": 4}
    entry = write_torch(str(tmp_path / "layer.pt"), compact(state))
    assert entry["bytes"] < 4 * 1024  # 13 floats and the pickle, not 400 kB
    loaded = torch.load(io.BytesIO((tmp_path / "layer.pt").read_bytes()), weights_only=True)
    assert torch.equal(loaded["weight"], state["weight"]) and loaded["steps"] == 4
    assert compact(state)["bias"] is state["bias"]  # a tensor that owns its storage is not copied

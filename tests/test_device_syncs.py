"""A training step never waits on the device but once: the gradient norm's read at the optimizer step
(which also brings the window's loss sums back). Counted with trainer.observe.op_counter.OpCounter on one
optimizer step of every layout of the parity harness (2 accumulation micro-batches, dropout on, time
chunks, several units), on the CPU: what would be a device sync on a GPU is the same operation here.
The counter itself is tested first, so that a zero cannot come from a counter that sees nothing."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.conftest import REPO
from tests.parallel_jobs import count_step_ops
from tests.test_parallel_parity import LAYOUTS, MODEL
from trainer.observe.op_counter import OpCounter, host

LAYOUTS = {"single": (1, 14, {"mode": "single"}), **LAYOUTS,
           "hybrid_2_shares": (2, 13, {"mode": "hybrid", "num_pp": 2, "num_dp": 1, "micro_batches": 2,
                                       "head_shares": [3, 1]}),
           "hybrid_2_head_deferred": (2, 13, {"mode": "hybrid", "num_pp": 2, "num_dp": 1,
                                              "defer_head_weight_grads": True}),
           "pipeline_2_head_deferred": (2, 13, {"mode": "pipeline", "num_pp": 2, "num_dp": 1, "micro_batches": 2,
                                                "defer_head_weight_grads": True})}


def test_the_counter_sees_every_kind_of_sync():
    x = torch.arange(12.0).view(3, 4)
    with OpCounter() as c:
        float(x.sum())  # _local_scalar_dense
        int(x[0, 0])
        bool((x > 3).any())
        x.nonzero()
        x[x > 5]  # boolean-mask indexing
        x.masked_select(x > 2)
        x.cpu()
        x.tolist()
        x.numpy()
        torch.unique_consecutive(x)
    ops = [op for op, _ in c.syncs]
    assert ops.count("_local_scalar_dense") == 3
    for op in ("nonzero", "index", "masked_select", "Tensor.cpu", "Tensor.tolist", "Tensor.numpy"):
        assert op in ops, (op, ops)
    assert all(where.startswith("tests/") or where == "(outside the project)" or "test_device_syncs" in where
               for _, where in c.syncs)


def test_the_counter_ignores_host_tensors_and_device_work():
    x = torch.randn(8, 8, requires_grad=True)
    flags = host(torch.tensor([1.0, 0.0]))
    with OpCounter() as c:
        y = (x @ x).tanh().sum()
        y.backward()  # the autograd engine's operators are seen too
        idx = torch.as_tensor(np.array([0, 2]))
        x.detach().index_select(0, idx)
        flags.tolist()
    assert c.syncs == [], c.syncs
    assert c.launches >= 6 and c.by_op["mm"] >= 3  # forward mm + two in its backward


def _ds(micro: int, layout: dict, bf16: bool, fp16: bool = False) -> dict:
    ds = json.loads((REPO / "ds_configs" / "single.json").read_text())
    ds.update(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=2, gradient_clipping=0.05,
              parallel_layout=layout, bf16={"enabled": bf16}, fp16={"enabled": fp16})
    return ds


def _one_sync(out: list, label: str) -> None:
    for rank, o in enumerate(out):
        assert len(o["syncs"]) <= 1, f"{label} rank {rank}: {o['syncs']}"
        assert o["syncs"] == [("Tensor.tolist", o["syncs"][0][1])] and "_read_global_norm" in o["syncs"][0][1], o
        assert o["launches"] > 100 and o["row"]["loss"] > 0  # a real step was counted


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_one_device_sync_per_optimizer_step_in_every_layout(workers, tiny_data, tmp_path, name):
    world, micro, layout = LAYOUTS[name]
    for bf16 in (True, False):
        out = workers.run(world, count_step_ops, [f"data.dir={tiny_data}", *MODEL, "model.dropout=0.3"],
                          _ds(micro, layout, bf16), str(tmp_path / f"{name}_{bf16}"))
        _one_sync(out, f"{name} bf16={bf16}")


@pytest.mark.parametrize("name,precision", [("data_2", "bf16"), ("grid_2x2", "fp16"), ("grid_2x2", "fp32")])
def test_zero_stage_1_keeps_one_device_sync_per_step(workers, tiny_data, tmp_path, name, precision):
    """ZeRO-1's step (trainer.parallel.deepspeed_zero.lean_zero_step): the partitions' norms summed over the ranks
    on the device, read once; the all-gather of the updated partitions does not wait for the device."""
    world, micro, layout = LAYOUTS[name]
    ds = {**_ds(micro, layout, precision == "bf16", fp16=precision == "fp16"), "zero_optimization": {"stage": 1}}
    out = workers.run(world, count_step_ops, [f"data.dir={tiny_data}", *MODEL, "model.dropout=0.3"], ds,
                      str(tmp_path / name))
    _one_sync(out, f"{name} {precision} ZeRO-1")


@pytest.mark.parametrize("name", ["single", "hybrid_2", "data_2", "grid_2x2"])
def test_fp16_keeps_one_device_sync_per_step(workers, tiny_data, tmp_path, name):
    """fp16's dynamic loss scale is a host number (DeepSpeed's optimizer keeps it), and an overflow is the norm's
    being non-finite: the norm's one read decides the skip."""
    world, micro, layout = LAYOUTS[name]
    out = workers.run(world, count_step_ops, [f"data.dir={tiny_data}", *MODEL, "model.dropout=0.3"],
                      _ds(micro, layout, False, fp16=True), str(tmp_path / name))
    _one_sync(out, f"{name} fp16")


def test_the_heads_launches_do_not_grow_with_tokens_on_an_accelerators_chunk():
    """On a CPU the loss runs in 128-row chunks (in cache), ~15 launches each; with an accelerator's
    chunk (LOSS_CHUNK_ROWS) the head's forward and backward launch the same operators for any count."""
    from trainer.model.seq2seq import LOSS_CHUNK_ROWS, AttentionSoftmaxHead

    head = AttentionSoftmaxHead(hidden=8, tgt_vocab=50, attention="general", dropout=0.0, label_smoothing=0.1)

    def launches(tokens: int, chunk: int) -> int:
        head.loss_chunk_rows = chunk
        enc, dec = torch.randn(4, 5, 8, requires_grad=True), torch.randn(4, tokens // 4, 8, requires_grad=True)
        target = torch.randint(4, 50, (4, tokens // 4))
        with OpCounter(where=False) as c:
            head(enc, torch.ones(4, 5, dtype=torch.bool), dec, target)[0].backward()
        return c.launches

    cpu = LOSS_CHUNK_ROWS["cpu"]
    assert launches(8 * cpu, cpu) - launches(2 * cpu, cpu) >= 6 * 10  # ~15 per extra chunk
    assert launches(8 * cpu, LOSS_CHUNK_ROWS["accelerator"]) == launches(2 * cpu, LOSS_CHUNK_ROWS["accelerator"])


@pytest.mark.slow
def test_a_compiled_head_trains_like_the_eager_one(workers, tiny_data, tmp_path):
    """train.compile_head=true (torch.compile of the head's forward, dynamic shapes) on the CPU: the same
    losses and weights after 3 steps with dropout, to float32 rounding."""
    from tests.parallel_jobs import train_steps

    ds = _ds(14, {"mode": "single"}, bf16=False)
    runs = {}
    for compiled in (False, True):
        out = workers.run(1, train_steps, [f"data.dir={tiny_data}", *MODEL, "model.dropout=0.3",
                                           f"train.compile_head={str(compiled).lower()}"],
                          ds, str(tmp_path / f"compiled_{compiled}"), 3, timeout=900)
        runs[compiled] = out[0]
    eager, compiled = runs[False], runs[True]
    assert [r["loss"] for r in compiled["rows"]] == pytest.approx([r["loss"] for r in eager["rows"]], rel=1e-5)
    worst = max(float(np.abs(compiled["params"][k] - v).max()) for k, v in eager["params"].items())
    assert worst < 1e-5, worst


def test_the_stepwise_lstm_kernel_adds_no_sync(workers, tiny_data, tmp_path):
    """model.lstm_kernel=stepwise in a time-chunked, ragged hybrid layout, its weight gradients deferred
    (bf16): still one read per step."""
    world, micro, layout = LAYOUTS["hybrid_2"]
    layout = {**layout, "defer_weight_grads": True}
    out = workers.run(world, count_step_ops, [f"data.dir={tiny_data}", *MODEL, "model.dropout=0.3",
                                              "model.lstm_kernel=stepwise"],
                      _ds(micro, layout, True), str(tmp_path / "stepwise"))
    for rank, o in enumerate(out):
        assert [op for op, _ in o["syncs"]] == ["Tensor.tolist"], f"rank {rank}: {o['syncs']}"
        assert o["launches"] > 100 and o["row"]["loss"] > 0

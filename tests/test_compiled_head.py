"""train.compile_head: the head's loss compiled equals the eager one (loss and every gradient, keyed dropout on) with
one graph per loss-chunk count whatever the shapes; refused on CUDA until the GPU check's gate passes there; and the
gates the GPU check applies to every run (benchmarks/gpu/gpu_gates.py) catch a run that trains nothing."""
from __future__ import annotations

import math

import pytest
import torch

from benchmarks.gpu.gpu_gates import compiled_eager_pair, training_gates
from trainer.model.seq2seq import AttentionSoftmaxHead
from trainer.training import tuning


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_compiled_heads_loss_and_gradients_are_the_eager_ones(precision):
    shapes = [(16, 12, 14), (9, 20, 9), (24, 7, 17), (13, 15, 21), (11, 9, 13), (20, 18, 11), (7, 25, 23),
              (18, 11, 19)]  # 8 widths and token counts, each of 1 or 2 chunks of 128 rows
    r = compiled_eager_pair("cpu", precision, shapes=shapes)
    assert r["ok"], r
    assert r["graphs"] <= r["graph_bound"] <= 4 < len({b["tokens"] for b in r["batches"]}) == 8
    assert all(not b["zero_grads"] for b in r["batches"])


def test_the_compiled_head_is_refused_on_cuda_in_one_line():
    head = AttentionSoftmaxHead(hidden=8, tgt_vocab=20, attention="general", dropout=0.0, label_smoothing=0.0)
    with pytest.raises(tuning.CompileRefused, match="refused on CUDA") as e:
        tuning.compile_head(head, torch.device("cuda"))
    assert "\n" not in str(e.value)
    assert head.token_loss.__func__ is AttentionSoftmaxHead.token_loss  # nothing compiled


def _rows(losses, norms):
    return [{"step": i + 1, "loss": loss, **({"grad_norm": n} if n is not None else {})}
            for i, (loss, n) in enumerate(zip(losses, norms))]


def test_the_training_gates_catch_a_run_that_trains_nothing():
    good = training_gates(_rows([9.0, 7.5, 6.8, 6.7, 6.6, 6.5], [1.2, 0.8, 0.6, 0.5, 0.5, 0.4]))
    assert good["ok"] and good["grad_norm_ok"] and good["loss_falls"]
    # 2026-12-04's compiled head on CUDA: grad norm 0.0 everywhere, the loss stuck
    stuck = training_gates(_rows([8.99, 8.99, 8.99, 8.99], [0.0, 0.0, 0.0, 0.0]))
    assert not stuck["ok"] and not stuck["grad_norm_ok"] and not stuck["loss_falls"]
    nan = training_gates(_rows([9.0, 8.0, 7.0], [1.0, math.nan, 0.5]))
    assert not nan["ok"] and not nan["grad_norm_ok"] and nan["loss_falls"]
    assert not training_gates(_rows([9.0, 8.0], [None, None]))["ok"]  # no norm logged: not shown, not passed

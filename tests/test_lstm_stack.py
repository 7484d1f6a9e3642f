"""trainer.model.lstm_stack: consecutive layers as one multi-layer LSTM call compute what the layers compute one at a
time (outputs, every layer's final state, every gradient), in time chunks with idle and unsorted rows too; which
layers can be one call; and the batch widths padded to a multiple leave the loss and gradients unchanged."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from trainer.config import ModelConfig
from trainer.data import collate, padded_width
from trainer.model.lstm_stack import (LSTMStack, cudnn_weight_groups, decode_stack, encode_stack, flatten_for_cudnn,
                                      runs_of_layers)
from trainer.model.seq2seq import build_model

torch.set_num_threads(1)
BASE = ModelConfig(emb_dim=6, hidden=8, layers=3, bidirectional_bottom=False, dropout=0.0, label_smoothing=0.1)


def _layer_by_layer_encode(pairs, x, lengths, states):
    out = []
    for pair, st in zip(pairs, states):
        x, st = pair.encode(x, lengths, st)
        out.append(st)
    return x, out


def _layer_by_layer_decode(pairs, y, states):
    out = []
    for pair, st in zip(pairs, states):
        y, st = pair.decode(y, st)
        out.append(st)
    return y, out


def _grads(params, *tensors) -> list[torch.Tensor]:
    total = sum((t.double() * torch.linspace(0.5, 1.5, t.numel(), dtype=torch.float64).view_as(t)).sum()
                for t in tensors)
    return list(torch.autograd.grad(total, params))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_stack_call_computes_what_the_layers_compute_one_at_a_time(dtype):
    model = build_model(BASE, 20, 30, seed=4).to(dtype)
    pairs = list(model.pairs)
    assert [len(r) for r in runs_of_layers(pairs, "enc", torch.zeros(1, 1, 6, dtype=dtype))] == [3]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, 6, generator=gen).to(dtype).requires_grad_()
    y = torch.randn(5, 4, 6, generator=gen).to(dtype).requires_grad_()
    # time chunks: each chunk starts from the last one's state; rows sorted longest first, one idle in chunk 2
    lengths = np.array([7, 6, 4, 4, 1])
    results = []
    for encode, decode in ((encode_stack, decode_stack), (_layer_by_layer_encode, _layer_by_layer_decode)):
        enc1, st = encode(pairs, x[:, :3], np.minimum(lengths, 3), [None] * 3)
        enc2, st = encode(pairs, x[:, 3:], np.clip(lengths - 3, 0, 4), st)
        dec, dst = decode(pairs, y, st)
        outs = [enc1, enc2, dec] + [t for s in dst for t in s]
        params = [x, y, *model.pairs.parameters()]
        results.append((outs, _grads(params, *outs)))
    (outs_a, grads_a), (outs_b, grads_b) = results
    for a, b in zip(outs_a + grads_a, outs_b + grads_b):
        torch.testing.assert_close(a.float(), b.float(), atol=1e-6 if dtype == torch.float32 else 1e-2, rtol=0)


def test_unsorted_rows_and_a_given_state_go_through_the_packed_permutation():
    model = build_model(BASE, 20, 30, seed=5)
    pairs = list(model.pairs)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 6, 6, generator=gen)
    lengths = np.array([3, 6, 2, 5])  # not longest first: packing sorts and un-sorts
    states = [(torch.randn(1, 4, 8, generator=gen), torch.randn(1, 4, 8, generator=gen)) for _ in pairs]
    with torch.no_grad():
        got, got_states = encode_stack(pairs, x, lengths, states)
        want, want_states = _layer_by_layer_encode(pairs, x, lengths, states)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    for a, b in zip(got_states, want_states):
        torch.testing.assert_close(a[0], b[0], atol=1e-6, rtol=0)
        torch.testing.assert_close(a[1], b[1], atol=1e-6, rtol=0)


def test_which_layers_can_be_one_call():
    x = torch.zeros(1, 1, 6)
    # a bidirectional bottom encoder is a call of its own; its decoder is not bidirectional
    bidi = build_model(replace(BASE, bidirectional_bottom=True), 20, 30)
    assert [len(r) for r in runs_of_layers(list(bidi.pairs), "enc", x)] == [1, 2]
    assert [len(r) for r in runs_of_layers(list(bidi.pairs), "dec", x)] == [3]
    # active dropout between layers (training, p > 0) keeps them apart; in evaluation it is inactive
    dropped = build_model(replace(BASE, dropout=0.3), 20, 30)
    assert [len(r) for r in runs_of_layers(list(dropped.pairs), "dec", x)] == [1, 1, 1]
    assert [len(r) for r in runs_of_layers(list(dropped.eval().pairs), "dec", x)] == [3]
    # the stepwise kernel is a loop of its own
    stepwise = build_model(replace(BASE, lstm_kernel="stepwise"), 20, 30)
    assert [len(r) for r in runs_of_layers(list(stepwise.pairs), "enc", x)] == [1, 1, 1]
    # train.stack_layers=off: a call per layer
    apart = build_model(BASE, 20, 30)
    for pair in apart.pairs:
        pair.stack = False
    assert [len(r) for r in runs_of_layers(list(apart.pairs), "dec", x)] == [1, 1, 1]
    assert [len(g) for g in cudnn_weight_groups(list(apart.pairs), stacked=True)] == [1] * 6
    # the groups whose weights one cuDNN buffer holds follow the calls
    assert [len(g) for g in cudnn_weight_groups(list(bidi.pairs), stacked=True)] == [1, 2, 3]
    assert [len(g) for g in cudnn_weight_groups(list(bidi.pairs), stacked=False)] == [1] * 6


def test_dropout_between_layers_in_training_is_the_keyed_one_of_each_layer():
    """With p > 0 the stack is never one call in training: each layer's keyed mask applies as before."""
    model = build_model(replace(BASE, dropout=0.4), 20, 30, seed=6)
    x = torch.randn(3, 5, 6)
    lengths = np.array([5, 4, 2])
    torch.manual_seed(0)
    got, _ = encode_stack(list(model.pairs), x, lengths, [None] * 3)
    torch.manual_seed(0)
    want, _ = _layer_by_layer_encode(list(model.pairs), x, lengths, [None] * 3)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_a_stack_off_cuda_is_not_flattened_and_its_weights_stay_the_layers_own():
    model = build_model(BASE, 20, 30)
    lstms = [p.encoder for p in model.pairs]
    before = [w.data_ptr() for lstm in lstms for w in lstm._flat_weights]
    assert flatten_for_cudnn(lstms) is False
    assert [w.data_ptr() for lstm in lstms for w in lstm._flat_weights] == before
    assert LSTMStack(lstms).weights() == [w for lstm in lstms for w in lstm._flat_weights]
    with pytest.raises(ValueError, match="bidirectional"):
        flatten_for_cudnn([build_model(replace(BASE, bidirectional_bottom=True), 20, 30).pairs[0].encoder, lstms[1]])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuDNN's flat weights need CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_flattened_stack_on_cuda_reads_its_weights_in_place(dtype):
    model = build_model(BASE, 20, 30).to("cuda", dtype)
    lstms = [p.decoder for p in model.pairs]
    y = torch.randn(4, 5, 6, device="cuda", dtype=dtype)
    with torch.no_grad():
        before, _ = decode_stack(list(model.pairs), y, [None] * 3)
    assert flatten_for_cudnn(lstms)
    weights = [w for lstm in lstms for w in lstm._flat_weights]
    assert len({w.untyped_storage().data_ptr() for w in weights}) == 1
    with torch.no_grad():
        after, _ = decode_stack(list(model.pairs), y, [None] * 3)
    torch.testing.assert_close(after, before)


def test_widths_padded_to_a_multiple_change_no_loss_or_gradient():
    """data.length_multiple: the padded columns are PAD on both sides, so the loss and every gradient are those of
    the unpadded batch (dropout off), and every slice the layouts cut keeps the padded widths."""
    gen = np.random.default_rng(2)
    src = [gen.integers(4, 20, n) for n in (9, 5, 3, 2)]
    tgt = [gen.integers(4, 30, n) for n in (4, 7, 2, 3)]
    model = build_model(replace(BASE, dropout=0.0), 20, 30, seed=7)
    results = []
    for multiple in (1, 8):
        b = collate(src, tgt, multiple)
        assert b.src.shape[1] == padded_width(10, multiple) and b.tgt_in.shape[1] == padded_width(8, multiple)
        assert b.rows(2, 4).src.shape[1] == padded_width(4, multiple)
        model.zero_grad()
        loss, nll = model(b.src, b.src_lengths, b.tgt_in, b.tgt_out)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (l1, g1), (l8, g8) = results
    torch.testing.assert_close(l8, l1, atol=1e-5, rtol=0)
    for a, b in zip(g8, g1):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    assert padded_width(16, 8) == 16 and padded_width(17, 8) == 24 and padded_width(5, 1) == 5


def test_train_stack_layers_auto_stacks_only_fp32_on_cuda():
    from trainer.training.tuning import stack_layers

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert stack_layers("auto", cuda, "fp32")[0] is True
    assert stack_layers("auto", cuda, "bf16")[0] is False and stack_layers("auto", cuda, "fp16")[0] is False
    assert stack_layers("auto", cpu, "fp32")[0] is False
    assert stack_layers("on", cpu, "bf16") == (True, "train.stack_layers=on")
    assert stack_layers("off", cuda, "fp32") == (False, "train.stack_layers=off")

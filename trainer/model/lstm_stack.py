"""Consecutive LSTM layers run as one call (`encode_stack`, `decode_stack`), and the packed/ragged runs every LSTM
call of the model goes through (`run_packed`, `run_bulk_then_packed`).

A stage holds several encoder-decoder layers (one process: all of them). Called one layer at a time, each layer is
a kernel call of its own, and each call pays a fixed host cost: on an H200, 0.6-0.8 ms of host time per cuDNN LSTM
call whatever its size (../shared/gpu/2026-12-04), 8 + 8 calls per step for the paper's 4 + 4 layers. And a
layer waits for the whole of the layer below. One call over the stack (`torch._VF.lstm` with num_layers > 1,
the weights of the separate layers handed as one list) is one host cost per side, and cuDNN runs the layers as
a wavefront (layer k + 1 at step t beside layer k at step t + 1). It computes what the layer-by-layer calls
compute: the same recurrences, the top layer's outputs and every layer's final state.

It can only be one call where nothing happens between two layers: consecutive unidirectional layers on the
fused kernel (`model.lstm_kernel`; not the stepwise one), whose dropout between them is inactive (p = 0, or
evaluation), and no residual add (model.residual) feeds the upper one. The keyed dropout masks
(trainer.model.dropout) must be the same in every layout, which a kernel's own dropout between layers is not.
Everything else runs a layer at a time, as before.

`flatten_for_cudnn` puts a stack's weights into one buffer in cuDNN's layout (the parameters become views of
it), so a cuDNN call reads them in place; without it, and for bf16 always (nn.LSTM.flatten_parameters() skips
any dtype but half, float and double), cuDNN copies every weight at every call.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from trainer.model.tensors import to_device

State = tuple[torch.Tensor, torch.Tensor]  # (h, c), each (layers, batch, hidden)


def host_lengths(lengths) -> np.ndarray:
    """Lengths as a host int64 array. A device tensor is read back once (inference, tools); the trainer
    passes the batcher's host lengths, so its step never waits for the device here."""
    if isinstance(lengths, torch.Tensor):
        lengths = lengths.cpu()
    return np.asarray(lengths, dtype=np.int64)


class LSTMStack:
    """Unidirectional one-layer nn.LSTMs, in order, called as one multi-layer LSTM: `stack(x, state)` as
    `nn.LSTM(num_layers=len(lstms))(x, state)` for a padded batch-first tensor or a PackedSequence. The weights
    stay the layers' own parameters (checkpoints do not change)."""

    bidirectional = False

    def __init__(self, lstms: list[nn.LSTM]):
        self.lstms = lstms
        self.hidden_size = lstms[0].hidden_size
        self.num_layers = len(lstms)

    def weights(self) -> list[torch.Tensor]:
        return [w for lstm in self.lstms for w in lstm._flat_weights]

    def __call__(self, x, state: State | None):
        packed = isinstance(x, PackedSequence)
        data = x.data if packed else x
        batch = int(x.batch_sizes[0]) if packed else x.shape[0]
        if state is None:
            zeros = data.new_zeros(self.num_layers, batch, self.hidden_size)
            state = (zeros, zeros)
        elif packed and x.sorted_indices is not None:
            state = tuple(s.index_select(1, x.sorted_indices) for s in state)
        training = self.lstms[0].training
        if packed:
            out, h, c = torch._VF.lstm(data, x.batch_sizes, state, self.weights(), True, self.num_layers, 0.0,
                                       training, False)
            out = PackedSequence(out, x.batch_sizes, x.sorted_indices, x.unsorted_indices)
            if x.unsorted_indices is not None:
                h, c = h.index_select(1, x.unsorted_indices), c.index_select(1, x.unsorted_indices)
            return out, (h, c)
        out, h, c = torch._VF.lstm(data, state, self.weights(), True, self.num_layers, 0.0, training, False, True)
        return out, (h, c)


def run_packed(lstm, x: torch.Tensor, lengths: np.ndarray, state: State | None):
    """Run `lstm` (an nn.LSTM or an LSTMStack) over the first `lengths[b]` steps of each row of x (batch, time,
    in); `lengths` on the host.

    Rows with length 0 (a sentence already finished before this time chunk) keep their incoming
    state and get zero outputs. Padded positions get zero outputs. Returns (out, (h, c)) with the
    state taken at each row's true end.
    """
    batch, time, _ = x.shape
    hidden = lstm.hidden_size * (2 if lstm.bidirectional else 1)
    active = lengths > 0
    if not active.all():
        out = x.new_zeros(batch, time, hidden)
        if state is None:
            dirs = 2 if lstm.bidirectional else getattr(lstm, "num_layers", 1)
            zeros = x.new_zeros(dirs, batch, lstm.hidden_size)
            state = (zeros, zeros)
        if not active.any():
            return out, state
        rows = np.flatnonzero(active)
        idx = to_device(rows, x.device)
        sub_state = (state[0][:, idx], state[1][:, idx])
        sub_out, (h, c) = run_packed(lstm, x[idx], lengths[rows], sub_state)
        out = out.index_copy(0, idx, sub_out)
        return out, (state[0].index_copy(1, idx, h), state[1].index_copy(1, idx, c))
    # rows sorted longest first (the batcher's order) need no permutation, which torch would copy to
    # the device and wait for
    ordered = bool((lengths[:-1] >= lengths[1:]).all())
    packed = pack_padded_sequence(x, torch.from_numpy(lengths), batch_first=True, enforce_sorted=ordered)
    out, (h, c) = lstm(packed, state)
    out, _ = pad_packed_sequence(out, batch_first=True, total_length=time)
    return out, (h, c)


def run_bulk_then_packed(lstm, x: torch.Tensor, lengths: np.ndarray, state: State | None):
    """`run_packed` for a unidirectional LSTM, faster: the first min(lengths) steps, where every row
    is real, run as one padded call (oneDNN's fused LSTM on CPU: 2-3x faster forward+backward than
    the packed path, which falls back to a per-step loop), and only the ragged tail is packed. The
    recurrence of each row is the same, so the outputs and final states equal `run_packed`'s up to
    floating-point summation order. For a stack too: layer k + 1 at step t reads only layer k at step t."""
    bulk = int(lengths.min())
    if bulk == 0 or lstm.bidirectional:
        return run_packed(lstm, x, lengths, state)
    out, state = lstm(x[:, :bulk], state)
    if bulk == x.shape[1]:
        return out, state
    tail, state = run_packed(lstm, x[:, bulk:], lengths - bulk, state)
    return torch.cat([out, tail], 1), state


# ---- the stacks of an encoder-decoder ----
def runs_of_layers(pairs: list, side: str, x: torch.Tensor) -> list[list]:
    """`pairs` (EncoderDecoderLayers, in order) cut into runs that can be one call on `side` ('enc' | 'dec') for
    input `x`: consecutive layers on the fused kernel, unidirectional on that side, with no active dropout
    between them. A run of one is called as the layer itself."""
    runs: list[list] = []
    for pair in pairs:
        fits = pair.stackable(side, x)
        if runs and fits and runs[-1][-1].stackable(side, x) and not runs[-1][-1].drops(side):
            runs[-1].append(pair)
        else:
            runs.append([pair])
    return runs


def encode_stack(pairs: list, x: torch.Tensor, lengths, states: list, masks=None) -> tuple[torch.Tensor, list]:
    """The encoders of `pairs` over x (batch, src_len, in), layer k starting from states[k] (None at the start),
    as few calls as `runs_of_layers` allows. Returns the top outputs (batch, src_len, hidden) and each layer's
    state at each row's true end, as `EncoderDecoderLayer.encode` returns them (not yet `decoder_init`)."""
    out_states: list = []
    lengths = host_lengths(lengths)
    for run in runs_of_layers(pairs, "enc", x):
        first = len(out_states)
        if len(run) == 1:
            x, st = run[0].encode(x, lengths, states[first], masks)
            out_states.append(st)
            continue
        stack = LSTMStack([p.encoder for p in run])
        x, (h, c) = run_bulk_then_packed(stack, x, lengths, _stacked(states[first:first + len(run)]))
        x = run[-1].enc_dropout(x, masks)
        out_states += [(h[k:k + 1], c[k:k + 1]) for k in range(len(run))]
    return x, out_states


def decode_stack(pairs: list, y: torch.Tensor, states: list, masks=None) -> tuple[torch.Tensor, list]:
    """The decoders of `pairs` over y (batch, tgt_len, in) from states[k] (each (1, batch, hidden) x 2), as
    `encode_stack`. Returns the top outputs (batch, tgt_len, hidden) and each layer's final state."""
    out_states: list = []
    for run in runs_of_layers(pairs, "dec", y):
        first = len(out_states)
        if len(run) == 1 or y.shape[1] == 0:
            for k, pair in enumerate(run):
                y, st = pair.decode(y, states[first + k], masks)
                out_states.append(st)
            continue
        stack = LSTMStack([p.decoder for p in run])
        y, (h, c) = stack(y, _stacked(states[first:first + len(run)]))
        y = run[-1].dec_dropout(y, masks)
        out_states += [(h[k:k + 1], c[k:k + 1]) for k in range(len(run))]
    return y, out_states


def _stacked(states: list) -> State | None:
    """Per-layer states ((1, batch, hidden) x 2 each, or all None) -> (layers, batch, hidden) x 2, or None."""
    if all(s is None for s in states):
        return None
    if any(s is None for s in states):
        raise ValueError("a stack's layers must all start from a state, or none of them")
    return torch.cat([s[0] for s in states]), torch.cat([s[1] for s in states])


def flatten_for_cudnn(lstms: list[nn.LSTM]) -> bool:
    """Put the weights of `lstms` (consecutive one-layer LSTMs, on one CUDA device, one dtype; a bidirectional one
    alone) into one buffer in cuDNN's layout for a stack of len(lstms) layers; the parameters become views of it,
    so every cuDNN call over them (the stack, or its first layer alone) reads them in place. bf16 too, which
    nn.LSTM.flatten_parameters() skips. Returns False (nothing done) off CUDA or where cuDNN is not used."""
    if len(lstms) > 1 and any(lstm.bidirectional for lstm in lstms):
        raise ValueError("a stack of LSTM layers is unidirectional; a bidirectional layer is flattened alone")
    weights = [w for lstm in lstms for w in lstm._flat_weights]
    first = weights[0]
    if (not first.is_cuda or not torch.backends.cudnn.enabled or not torch._use_cudnn_rnn_flatten_weight()
            or any(w.dtype != first.dtype or w.device != first.device for w in weights)):
        return False
    from torch.backends.cudnn import rnn as cudnn_rnn

    try:
        with torch.cuda.device_of(first), torch.no_grad():
            torch._cudnn_rnn_flatten_weight(weights, 4, lstms[0].input_size, cudnn_rnn.get_cudnn_mode("LSTM"),
                                            lstms[0].hidden_size, 0, len(lstms), True, lstms[0].bidirectional)
    except RuntimeError:  # a cuDNN that refuses this dtype: the calls copy the weights, as before
        return False
    return True


def cudnn_weight_groups(pairs: list, stacked: bool) -> list[list[nn.LSTM]]:
    """The LSTMs of `pairs` (EncoderDecoderLayers, in order) grouped as their calls will read them: with `stacked`
    (no dropout between layers, so `encode_stack` / `decode_stack` make one call of them), each side's
    consecutive layers on the fused kernel as one group; else every LSTM alone. A bidirectional encoder, a
    stepwise layer and a residual one (model.residual) are always alone."""
    groups: list[list[nn.LSTM]] = []
    for side in ("encoder", "decoder"):
        run: list[nn.LSTM] = []
        for pair in pairs:
            lstm = getattr(pair, side)
            if (stacked and pair.stack and not pair.residual and pair.kernel != "stepwise"
                    and not lstm.bidirectional):
                run.append(lstm)
                continue
            groups += [run] if run else []
            run = []
            groups.append([lstm])
        groups += [run] if run else []
    return groups

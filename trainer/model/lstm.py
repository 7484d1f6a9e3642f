"""A unidirectional LSTM layer run step by step, with its own backward (`model.lstm_kernel=stepwise`).

torch's fused LSTM on CPU (oneDNN) pays a fixed price on every call: the weights are reordered for it
and the weight gradients reordered back and accumulated. Cut a sequence into time chunks (the
pipeline's wavefront) and that price is paid per chunk; at hidden 1024 in bf16 four chunks cost
1.6x one call (docs/BENCHMARKS.md 13.1). This kernel does what a chunk needs and no more:

- forward: the input projection of the whole chunk as one GEMM, then per step one GEMM with W_hh and
  the gate arithmetic in float32 or wider (the cell state is kept so inside a call);
- backward: per step the gate gradients and one GEMM back through W_hh; the weight gradients of the
  whole chunk as one GEMM each (W_ih, W_hh) and one sum (the biases).

Rows run as a packed sequence does: rows sorted longest first (the batcher's order; other orders are
permuted and put back), step t runs the first `sizes[t]` rows, a row past its length keeps its state
and gets a zero output. The parameters are nn.LSTM's own (weight_ih_l0, weight_hh_l0, bias_ih_l0,
bias_hh_l0), so checkpoints and exports do not depend on the kernel.

Inside `deferred_weight_grads(queue)` (trainer.model.weight_grads) the backward computes only what the layers
below wait for (the input and state gradients) and queues the weight gradients.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn

from trainer.model.tensors import to_device
from trainer.model.weight_grads import deferring


def _weight_grads(grads: torch.Tensor, hs: torch.Tensor, x: torch.Tensor) -> tuple:
    """(d W_ih, d W_hh, d b_ih, d b_hh) from the gate gradients (batch, time, 4 hidden), the states
    each step read (batch, time, hidden) and the inputs: one GEMM each over the whole chunk."""
    batch, time, four = grads.shape
    flat = grads.view(batch * time, four)
    d_w_hh = flat.t() @ hs.reshape(batch * time, hs.shape[2])
    d_w_ih = flat.t() @ x.reshape(batch * time, x.shape[2])
    d_b = flat.sum(0, dtype=torch.promote_types(x.dtype, torch.float32)).to(x.dtype)
    return d_w_ih, d_w_hh, d_b, d_b.clone()


class _StepLSTM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, h0, c0, w_ih, w_hh, b_ih, b_hh, sizes):
        batch, time, _ = x.shape
        hidden = w_hh.shape[1]
        xg = torch.addmm(b_ih + b_hh, x.reshape(batch * time, x.shape[2]), w_ih.t()).view(batch, time, 4 * hidden)
        hs = x.new_empty(batch, time + 1, hidden)
        inner = torch.promote_types(x.dtype, torch.float32)  # the gate arithmetic's dtype
        cs = torch.empty(batch, time + 1, hidden, dtype=inner, device=x.device)
        acts = torch.empty(batch, time, 4 * hidden, dtype=inner, device=x.device)
        hs[:, 0] = h0
        cs[:, 0] = c0
        for t, n in enumerate(sizes):
            if n < batch:  # rows past their end carry their state
                hs[n:, t + 1] = hs[n:, t]
                cs[n:, t + 1] = cs[n:, t]
            if n == 0:
                continue
            gates = torch.addmm(xg[:n, t], hs[:n, t], w_hh.t()).to(inner)
            a = acts[:n, t]
            torch.sigmoid(gates, out=a)
            a[:, 2 * hidden:3 * hidden] = torch.tanh(gates[:, 2 * hidden:3 * hidden])
            i, f, g, o = a.chunk(4, 1)
            c = torch.addcmul(f * cs[:n, t], i, g)
            cs[:n, t + 1] = c
            hs[:n, t + 1] = o * torch.tanh(c)
        ctx.sizes, ctx.params = sizes, (w_ih, w_hh, b_ih, b_hh)
        ctx.save_for_backward(x, w_ih, w_hh, hs, cs, acts)
        out = hs[:, 1:]
        if sizes[-1] < batch:  # zero outputs past each row's end
            steps = to_device(np.asarray(sizes, dtype=np.int64), x.device)
            out = out * (torch.arange(batch, device=x.device)[:, None] < steps[None, :]).unsqueeze(-1).to(x.dtype)
        else:
            out = out.clone()
        return out, hs[:, time].clone(), cs[:, time].to(c0.dtype, copy=True)

    @staticmethod
    def backward(ctx, grad_out, grad_h, grad_c):
        x, w_ih, w_hh, hs, cs, acts = ctx.saved_tensors
        batch, time, _ = x.shape
        hidden = w_hh.shape[1]
        grads = x.new_zeros(batch, time, 4 * hidden)
        dh = _inner_or_zeros(grad_h, cs)
        dc = _inner_or_zeros(grad_c, cs)
        for t in reversed(range(time)):
            n = ctx.sizes[t]
            if n == 0:
                continue
            if grad_out is not None:
                dh[:n] += grad_out[:n, t]
            grads[:n, t] = _gate_grads(acts[:n, t], cs[:n, t], cs[:n, t + 1], dh[:n], dc[:n])
            dc[:n] *= acts[:n, t, hidden:2 * hidden]
            dh[:n] = grads[:n, t] @ w_hh
        d_x = (grads.view(batch * time, 4 * hidden) @ w_ih).view_as(x) if ctx.needs_input_grad[0] else None
        queue = deferring()
        if queue is not None:  # the weight gradients later, from the queue
            queue.add(ctx.params, functools.partial(_weight_grads, grads, hs[:, :time], x))
            return d_x, dh.to(x.dtype), dc.to(x.dtype), None, None, None, None, None
        return (d_x, dh.to(x.dtype), dc.to(x.dtype), *_weight_grads(grads, hs[:, :time], x), None)


def _inner_or_zeros(grad, cs: torch.Tensor) -> torch.Tensor:
    """A state gradient in the gate arithmetic's dtype (that of the saved cell states `cs`)."""
    if grad is None:
        return cs.new_zeros(cs.shape[0], cs.shape[2])
    return grad.to(cs.dtype, copy=True)


def _gate_grads(a, c_prev, c, dh, dc):
    """Gradients of the four gate pre-activations (i, f, g, o) at one step; updates dc in place to
    the gradient of this step's cell state."""
    i, f, g, o = a.chunk(4, 1)
    tc = torch.tanh(c)
    dc += dh * o * (1 - tc * tc)
    return torch.cat([dc * g * i * (1 - i), dc * c_prev * f * (1 - f), dc * i * (1 - g * g),
                      dh * tc * o * (1 - o)], 1)


AUTO_MIN_HIDDEN = 1024  # model.lstm_kernel=auto: the narrowest layer measured faster stepwise (CPU)


def auto_stepwise(x: torch.Tensor, hidden: int, time_chunked: bool = False) -> bool:
    """model.lstm_kernel=auto: run this layer stepwise? Only where it was measured faster than torch's
    fused LSTM (docs/BENCHMARKS.md, the LSTM kernel chunk by chunk): on a CPU at hidden >= AUTO_MIN_HIDDEN,
    in bf16 (oneDNN's bf16 LSTM backward is slower than the GEMMs it needs there), and in fp32 where the
    layer is called in time chunks (the fused kernel reorders its weights per call: 1.24x of one call at 4
    chunks, 1.61x at 8, against stepwise's 1.02-1.06x). Uncut fp32, hidden 256, and GPUs (cuDNN): fused."""
    return x.device.type == "cpu" and hidden >= AUTO_MIN_HIDDEN and (x.dtype == torch.bfloat16 or time_chunked)


def run_stepwise(lstm: nn.LSTM, x: torch.Tensor, lengths: np.ndarray | None, state):
    """`lstm` (unidirectional, one layer) over x (batch, time, in): every row for `lengths=None`, else
    the first lengths[b] steps of row b (a host array, 0 allowed). Returns out (batch, time, hidden)
    and the state (1, batch, hidden) x 2 at each row's end, as `lstm_stack.run_packed` does."""
    batch, time, _ = x.shape
    if state is None:
        zeros = x.new_zeros(batch, lstm.hidden_size)
        h0, c0 = zeros, zeros
    else:
        h0, c0 = state[0][0], state[1][0]
    if time == 0:  # an empty time chunk (more chunks than steps)
        return x.new_zeros(batch, 0, lstm.hidden_size), (h0.unsqueeze(0), c0.unsqueeze(0))
    if lengths is None:
        return _apply(lstm, x, h0, c0, (batch,) * time)
    if (lengths[:-1] >= lengths[1:]).all():
        return _apply(lstm, x, h0, c0, _sizes(lengths, time))
    order = np.argsort(-lengths, kind="stable")
    idx, back = to_device(order, x.device), to_device(np.argsort(order), x.device)
    out, (h, c) = _apply(lstm, x[idx], h0[idx], c0[idx], _sizes(lengths[order], time))
    return out[back], (h[:, back], c[:, back])


def _sizes(lengths: np.ndarray, time: int) -> tuple:
    return tuple(int(n) for n in (lengths[None, :] > np.arange(time)[:, None]).sum(1))


def _apply(lstm, x, h0, c0, sizes):
    out, h, c = _StepLSTM.apply(x, h0, c0, lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0,
                                lstm.bias_hh_l0, sizes)
    return out, (h.unsqueeze(0), c.unsqueeze(0))

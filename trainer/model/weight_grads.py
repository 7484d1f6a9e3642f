"""Weight gradients computed later than the backward that needs them (zero-bubble pipelining's split of the
backward): inside `deferred_weight_grads(queue)`, a layer that supports it computes only the gradients other
layers wait for (its input's, its state's) and queues the rest; `queue.run()` computes them later, in the order
they were queued, and adds them to the parameters' `.grad`. A pipeline stage thereby hands its input gradient
on first and fills a wait it would otherwise idle through with the rest.

Two layers queue: the stepwise LSTM (trainer.model.lstm; parallel_layout.defer_weight_grads) and the head's
output projection (trainer.model.seq2seq; parallel_layout.defer_head_weight_grads), the largest single weight
gradient of the model (vocabulary x width).
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch


class WeightGradQueue:
    """Weight gradients queued under `deferred_weight_grads`: (parameters, a function giving their gradients)."""

    def __init__(self):
        self.pending: list = []

    def __len__(self) -> int:
        return len(self.pending)

    def add(self, params: tuple, compute: Callable[[], tuple]) -> None:
        self.pending.append((params, compute))

    def run(self) -> None:
        """Compute every queued weight gradient and accumulate it into its parameter's `.grad`."""
        pending, self.pending = self.pending, []
        with torch.no_grad():
            for params, compute in pending:
                accumulate(params, compute())


_DEFERRING: list[WeightGradQueue] = []  # not thread-local: on an accelerator autograd runs the backward
#                                         in its own device thread


@contextlib.contextmanager
def deferred_weight_grads(queue: WeightGradQueue | None):
    """Within: layers that can queue their weight gradients in `queue` instead of returning them (None: no
    deferral)."""
    if queue is None:
        yield
        return
    _DEFERRING.append(queue)
    try:
        yield
    finally:
        _DEFERRING.pop()


def deferring() -> WeightGradQueue | None:
    """The queue weight gradients go to now, or None (compute them at once)."""
    return _DEFERRING[-1] if _DEFERRING else None


def accumulate(params: tuple, grads: tuple) -> None:
    for p, g in zip(params, grads):
        if p is not None and g is not None and p.requires_grad:
            p.grad = g if p.grad is None else p.grad.add_(g)

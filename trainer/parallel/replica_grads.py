"""The data-parallel gradient all-reduce over a stage's replicas (the schedule's `reduce_grads`), in place.

DeepSpeed's own (`engine.allreduce_gradients`) flattens every gradient into one new buffer, all-reduces it,
scales it and copies it back: three extra passes over every gradient per step, which on a CPU cost about as
much as the transfer (docs/BENCHMARKS.md 13.7). Here each gradient is summed in place, one asynchronous
collective per tensor, all started at once; the 1/num_dp of DeepSpeed's average is folded into the loss
scale instead (a power of two in every shipped layout: the same bits).

The embedding tables are the exception that pays most: a step's batches touch a few hundred of their rows,
and every other row's gradient is exactly zero on every replica (the lookup's backward adds into those
rows only). Every rank reads the same global batches, so each knows, with no message, which rows the
window touched: only those rows travel (gathered, summed, put back). On an accelerator the row set would
cost a device sync to size, so there the tables go whole.
"""
from __future__ import annotations

import numpy as np
import torch

from trainer.parallel.comm import AsyncCollective


class ReplicaGrads:
    """Sums the gradients of `params` (what this rank's optimizer updates) over the replicas of `group` (a
    runtime group name) at each accumulation boundary. `tables`: {"src"|"tgt": embedding weight} of those,
    whose gradients travel by touched row (not a table tied to another layer's weight: its gradient is dense)."""

    def __init__(self, runtime, params: list, tables: dict, group: str = "data"):
        self.rt, self.group = runtime, group
        self.tables = tables
        skip = {id(p) for p in tables.values()}
        self.dense = [p for p in params if p.requires_grad and id(p) not in skip]
        self.rows = _no_rows()
        self.by_row = bool(self.tables)
        self.early: list[AsyncCollective] = []  # sums started before the boundary (start_early), this window
        self.started: set[int] = set()  # ... of these parameters (ids)

    def note(self, batch) -> None:
        """The rows of this micro-batch's tokens (call for every micro-batch of the window)."""
        if not self.by_row:
            return
        if batch.ids is None:
            self.by_row = False  # no host-side ids (reading them from the device would wait for it): whole tables
            return
        self.rows["src"] = np.union1d(self.rows["src"], batch.ids[0])
        self.rows["tgt"] = np.union1d(self.rows["tgt"], batch.ids[1])

    def start_early(self, params: list) -> None:
        """Start summing these dense gradients now, while the backward goes on: the schedule's last
        instruction of the window that writes them has run (StepRunner's early reduce points), so they are
        final. `start` then sums the rest and waits for these as well. Every replica runs the same program, so
        every replica starts the same collectives in the same order."""
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.early.append(self.rt.all_reduce_async([p.grad for p in params], self.group))
        self.started.update(id(p) for p in params)

    def start(self) -> "_Pending":
        """Start summing every gradient over the replicas (those start_early has not started); `wait()` on the
        result finishes it. A gradient that is None is made zero first (every replica must enter the same
        collectives)."""
        for p in [*self.dense, *self.tables.values()]:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        rest = [p for p in self.dense if id(p) not in self.started]
        whole = rest + ([] if self.by_row else list(self.tables.values()))
        pending = _Pending(self.rt.all_reduce_async([p.grad for p in whole], self.group))
        pending.parts[:0], self.early, self.started = self.early, [], set()
        if self.by_row:
            for side, table in self.tables.items():
                ids = torch.from_numpy(self.rows[side].astype(np.int64))
                rows = table.grad.index_select(0, ids)
                pending.add(self.rt.all_reduce_async([rows], self.group), table.grad, ids, rows)
        self.rows = _no_rows()
        return pending


def _no_rows() -> dict:
    return {"src": np.zeros(0, dtype=np.int64), "tgt": np.zeros(0, dtype=np.int64)}


class _Pending:
    """Collectives in flight, and the touched rows to put back into their tables once they are summed."""

    def __init__(self, whole: AsyncCollective):
        self.parts = [whole]
        self.put_back: list = []

    def add(self, part: AsyncCollective, grad: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor) -> None:
        self.parts.append(part)
        self.put_back.append((grad, ids, rows))

    def wait(self) -> None:
        for part in self.parts:
            part.wait()
        for grad, ids, rows in self.put_back:
            grad.index_copy_(0, ids, rows)
        self.parts, self.put_back = [], []

"""Optimizer state sharded over the data-parallel replicas (DeepSpeed's ZeRO stage 1), written and read in the same
per-(global layer, parameter name) files as `LayerKeyedOptimizerState` writes, so a checkpoint loads into any
layout, with or without ZeRO.

ZeRO gives each replica of a stage the fp32 master of one equal slice (a partition) of each parameter group's
flat buffer, and the torch optimizer's state of that slice only (`engine.zero_groups`:
trainer.parallel.deepspeed_zero.ZeroGroup). `gather` collects the replicas' partitions into replica 0 over the
data-parallel group and cuts them into whole parameters; `scatter` copies each replica's slice out of the whole
parameters every rank reads (no message: every replica reads the files of its stage's layers).
"""
from __future__ import annotations

import torch

from trainer.checkpoint.optimizer import MASTER, LayerKeyedOptimizerState, init_state, owned_parameters, state_keys


class ShardedOptimizerState(LayerKeyedOptimizerState):
    """This rank's slice of the optimizer state, as whole parameters on replica 0 (see the module docstring).
    `runtime`: its `gather` over the "data" group; `replica0`: the global rank of this stage's replica 0."""

    def __init__(self, engine, module, replica: int, runtime, replica0: int):
        super().__init__(engine, module, replica)
        self.runtime, self.replica0 = runtime, replica0

    def _names(self) -> dict:
        return {id(p): (part, name) for part, name, p in owned_parameters(self.module)}

    def gather(self) -> tuple[dict, dict]:
        """(the parts to write: replica 0 only, {} elsewhere; the optimizer summary) -- a collective of the
        replicas."""
        base = self.engine.base_optimizer()
        keys = state_keys(base)
        names, out = self._names(), {}
        for g in self.engine.zero_groups:
            rows = torch.stack([g.master.detach(), *(base.state[g.master][k] for k in keys)]).float().cpu()
            parts = self.runtime.gather(rows, dst=self.replica0, group="data")
            if parts is None:
                continue
            flat = torch.cat(parts, 1)
            for p, offset in g.params:
                part, name = names[id(p)]
                whole = flat[:, offset:offset + p.numel()]
                entry = {MASTER: whole[0], **{k: whole[1 + j] for j, k in enumerate(keys)}}
                out.setdefault(part, {})[name] = {k: v.reshape(p.shape).clone() for k, v in entry.items()}
        return out, self.summary(base, keys)

    def scatter(self, parts: dict, summary: dict) -> None:
        """Each replica's slice of the masters and optimizer state written by `gather` (in any layout, with or
        without ZeRO), checked against `expected` first (trainer.checkpoint.structure). The weights themselves
        come from the weights files (already loaded)."""
        base = self.engine.base_optimizer()
        keys = list(summary.get("state_keys", []))
        if keys:
            init_state(base, summary["step"], keys)
        names = self._names()
        for g in self.engine.zero_groups:
            targets = [g.master, *(base.state[g.master][k] for k in keys)]
            with torch.no_grad():
                for p, first, at, count in g.pieces:
                    part, name = names[id(p)]
                    entry = parts[part][name]
                    for target, key in zip(targets, [MASTER, *keys]):
                        target.narrow(0, at, count).copy_(entry[key].reshape(-1).narrow(0, first, count))
        self.load_hyperparameters(base, summary)

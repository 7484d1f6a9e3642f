"""Optimizer state keyed by (global layer, parameter name), not by DeepSpeed's parameter groups, so it loads into
any layout. The fp32 master weights travel with it (in bf16 the model weights are only their rounded copies), and
so does the loss scaler of DeepSpeed's mixed-precision optimizer.

`LayerKeyedOptimizerState` is the one piece of a checkpoint that knows where the optimizer keeps its state. Without
ZeRO every data-parallel replica holds all of it for its layers, so replica 0 writes it and every replica reads it
whole. With ZeRO stage 1 the state is sharded over the replicas: `ShardedOptimizerState`
(trainer.checkpoint.sharded_optimizer) has the same four methods, `gather` collecting the shards into the writer and
`scatter` handing each replica its slice; the files, the structure checks and the Checkpointer stay as they are.
The Checkpointer picks one (`checkpointer._optimizer_state`).
"""
from __future__ import annotations

from typing import Iterator

import torch
import torch.nn as nn

from trainer.checkpoint.files import HEAD, layer_name

MASTER = "fp32"  # the entry of a parameter's fp32 master weight, beside its optimizer state keys


def owned_parameters(module) -> Iterator[tuple[str, str, nn.Parameter]]:
    """(part, name, param) of every parameter this rank's optimizer updates: its layers ('layer_XX' by
    global index) and, on the stage that owns it, the head. Tied weights are listed once."""
    seen = set()
    for offset, layer in enumerate(module.layers):
        for name, p in layer.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                yield layer_name(module.first_layer + offset), name, p
    if module.head is not None and module.owns_head:
        for name, p in module.head.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                yield HEAD, name, p


def state_keys(base) -> list[str]:
    for st in base.state.values():
        return [k for k in st if k != "step"]
    return []


def _step_of(base) -> float:
    for st in base.state.values():
        step = st.get("step")
        return float(step) if step is not None else 0.0
    return 0.0


def init_state(base, step: float, keys: list[str]) -> None:
    """Create zero optimizer state (as torch would at its first step) where there is none."""
    for group in base.param_groups:
        on_device = group.get("fused") or group.get("capturable")
        for p in group["params"]:
            st = base.state[p]
            for k in keys:
                st.setdefault(k, torch.zeros_like(p, memory_format=torch.preserve_format))
            st["step"] = torch.tensor(step, dtype=torch.float32, device=p.device if on_device else "cpu")


class LayerKeyedOptimizerState:
    """This rank's optimizer state as {part: {param name: {'fp32': master, <state key>: tensor}}} (float32 on the
    host). `engine`: trainer.parallel.deepspeed_adapter.Engine; `module`: the RankModule; `replica`: this rank's
    data-parallel replica."""

    def __init__(self, engine, module, replica: int):
        self.engine, self.module, self.replica = engine, module, replica

    def writes(self) -> bool:
        """Whether this rank writes the optimizer files of its parts (one replica holds the whole state)."""
        return self.replica == 0

    def expected(self) -> dict[str, dict[str, torch.Size]]:
        """{part: {param name: shape}} of what this rank's `scatter` needs (the structure checks compare a
        checkpoint's files with it before anything is copied)."""
        out: dict[str, dict] = {}
        for part, name, p in owned_parameters(self.module):
            out.setdefault(part, {})[name] = p.shape
        return out

    def gather(self) -> tuple[dict, dict]:
        """(the parts to write, the optimizer summary: its step, state keys, hyperparameters, loss scaler)."""
        engine = self.engine
        engine.check_per_parameter_state()
        base, masters = engine.base_optimizer(), engine.masters()
        keys = state_keys(base)
        out: dict[str, dict] = {}
        for part, name, p in owned_parameters(self.module):
            master = masters.get(id(p), p)
            st = base.state.get(master, {})
            entry = {MASTER: master.detach(), **{k: st[k] for k in keys if k in st}}
            out.setdefault(part, {})[name] = {k: v.detach().float().cpu().clone() for k, v in entry.items()}
        return out, self.summary(base, keys)

    def summary(self, base, keys: list[str]) -> dict:
        """The optimizer's step, state keys, hyperparameters (its first group's) and loss scaler."""
        group = {k: (list(v) if isinstance(v, tuple) else v) for k, v in base.param_groups[0].items()
                 if k != "params" and isinstance(v, (int, float, bool, tuple, list, str, type(None)))}
        return {"step": _step_of(base), "state_keys": keys, "param_group": group,
                "loss_scaler": self.engine.loss_scaler_state()}

    def scatter(self, parts: dict, summary: dict) -> None:
        """Load masters and optimizer state written by `gather` (in any layout) into this rank's parameters.
        `parts` and `summary` were checked against `expected` (trainer.checkpoint.structure): every entry is
        there, of the parameter's shape, in float32."""
        engine = self.engine
        engine.check_per_parameter_state()
        base, masters = engine.base_optimizer(), engine.masters()
        keys = list(summary.get("state_keys", []))
        if keys:
            init_state(base, summary["step"], keys)
        for part, name, p in owned_parameters(self.module):
            entry = parts[part][name]
            master = masters.get(id(p), p)
            with torch.no_grad():
                master.copy_(entry[MASTER])
                if master is not p:
                    p.copy_(master)  # the bf16 weight is the rounded master, as after an optimizer step
            for k in keys:
                base.state[master][k].copy_(entry[k])
        self.load_hyperparameters(base, summary)

    def load_hyperparameters(self, base, summary: dict) -> None:
        """The written hyperparameters (lr, betas, ...) into every group, and the loss scaler."""
        for group in base.param_groups:
            for k, v in summary.get("param_group", {}).items():
                if k in group and k not in ("params", "fused", "foreach", "capturable", "differentiable"):
                    group[k] = tuple(v) if isinstance(group[k], tuple) else v
        self.engine.load_loss_scaler_state(summary.get("loss_scaler", {}))

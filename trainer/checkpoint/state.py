"""What a checkpoint must hold besides the weights, in a layout-independent form.

* `TrainState`: the small mutable training state (step, data position, LR scheduler, DeepSpeed's
  step counters, best dev BLEU, ...) next to the frozen config it ran with.
* Optimizer state keyed by (global layer, parameter name), not by DeepSpeed's parameter groups, so it
  loads into any layout: `gather_optimizer_state` / `scatter_optimizer_state`. The fp32 master weights
  travel with it (in bf16 the model weights are only their rounded copies), and so does the loss
  scaler of DeepSpeed's mixed-precision optimizer.
* RNG states of one process (`capture_rng` / `restore_rng`).
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Iterator

import numpy as np
import torch
import torch.nn as nn

from trainer.checkpoint.files import HEAD, layer_name


@dataclass
class TrainState:
    step: int = 0
    stream: dict = field(default_factory=dict)  # BatchStream.state_dict(): epoch, index in the epoch
    best_bleu: float = -1.0
    bad_evals: int = 0  # validations without improvement (early stopping)
    skipped_steps: int = 0  # optimizer steps skipped for non-finite loss / gradients, in total
    bad_steps: int = 0  # ... in a row, up to now
    engine: dict = field(default_factory=dict)  # DeepSpeed counters: global_steps, micro_steps, ...
    lr_scheduler: dict = field(default_factory=dict)
    optimizer: dict = field(default_factory=dict)  # step, param-group hyperparameters (lr, ...), loss scaler
    layout: dict = field(default_factory=dict)
    world_size: int = 1
    batching: dict = field(default_factory=dict)  # what fixes the batch sequence (see Trainer.batching)
    data_checksum: str = ""
    config: dict = field(default_factory=dict)  # the resolved run config
    version: int = 1

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainState":
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known)


# ---- RNG ----
def capture_rng() -> dict:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"python": random.getstate(), "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos,
                                                     "has_gauss": has_gauss, "gauss": gauss},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict) -> None:
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def reseed(seed: int, step: int, rank: int) -> None:
    """Fresh, reproducible RNG streams when a checkpoint's per-rank states do not fit this layout."""
    s = (seed * 1_000_003 + step * 1009 + rank) % (2 ** 31)
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)


# ---- optimizer state by (part, parameter name) ----
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


def _state_keys(base) -> list[str]:
    for st in base.state.values():
        return [k for k in st if k != "step"]
    return []


def _step_of(base) -> float:
    for st in base.state.values():
        step = st.get("step")
        return float(step) if step is not None else 0.0
    return 0.0


def gather_optimizer_state(engine, module) -> tuple[dict, dict]:
    """({part: {param name: {'fp32': master, <state key>: tensor}}}, optimizer summary).
    `engine`: `trainer.parallel.deepspeed_adapter.Engine`."""
    engine.check_per_parameter_state()
    base, masters = engine.base_optimizer(), engine.masters()
    keys = _state_keys(base)
    out: dict[str, dict] = {}
    for part, name, p in owned_parameters(module):
        master = masters.get(id(p), p)
        st = base.state.get(master, {})
        entry = {"fp32": master.detach(), **{k: st[k] for k in keys if k in st}}
        out.setdefault(part, {})[name] = {k: v.detach().float().cpu().clone() for k, v in entry.items()}
    group = {k: (list(v) if isinstance(v, tuple) else v) for k, v in base.param_groups[0].items()
             if k != "params" and isinstance(v, (int, float, bool, tuple, list, str, type(None)))}
    return out, {"step": _step_of(base), "state_keys": keys, "param_group": group,
                 "loss_scaler": engine.loss_scaler_state()}


def _init_state(base, step: float, keys: list[str]) -> None:
    """Create zero optimizer state (as torch would at its first step) where there is none."""
    for group in base.param_groups:
        on_device = group.get("fused") or group.get("capturable")
        for p in group["params"]:
            st = base.state[p]
            for k in keys:
                st.setdefault(k, torch.zeros_like(p, memory_format=torch.preserve_format))
            st["step"] = torch.tensor(step, dtype=torch.float32, device=p.device if on_device else "cpu")


def scatter_optimizer_state(engine, module, parts: dict, summary: dict) -> list[str]:
    """Load masters and optimizer state saved by `gather_optimizer_state` (in any layout) into this
    rank's parameters; returns the names of owned parameters the checkpoint did not have."""
    engine.check_per_parameter_state()
    base, masters = engine.base_optimizer(), engine.masters()
    keys = list(summary.get("state_keys", []))
    if keys:
        _init_state(base, summary["step"], keys)
    missing = []
    for part, name, p in owned_parameters(module):
        entry = parts.get(part, {}).get(name)
        if entry is None:
            missing.append(f"{part}.{name}")
            continue
        if tuple(entry["fp32"].shape) != tuple(p.shape):
            raise ValueError(f"{part}.{name}: checkpoint shape {tuple(entry['fp32'].shape)} != model shape "
                             f"{tuple(p.shape)}")
        master = masters.get(id(p), p)
        with torch.no_grad():
            master.copy_(entry["fp32"])
            if master is not p:
                p.copy_(master)  # the bf16 weight is the rounded master, as after an optimizer step
        for k in keys:
            base.state[master][k].copy_(entry[k])
    for group in base.param_groups:
        for k, v in summary.get("param_group", {}).items():
            if k in group and k not in ("params", "fused", "foreach", "capturable", "differentiable"):
                group[k] = tuple(v) if isinstance(group[k], tuple) else v
    engine.load_loss_scaler_state(summary.get("loss_scaler", {}))
    return missing

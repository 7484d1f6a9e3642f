"""What a checkpoint holds besides weights and optimizer state (those: trainer.checkpoint.optimizer).

* `TrainState`: the small mutable training state (step, data position, LR scheduler, DeepSpeed's
  step counters, best dev BLEU, ...) next to the frozen config it ran with.
* RNG states of one process (`capture_rng` / `restore_rng`).
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

import numpy as np
import torch


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
    lr_schedule_steps: int = 0  # the steps the LR schedule spans (total_num_steps); 0: none, or not recorded
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

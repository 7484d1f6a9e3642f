"""Small tensor helpers of the model's that need no model: moving host data to the device without making the
host wait, and the head's rounded token count."""
from __future__ import annotations

import torch


def round_count(n: int, bits: int = 4) -> int:
    """n rounded up to a number whose binary digits below the top `bits` are zero: at most
    2 ** (bits - 1) distinct counts per power of two, at most 1 / 2 ** (bits - 1) more. The head's GEMMs
    then see a few dozen distinct shapes instead of a new one every batch: oneDNN creates (JIT-compiles)
    and caches a primitive per shape, ~4 ms and ~0.4 MB each, which was 15% of a step and most of the
    resident memory's growth."""
    return n + (-n % (1 << max(0, n.bit_length() - bits)))


def to_device(t, device, dtype=None) -> torch.Tensor:
    """A host tensor or array on `device` without a device sync: through pinned memory and a
    non-blocking copy on an accelerator (a pageable copy makes the host wait), as is on the CPU."""
    t = torch.as_tensor(t, dtype=dtype)
    device = torch.device(device)
    if device.type == "cpu" or t.device.type != "cpu":
        return t.to(device)
    return (t if t.is_pinned() else t.pin_memory()).to(device, non_blocking=True)

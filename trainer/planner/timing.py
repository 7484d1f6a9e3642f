"""How the calibration times things: the median of repeats after a warm-up, on the host's clock."""
from __future__ import annotations

import statistics
import time

import torch


def timed_ms(fn, reps: int, warmup: int = 2, setup=None) -> float:
    """Median milliseconds of fn() (setup() before each, untimed, its result passed to fn)."""
    times = []
    for i in range(warmup + reps):
        arg = setup() if setup else None
        t = time.perf_counter()
        fn(arg) if setup else fn()
        if i >= warmup:
            times.append(1000 * (time.perf_counter() - t))
    return round(statistics.median(times), 5)


def dtype_of(precision: str):
    return torch.bfloat16 if precision == "bf16" else torch.float32

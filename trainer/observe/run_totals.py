"""The running totals every metrics row carries, so that the steps between two rows have a throughput
of their own, logged or not:

    wall_s          seconds since this process began training, read with the step's own clock at the
                    end of its work (no device sync beyond the step's own; a resume starts again from 0)
    sentences_seen  sentence pairs trained on since then (every step, logged or not)
    tokens_seen     source + target tokens since then (what tokens_per_s counts)

On an accelerator the logged steps time every instruction (train.step_timing=auto), which synchronises
the device at each one; the steps between two rows do not. Their rate is, for rows a and b (b - a >= 2):
    (b.sentences_seen - b's own sentences - a.sentences_seen) / (b.wall_s - b.step_time_s - a.wall_s)
(benchmarks/gpu/gpu_runs.py::untimed_rates), which also covers what each step costs besides its compute
(the stop check, the batch prefetch), and whatever ran after step a (a validation, a checkpoint).
"""
from __future__ import annotations

import time


class RunTotals:
    def __init__(self):
        self.start = time.perf_counter()
        self.sentences = self.tokens = 0

    def begin(self) -> float:
        """Training starts now (the clock of `wall_s`); returns the time."""
        self.start = time.perf_counter()
        return self.start

    def add(self, end: float, sentences: int, tokens: int) -> dict:
        """A step that ended at `end` (time.perf_counter) with these sentences and tokens: its row's columns."""
        self.sentences += sentences
        self.tokens += tokens
        return {"wall_s": end - self.start, "sentences_seen": self.sentences, "tokens_seen": self.tokens}

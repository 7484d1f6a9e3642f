"""Fault injection for the reliability tests (docs/RELIABILITY.md), off unless HNMT_FAULTS is set.

HNMT_FAULTS is a comma-separated list of
    nan@S        the loss of optimizer step S is multiplied by NaN on every rank (non-finite gradients)
    die@S:R      global rank R kills itself with SIGKILL right after step S (R defaults to 0)
"""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field

ENV = "HNMT_FAULTS"


@dataclass(frozen=True)
class Faults:
    nan_steps: frozenset = field(default_factory=frozenset)
    die: dict = field(default_factory=dict)  # step -> rank

    def exit_steps_for(self, rank: int) -> frozenset:
        return frozenset(s for s, r in self.die.items() if r == rank)


def parse(text: str) -> Faults:
    nan, die = set(), {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        kind, _, where = item.partition("@")
        step, _, rank = where.partition(":")
        if kind not in ("nan", "die") or not step.isdigit() or (rank and not rank.isdigit()):
            raise ValueError(f"{ENV}={text!r}: bad item {item!r} (expected nan@STEP or die@STEP[:RANK])")
        if kind == "nan":
            nan.add(int(step))
        else:
            die[int(step)] = int(rank or 0)
    return Faults(frozenset(nan), die)


def from_env() -> Faults:
    return parse(os.environ.get(ENV, ""))


def hard_exit(rank: int, step: int) -> None:
    print(f"rank {rank}: {ENV}: SIGKILL after step {step}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

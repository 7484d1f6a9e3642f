"""Fault injection for the reliability tests (docs/RELIABILITY.md), off unless HNMT_FAULTS is set.

HNMT_FAULTS is a comma-separated list of
    nan@S        the loss of optimizer step S is multiplied by NaN on every rank (non-finite gradients)
    die@S:R      global rank R kills itself with SIGKILL right after step S (R defaults to 0)
    nospace@S:R  global rank R's checkpoint write at step S fails with ENOSPC (a full disk)
    lognospace@S the metrics row of step S is cut after half its bytes by ENOSPC (a disk full while logging)
"""
from __future__ import annotations

import errno
import os
import signal
from dataclasses import dataclass, field

ENV = "HNMT_FAULTS"


@dataclass(frozen=True)
class Faults:
    nan_steps: frozenset = field(default_factory=frozenset)
    die: dict = field(default_factory=dict)  # step -> rank
    nospace: dict = field(default_factory=dict)  # step -> rank
    log_nospace: frozenset = field(default_factory=frozenset)  # steps whose metrics row hits a full disk

    def exit_steps_for(self, rank: int) -> frozenset:
        return frozenset(s for s, r in self.die.items() if r == rank)

    def check_disk(self, rank: int, step: int, path: str) -> None:
        if self.nospace.get(step, -1) == rank:
            raise OSError(errno.ENOSPC, f"No space left on device ({ENV})", path)


def parse(text: str) -> Faults:
    nan, die, nospace, log_nospace = set(), {}, {}, set()
    for item in filter(None, (x.strip() for x in text.split(","))):
        kind, _, where = item.partition("@")
        step, _, rank = where.partition(":")
        if kind not in ("nan", "die", "nospace", "lognospace") or not step.isdigit() or (rank and not rank.isdigit()):
            raise ValueError(f"{ENV}={text!r}: bad item {item!r} (expected nan@STEP, die@STEP[:RANK], "
                             f"nospace@STEP[:RANK] or lognospace@STEP)")
        if kind == "nan":
            nan.add(int(step))
        elif kind == "lognospace":
            log_nospace.add(int(step))
        else:
            (die if kind == "die" else nospace)[int(step)] = int(rank or 0)
    return Faults(frozenset(nan), die, nospace, frozenset(log_nospace))


def from_env() -> Faults:
    return parse(os.environ.get(ENV, ""))


def hard_exit(rank: int, step: int) -> None:
    print(f"rank {rank}: {ENV}: SIGKILL after step {step}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

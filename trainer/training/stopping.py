"""When a run stops early: a signal to any rank or its launcher's exit (trainer.training.job_control), the time
budget (train.max_time_min), the epoch limit (train.max_epochs), or metrics.jsonl that cannot be written. Every
rank stops after the same step: they agree in one small all-reduce."""
from __future__ import annotations

import time

import torch

from trainer.observe.op_counter import host
from trainer.training import job_control


class StopCheck:
    """`state`: the run's TrainState (its step names the step being finished); `stream`: the data stream (its
    epoch); `log`: the run's logger (whether it failed)."""

    def __init__(self, *, runtime, train_cfg, state, stream, log):
        self.rt, self.cfg, self.state, self.stream, self.log = runtime, train_cfg, state, stream, log
        self.signal = None  # what stopped the run, for its last message
        self.started = time.perf_counter()

    def begin(self) -> bool:
        """Signals are stop requests from now on; whether one came before the first step."""
        self.started = time.perf_counter()
        job_control.STOP.begin_training(self._announce)
        flag = host(torch.tensor([float(job_control.STOP.reason is not None)]))
        (stop,) = self.rt.all_reduce(flag, op="max").tolist()
        if stop:
            self.signal = job_control.STOP.reason or "a stop request on another rank"
        return bool(stop)

    def _announce(self, reason: str) -> None:
        if self.signal is None:  # (not once the ranks have agreed to stop: the step is already chosen)
            print(f"rank {self.rt.rank}: {reason}: finishing step {self.state.step + 1}, then saving and exiting",
                  flush=True)

    def after_step(self) -> str | None:
        """Why every rank stops after this step: 'logging', 'signal', 'time', 'epochs', or None."""
        cfg = self.cfg
        out_of_time = bool(cfg.max_time_min) and (time.perf_counter() - self.started) / 60 >= cfg.max_time_min
        flags = host(torch.tensor([float(job_control.STOP.reason is not None), float(out_of_time),
                                   float(self.log.failed is not None)]))
        signalled, out_of_time, logging_failed = self.rt.all_reduce(flags, op="max").tolist()
        if logging_failed:
            return "logging"
        if signalled:
            self.signal = job_control.STOP.reason or "a stop request on another rank"
            return "signal"
        if out_of_time:
            return "time"
        if cfg.max_epochs and self.stream.position().epochs_done >= cfg.max_epochs:  # the step that ends the epoch
            return "epochs"
        return None

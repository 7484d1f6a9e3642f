"""What a run measures of its steps besides the loss: the profiler's window (train.profile_steps), which steps time
every instruction (train.step_timing), the timeline's sampled steps (train.timeline_every), every rank's busy /
waiting / idle fractions in the metrics rows, and RUN_DIR/timing/ at the end."""
from __future__ import annotations

import json
import time

import torch

from trainer.artifacts import run_files
from trainer.artifacts.run_dir import TIMING_DIR, rank_file
from trainer.observe import timeline
from trainer.observe.cpu_threads import ThreadClock
from trainer.observe.op_counter import host

TIMING_WARMUP_STEPS = 3  # steps left out of RUN_DIR/timing/ (the first steps' allocations and caches)


class StepWatch:
    """`profiler`: trainer.observe.profiling.StepProfiler; `timeline`: rank 0's TimelineWriter (None elsewhere);
    `log`: the run's logger; `runner`: the StepRunner, whose instruction times it reads."""

    def __init__(self, *, runtime, runner, profiler, timeline_writer, train_cfg, run_dir: str, log):
        self.rt, self.runner, self.profiler, self.timeline = runtime, runner, profiler, timeline_writer
        self.cfg, self.run_dir, self.log = train_cfg, run_dir, log
        self.interval_wall = 0.0  # seconds of timed steps since the per-rank numbers were last gathered
        self.timed_steps = 0  # timed steps after the warm-up (their op_seconds go to RUN_DIR/timing/)
        self._timed = self._sampled = False
        # CPU time per thread over the training steps after the warm-up, up to the last one (not the final save
        # and dev decode after it): RUN_DIR/timing/ too (trainer.observe.cpu_threads)
        self.cpu, self.cpu_steps, self.cpu_wall, self.cpu_ms = ThreadClock(), 0, 0.0, None

    def begin(self, step: int) -> bool:
        """Before step `step` (before its batches are read): whether it times every instruction."""
        self.profiler.before(step)
        every = self.cfg.timeline_every
        self._sampled = bool(every) and step % every == 0
        self._timed = self._times(step)
        return self._timed

    def start_clock(self) -> float:
        """The step's work starts now (the timeline's spans are relative to it); returns the time."""
        start = time.perf_counter()
        if self._sampled:
            self.runner.record_spans(start)
        return start

    def _times(self, step: int) -> bool:
        """On an accelerator timing synchronises the device at each instruction edge, so only the steps whose
        numbers are used are timed (not the profiled ones: the profiler has the device's own times)."""
        cfg = self.cfg
        if cfg.step_timing == "every" or not self.runner.synchronises:
            return True
        if self.profiler.covers(step):  # the profiler times these itself; its sync count must see ours only
            return False
        return self._sampled or step % cfg.log_every == 0 or step == 1

    def end(self, step: int, elapsed: float) -> None:
        """After step `step`, which took `elapsed` seconds."""
        if self._timed:
            self.interval_wall += elapsed
            self.timed_steps += step > TIMING_WARMUP_STEPS
        if step > TIMING_WARMUP_STEPS and self.cpu_ms is None:
            self.cpu_steps += 1
            self.cpu_wall += elapsed
            if step == self.cfg.max_steps:
                self.cpu_ms = self.cpu.per_step(self.cpu_steps)
        if self._sampled:
            self._write_timeline(step, self.runner.take_spans(), elapsed)
        profile = self.profiler.after(step)
        if profile:
            self.log.message(f"step {step}: profile {profile}")
        if step == TIMING_WARMUP_STEPS:
            self.runner.restart_op_seconds()
            self.cpu.start()

    def _write_timeline(self, step: int, spans: list, elapsed: float) -> None:
        """Every rank's spans of this step to rank 0, which writes the trace and the Gantt chart."""
        layout = self.rt.layout
        label = f"rank {self.rt.rank} (stage {layout.stage}, replica {layout.replica})"
        gathered = self.rt.all_gather_object((label, spans + [("step_end", elapsed, elapsed)]))
        if self.timeline is not None:
            spans_by_rank = [[s for s in sp if s[0] != "step_end"] for _, sp in gathered]
            png = self.timeline.write(step, spans_by_rank, [lab for lab, _ in gathered])
            self.log.message(f"step {step}: timeline {png}")

    def rank_stats(self) -> dict:
        """Every rank's busy / waiting / communicating / idle fractions since the last call, its resident memory and
        its optimizer's (fp32 masters and state: what ZeRO stage 1 shards), as metrics columns (a collective: every
        rank calls it on the same steps)."""
        mine = {**timeline.fractions(self.runner.take_kind_seconds(), self.interval_wall), **timeline.memory_mb(),
                "optimizer_mb": round(self.runner.engine.optimizer_state_bytes() / 2 ** 20, 3)}
        mine.update(self.runner.graph_counts())  # train.cuda_graphs: the same keys on every rank, or none
        self.interval_wall = 0.0
        keys = list(mine)  # the same keys, in the same order, on every rank: one small tensor travels
        every = self.rt.all_gather(host(torch.tensor([float(mine[k]) for k in keys], dtype=torch.float64)))
        per_rank = [dict(zip(keys, row)) for row in host(every).tolist()]
        totals = {k: sum(r[k] for r in per_rank) for k in ("cuda_graphs", "cuda_graphs_mib") if k in keys}
        return {**timeline.rank_columns(per_rank), **{k: round(v, 3) for k, v in totals.items()}}

    def graph_lines(self) -> list[str]:
        """At the run's end, with train.cuda_graphs: every rank's line (graphs captured, replays, fallbacks), for
        rank 0's log (a collective: every rank calls it); [] when graphs are off."""
        graphs = self.runner.graphs
        if graphs is None:
            return []
        lines = self.rt.all_gather_object(f"rank {self.rt.rank}: {graphs.summary()}")
        return lines if self.rt.is_rank0 else []

    def finish(self, step: int) -> None:
        """At the run's end: a profiled window it ended inside, and RUN_DIR/timing/rank{R}.json: mean seconds per
        optimizer step in each instruction type after the warm-up (receives include the time spent waiting for
        the sender: pipeline bubbles show up there)."""
        profile = self.profiler.after(step, end=True)
        if profile:
            self.log.message(f"step {step}: profile {profile} (the run ended inside the profiled steps)")
        steps = self.timed_steps
        if steps <= 0:
            return
        layout = self.rt.layout
        cpu = self.cpu_ms if self.cpu_ms is not None else self.cpu.per_step(self.cpu_steps)
        run_files.write_text(self.run_dir, f"{TIMING_DIR}/{rank_file(self.rt.rank)}", json.dumps(
            {"rank": self.rt.rank, "stage": layout.stage, "replica": layout.replica, "steps": steps,
             "seconds_per_step": {k: v / steps for k, v in sorted(self.runner.op_seconds.items())},
             "wall_ms_per_step": 1000 * self.cpu_wall / max(self.cpu_steps, 1), "cpu_ms_per_step": cpu}, indent=1))

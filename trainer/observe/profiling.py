"""Which kernels a rank's steps spend their CPU time in: `train.profile_steps=N` (with
`train.profile_from=S`, default 10) runs torch.profiler over training steps S+1 .. S+N on every rank and
writes RUN_DIR/profile/rank{R}.json and rank{R}.txt, and the window as a trace, rank{R}.trace.json.gz (host
operators and, on CUDA, the kernels on their streams: open it in Perfetto or chrome://tracing). On CUDA the
window also counts the device syncs by place (torch.cuda.set_sync_debug_mode): `device_syncs_per_step`.
`train.count_ops=true` counts instead, on any device, the window's operator launches and the operations that
would force a device sync (trainer.observe.op_counter), per step and by place: what benchmarks/micro/step_ops.py
tabulates per layout.

The timeline (trainer.observe.timeline) says *when* each instruction ran and who waited for whom; this says
*what* the busy time was made of, per operator: self CPU milliseconds and calls per step, plus the
minor page faults and the step wall time over the profiled steps. Two runs' files side by side
(benchmarks/micro/cpu_accounting.py) show where a parallel layout does more work than one process.
"""
from __future__ import annotations

import json
import os
import resource
import time
import warnings

from trainer.artifacts import run_files
from trainer.artifacts.run_dir import PROFILE_DIR, rank_file


class StepProfiler:
    """Wraps the profiled window of steps: `before(step)` / `after(step)` around every training step
    (`step` = the number of the step about to run / just finished)."""

    def __init__(self, run_dir: str, rank: int, start: int, steps: int, count_ops: bool = False):
        self.run_dir, self.dir = run_dir, os.path.join(run_dir, PROFILE_DIR)
        self.rank, self.first, self.last = rank, start + 1, start + steps
        self.enabled, self.count_ops = steps > 0, count_ops
        self._prof = self._counter = None
        self._faults = self._started = 0.0
        self.cuda = False

    def covers(self, step: int) -> bool:
        return self.enabled and self.first <= step <= self.last

    def before(self, step: int) -> None:
        if self.enabled and step == self.first and self.count_ops:
            from trainer.observe.op_counter import OpCounter

            self._counter = OpCounter()
            self._counter.__enter__()
            self._started = time.perf_counter()
        elif self.enabled and step == self.first:
            import torch
            from torch.profiler import ProfilerActivity, profile

            self.cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
            self._prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else []))
            if self.cuda:  # every device sync of the window, where it happened (torch's sync debug mode)
                self._warnings = warnings.catch_warnings(record=True)
                self._caught = self._warnings.__enter__()
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
            self._prof.__enter__()
            self._faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            self._started = time.perf_counter()

    def after(self, step: int, end: bool = False) -> str | None:
        """Writes the files after the window's last step, or at the run's `end` inside the window (the
        steps done so far); returns the JSON's path then."""
        if (self._prof is None and self._counter is None) or (step != self.last and not end):
            return None
        self.last = step
        if self._counter is not None:
            return self._write_counts()
        wall = time.perf_counter() - self._started
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - self._faults
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        syncs = self._sync_sites()
        steps = self.last - self.first + 1
        events = prof.key_averages()
        ops = {e.key: {"self_ms": e.self_cpu_time_total / 1000 / steps, "calls": e.count / steps}
               for e in events}
        ops = dict(sorted(ops.items(), key=lambda kv: -kv[1]["self_ms"]))
        path = os.path.join(self.dir, rank_file(self.rank))
        run_files.write_text(self.run_dir, f"{PROFILE_DIR}/{rank_file(self.rank)}", json.dumps(
            {"rank": self.rank, "steps": [self.first, self.last], "wall_ms_per_step": 1000 * wall / steps,
             "self_cpu_ms_per_step": sum(o["self_ms"] for o in ops.values()), "minor_faults_per_step": faults / steps,
             **({"device_syncs_per_step": sum(syncs.values()) / steps, "device_sync_sites": syncs,
                 **device_busy(prof, steps, wall)} if self.cuda else {}),
             "ops": ops}, indent=1))
        with run_files.open_write(self.run_dir, f"{PROFILE_DIR}/rank{self.rank}.txt") as f:
            f.write(f"steps {self.first}-{self.last}: self CPU ms over {steps} steps (divide by {steps} "
                    f"for per step)\n")
            f.write(events.table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=60))
            if self.cuda:
                f.write(f"\nself device ms over {steps} steps\n")
                f.write(events.table(sort_by="self_device_time_total", row_limit=40, max_name_column_width=60))
        self._write_trace(prof)
        return path

    def _write_counts(self) -> str:
        """train.count_ops: the window's operator launches and would-be device syncs per step
        (trainer.observe.op_counter), by operator and by place, to rank{R}.json."""
        counter, self._counter = self._counter, None
        counter.__exit__(None, None, None)
        steps = self.last - self.first + 1
        sites: dict = {}
        for op, where in counter.syncs:
            sites[f"{op} at {where}"] = sites.get(f"{op} at {where}", 0) + 1
        run_files.write_text(self.run_dir, f"{PROFILE_DIR}/{rank_file(self.rank)}", json.dumps(
            {"rank": self.rank, "steps": [self.first, self.last], "counted": "ops",
             "wall_ms_per_step": 1000 * (time.perf_counter() - self._started) / steps,
             "syncs_per_step": len(counter.syncs) / steps, "sync_sites": sites,
             "launches_per_step": counter.launches / steps,
             "launches_by_op": {k: v / steps for k, v in counter.by_op.most_common()}}, indent=1))
        return os.path.join(self.dir, rank_file(self.rank))

    def _sync_sites(self) -> dict:
        """CUDA: the window's device syncs by place ("file:line: message"), from torch's sync debug mode."""
        if not self.cuda:
            return {}
        import torch

        torch.cuda.set_sync_debug_mode(0)
        caught = self._caught
        self._warnings.__exit__(None, None, None)
        sites: dict = {}
        for w in caught:
            if "synchroniz" in str(w.message):
                key = f"{os.path.basename(w.filename)}:{w.lineno}: {str(w.message).splitlines()[0][:80]}"
                sites[key] = sites.get(key, 0) + 1
        return dict(sorted(sites.items(), key=lambda kv: -kv[1]))

    def _write_trace(self, prof) -> None:
        """The window as a Chrome / Perfetto trace (host ops and, on CUDA, kernels on their streams),
        gzipped: rank{R}.trace.json.gz."""
        import gzip
        import shutil
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:  # torch writes a path; run.dir is written by run_files only
            raw = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(raw)
            with (open(raw, "rb") as src,
                  run_files.open_write(self.run_dir, f"{PROFILE_DIR}/rank{self.rank}.trace.json.gz", binary=True) as out,
                  gzip.GzipFile(fileobj=out, mode="wb") as dst):
                shutil.copyfileobj(src, dst)


def busy_ms(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of [start, end) intervals (in their unit): kernels that overlap on several streams
    count once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def device_busy(prof, steps: int, wall_s: float) -> dict:
    """The window's device time per step: the union of its kernels' intervals (the device busy; a sum of kernel
    times would count overlapping streams twice) and that over the wall time ({} where the profiler gives no
    kernel intervals)."""
    intervals = []
    try:
        for e in prof.profiler.kineto_results.events():
            if e.device_type().name == "CUDA" and e.duration_ns() > 0:
                intervals.append((e.start_ns() / 1e6, (e.start_ns() + e.duration_ns()) / 1e6))
    except (AttributeError, RuntimeError):
        return {}
    if not intervals:
        return {}
    busy = busy_ms(intervals) / steps
    return {"device_busy_ms_per_step": busy, "device_busy_fraction": busy / (1000 * wall_s / steps),
            "kernels_per_step": len(intervals) / steps}

"""Rank 0 writes metrics.jsonl, wandb and the console; every other rank gets a no-op.

Console: on a terminal, a progress bar; elsewhere (nohup, CI, a scheduler's log file) one compact
line per logged step (step, epoch and how far through it, loss, ppl, lr, fp16's loss scale, skipped steps once
there are any, tokens/s, elapsed, an ETA that counts the validations left: trainer.observe.eta), so the log
tells the story.
wandb: the run config holds the YAML, the DeepSpeed JSON and the resolved layout; every metrics
row is logged (per-rank busy/waiting/communicating fractions and memory included), each validation
adds a table of sample translations; an offline run ends by printing its `wandb sync` command.
"""
from __future__ import annotations

import errno
import io
import json
import math
import os
import sys
import time

from data_prep.dataformat import files, userfiles
from trainer.artifacts import run_files
from trainer.artifacts.run_dir import METRICS
from trainer.observe import wandb_run
from trainer.observe.eta import Eta, duration

SAMPLES_PER_VALIDATION = 8


class NullLogger:
    failed = None  # only rank 0 writes metrics.jsonl

    def log(self, row: dict) -> None:
        pass

    def progress(self, step: int, row: dict) -> None:
        pass

    def samples(self, step: int, rows: list[tuple[str, str, str]]) -> None:
        pass

    def message(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


def compact_line(row: dict, total_steps: int, elapsed: float, eta: str = "-") -> str:
    """One line per logged step for logs that are not a terminal: where the run is (step, epoch and how far
    through it), the numbers of the step, fp16's loss scale and the skipped steps where there are any, the pace,
    the time so far and `eta` (trainer.observe.eta)."""
    where = ""
    if row.get("epoch") is not None and row.get("epoch_progress") is not None:
        where = f"  epoch {row['epoch'] + 1} ({math.floor(100 * row['epoch_progress'] + 1e-9)}%)"
    state = f"  loss scale {row['loss_scale']:g}" if row.get("loss_scale") is not None else ""
    if row.get("skipped_steps"):
        state += f"  skipped {row['skipped_steps']}"
    return (f"step {row['step']}/{total_steps}{where}  loss {row['loss']:.4f}  ppl {row['ppl']:.2f}  "
            f"lr {row['lr']:.2e}{state}  {row['tokens_per_s']:,.0f} tok/s  elapsed {duration(elapsed)}  ETA {eta}")


class RunLogger(NullLogger):
    """Rank 0's logger. `resumed`: the run continues from a checkpoint of `start_step`; rows logged after it
    (a crashed run's, re-run now) and torn rows are dropped from metrics.jsonl first."""

    def __init__(self, run_dir: str, cfg, total_steps: int, start_step: int = 0, extra_config: dict | None = None,
                 resumed: bool = False, faults=None, dev_sentences: int | None = None):
        self.path = os.path.join(run_dir, METRICS)
        note = truncate_metrics(self.path, start_step) if resumed else None
        self._file = run_files.open_write(run_dir, METRICS, append=True)
        self.failed: str | None = None  # why metrics.jsonl could not be written (a full disk); the loop stops
        self._faults = faults
        self.run_dir, self.total, self.start_step = run_dir, total_steps, start_step
        self.log_every = cfg.train.log_every
        self._started = time.perf_counter()
        self._eta = Eta(total_steps, cfg.train.eval_every, dev_sentences)
        self._wandb, self._service = wandb_run.start(run_dir, cfg, extra_config or {}, resumed)
        self._bar = None
        if cfg.logging.progress and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True, mininterval=1.0)
        if note:
            self.message(f"resume: {note}")

    def log(self, row: dict) -> None:
        # strict JSON: a non-finite value (a skipped step's loss) is written as null
        row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        self._append(row["step"], (json.dumps(row) + "\n").encode("utf-8"))
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])
        elapsed = time.perf_counter() - self._started
        eta = self._eta.after(row, elapsed)  # every row: the validations' seconds are taken out of the pace
        if self._bar is None and (row["step"] % self.log_every == 0 or row["step"] == 1) and row.get("loss") is not None:
            self.message(compact_line(row, self.total, elapsed, eta))

    def _append(self, step: int, data: bytes) -> None:
        """One whole row or none: written straight to the descriptor (no buffer to flush later), and a write
        that fails part-way (a full disk) is cut back to the row before, so the file never ends mid-row.
        After a failure nothing more is written; `failed` says why and the trainer stops at its next step."""
        if self.failed is not None:
            return
        fd = self._file.fileno()
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            if self._faults is not None and step in self._faults.log_nospace:
                os.write(fd, view[:len(view) // 2])
                raise OSError(errno.ENOSPC, "No space left on device (HNMT_FAULTS)")
            while view:
                view = view[os.write(fd, view):]
        except OSError as e:
            self.failed = f"writing {self.path} failed at step {step}: {e.strerror or e}"
            try:
                os.ftruncate(fd, start)  # needs no space; a torn row left by a crash is dropped on resume
            except OSError:
                pass

    def progress(self, step: int, row: dict) -> None:
        if self._bar is not None:
            self._bar.n = step
            where = {"epoch": f"{row['epoch'] + 1}"} if row.get("epoch") is not None else {}
            self._bar.set_postfix(**where, loss=f"{row['loss']:.3f}", tok_s=f"{row['tokens_per_s']:.0f}", refresh=False)
            self._bar.refresh()

    def samples(self, step: int, rows: list[tuple[str, str, str]]) -> None:
        """Sample translations of a validation: (source, reference, hypothesis)."""
        if self._wandb is not None and rows:
            import wandb

            table = wandb.Table(columns=["step", "source", "reference", "hypothesis"],
                                data=[[step, *r] for r in rows[:SAMPLES_PER_VALIDATION]])
            self._wandb.log({"dev_samples": table}, step=step)

    def message(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._file.close()
        if self._wandb is not None:
            sync = wandb_run.finish(self._wandb, self._service)
            if sync:
                print(f"wandb: offline run saved; to upload it: {sync}", flush=True)


def truncate_metrics(path: str, step: int) -> str | None:
    """Drop rows a crashed run logged after the checkpoint it resumes from (they are re-run), and rows that
    are not whole JSON objects: a write cut short (a full disk, a kill mid-write) leaves its last row torn.
    Says what it dropped besides the later steps, or None."""
    if not os.path.exists(path):
        return None
    rows, torn = [], []
    with io.TextIOWrapper(files.open_read(path, METRICS), encoding="utf-8", errors="replace", newline="\n") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = userfiles.parse_json(line, path, line=number)  # a torn, repeated-key or too deep row
                if not isinstance(row, dict):
                    raise ValueError("not an object")
            except ValueError:
                torn.append(number)
                continue
            if row.get("step", 0) <= step:
                rows.append(line if line.endswith("\n") else line + "\n")
    with files.replace(path, METRICS, own=True) as f:  # the run's own file, read above
        f.writelines(rows)
    if not torn:
        return None
    where = ", ".join(map(str, torn[:5])) + (" ..." if len(torn) > 5 else "")
    return (f"{path}: dropped {len(torn)} unreadable row(s) (line {where}; a write cut short, e.g. by a full "
            f"disk)")

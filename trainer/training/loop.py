"""The training loop around a `TrainState`: step, validate, save, stop. Everything it uses was built
by `trainer.training.session`; the same loop runs every layout."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time

import torch
from omegaconf import OmegaConf

from trainer.artifacts import checkpoint, run_files
from trainer.artifacts.run_dir import DATA_MANIFEST, RUN_FILES
from trainer.config import to_yaml
from trainer.model.flops import batch_flops
from trainer.observe import timeline
from trainer.observe.logger import NullLogger, RunLogger
from trainer.observe.op_counter import host
from trainer.observe.profiling import StepProfiler
from trainer.observe.run_totals import RunTotals
from trainer.training import faults, job_control, resume
from trainer.training.state import TrainState

TIMING_WARMUP_STEPS = 3


class TrainingError(RuntimeError):
    """Training cannot go on (non-finite steps in a row); the message says why and what was kept."""


class Trainer:
    def __init__(self, session):
        self.s = session
        self.cfg, self.rt, self.engine, self.runner = session.cfg, session.runtime, session.engine, session.runner
        self.run_dir = session.run_dir
        self.state = TrainState()
        resume_from = resume.find(self.rt, self.run_dir, self.cfg.train.resume, self.cfg.run.overwrite,
                                  log=self._print0)
        if self.rt.is_rank0:
            self._init_run_dir()
        self.rt.barrier()
        self._check_shared_run_dir()
        notes = []
        if resume_from:
            self.state, notes = resume.load(resume_from, identity=session.identity(), rt=self.rt, engine=self.engine,
                                            persist=session.persist, stream=session.stream, run_dir=self.run_dir)
        spec = self.rt.spec
        self.log = (RunLogger(self.run_dir, self.cfg, self.cfg.train.max_steps, start_step=self.state.step,
                              extra_config={"deepspeed": session.ds,
                                            "layout": {**spec.to_dict(), "world_size": self.rt.world_size,
                                                       "threads_per_rank": session.threads}},
                              resumed=bool(resume_from), faults=session.faults)
                    if self.rt.is_rank0 else NullLogger())
        self.log.message(f"layout: mode={spec.mode} num_pp={spec.num_pp} num_dp={spec.num_dp} "
                         f"units={spec.micro_batches} chunks={spec.time_chunks} threads/rank={session.threads} "
                         f"train pairs={len(session.train_data)} global micro-batch<={session.global_micro} "
                         f"gas={self.engine.accumulation_steps}")
        for line in notes + self._schedule_notes():
            self.log.message(line)
        self.timeline = timeline.TimelineWriter(self.run_dir) if self.rt.is_rank0 else None
        self.profiler = StepProfiler(self.run_dir, self.rt.rank, self.cfg.train.profile_from,
                                     self.cfg.train.profile_steps, count_ops=self.cfg.train.count_ops)
        self.interval_wall = 0.0  # seconds of timed steps since the per-rank numbers were last gathered
        self.timed_steps = 0  # timed steps after the warm-up (their op_seconds go to RUN_DIR/timing/)
        self.stop_signal = None  # what stopped the run, for its last message
        self.totals = RunTotals()  # every row's wall_s, sentences_seen, tokens_seen

    def _schedule_notes(self) -> list[str]:
        """What DeepSpeed would warn once per rank, said once: a schedule shorter than its warm-up."""
        sched = self.s.ds.get("scheduler") or {}
        params = sched.get("params") or {}
        total, warmup = params.get("total_num_steps"), params.get("warmup_num_steps")
        if isinstance(total, int) and isinstance(warmup, int) and total < warmup:
            return [f"lr schedule: {sched.get('type')} spans {total} steps (train.max_steps, or train.schedule_steps), "
                    f"fewer than its warm-up (scheduler.params.warmup_num_steps={warmup}): the learning rate stays "
                    f"below warmup_max_lr for the whole run"]
        return []

    def _print0(self, text: str) -> None:
        if self.rt.is_rank0:
            print(text, flush=True)

    def _init_run_dir(self) -> None:
        """The run's own files (regular files of run.dir only: trainer.artifacts.run_files)."""
        run_files.make_dirs(self.run_dir, checkpoint.CKPT_DIR)
        run_files.write_text(self.run_dir, "config.yaml", to_yaml(self.cfg))
        run_files.write_text(self.run_dir, "ds_config.json", json.dumps(self.s.ds, indent=1))
        run_files.write_text(self.run_dir, DATA_MANIFEST, json.dumps(self.s.manifest, indent=1))
        for name in RUN_FILES:  # the run translates on its own, even if DATA_DIR moves
            model = run_files.read_capped(os.path.join(self.cfg.data.dir, name), run_files.MAX_SPM_BYTES,
                                          what="a SentencePiece model of data.dir")
            run_files.write_bytes(self.run_dir, name, model)

    def _check_shared_run_dir(self) -> None:
        """Every rank writes its checkpoint files into run.dir: on several nodes it must be one shared
        directory. Found at start, not at the first save hours later."""
        sees = os.path.exists(os.path.join(self.run_dir, "config.yaml"))
        blind = [(r, p["host"]) for r, (ok, p) in enumerate(zip(self.rt.all_gather_object(sees), self.rt.peers))
                 if not ok]
        if blind:
            where = ", ".join(f"rank {r} on {h}" for r, h in blind)
            raise ValueError(f"run.dir={self.run_dir}: {where} does not see the run directory rank 0 created; every "
                             f"node needs it on a shared filesystem at the same path")

    # ---- one optimizer step ----
    def train_step(self) -> dict:
        st, engine, stream = self.state, self.engine, self.s.stream
        batches = [stream.next() for _ in range(engine.accumulation_steps)]
        window_tokens = sum(b.tgt_tokens for b in batches)
        self.runner.inject_nan((st.step + 1) in self.s.faults.nan_steps)
        engine.begin_window()
        skipped_before = engine.skipped_steps
        every = self.cfg.train.timeline_every
        sampled = bool(every) and (st.step + 1) % every == 0
        timed = self._timed(st.step + 1, sampled)
        start = time.perf_counter()
        if sampled:
            self.runner.record_spans(start)
        for micro, b in enumerate(batches):
            out = self.runner.run(b, window_tokens=window_tokens, boundary=engine.is_boundary(),
                                  key=(self.cfg.train.seed, st.step + 1, micro), timed=timed)
        loss, nll = out["loss_sum"], out["nll_sum"]  # the window's, from its boundary micro-step
        elapsed = time.perf_counter() - start
        if timed:
            self.interval_wall += elapsed
            self.timed_steps += st.step + 1 > TIMING_WARMUP_STEPS
        st.step += 1
        skipped = engine.skipped_steps > skipped_before or not math.isfinite(loss)
        st.skipped_steps += skipped
        st.bad_steps = st.bad_steps + 1 if skipped else 0
        tokens = sum(b.src_tokens + b.tgt_tokens for b in batches)
        flops = sum(batch_flops(self.cfg.model, self.s.manifest["vocab"]["tgt_size"], b) for b in batches)
        row = {"step": st.step, "epoch": stream.epoch, "loss": loss / window_tokens,
               "nll": nll / window_tokens, "ppl": math.exp(min(nll / window_tokens, 50)),
               "lr": engine.lr(), "grad_norm": engine.grad_norm(),
               "tokens_per_s": tokens / elapsed, "sentences_per_s": sum(b.size for b in batches) / elapsed,
               "model_gflop": flops / 1e9, "model_gflops_per_s": flops / 1e9 / elapsed,
               "step_time_s": elapsed, "skipped_steps": st.skipped_steps}
        row.update(self.totals.add(start + elapsed, sum(b.size for b in batches), tokens))
        if skipped:
            row.update(skipped=True, bad_steps=st.bad_steps)
        if sampled:
            self._write_timeline(st.step, self.runner.take_spans(), elapsed)
        return row

    def _timed(self, step: int, sampled: bool) -> bool:
        """Whether step `step` times every instruction (train.step_timing): on an accelerator that
        synchronises the device at each instruction edge, so only the steps whose numbers are used
        (not the profiled ones: the profiler has the device's own times)."""
        cfg = self.cfg.train
        if cfg.step_timing == "every" or not self.runner.synchronises:
            return True
        if self.profiler.covers(step):  # the profiler times these itself; its sync count must see ours only
            return False
        return sampled or step % cfg.log_every == 0 or step == 1

    def _write_timeline(self, step: int, spans: list, elapsed: float) -> None:
        """Every rank's spans of this step to rank 0, which writes the trace and the Gantt chart."""
        layout = self.rt.layout
        label = f"rank {self.rt.rank} (stage {layout.stage}, replica {layout.replica})"
        gathered = self.rt.all_gather_object((label, spans + [("step_end", elapsed, elapsed)]))
        if self.timeline is not None:
            spans_by_rank = [[s for s in sp if s[0] != "step_end"] for _, sp in gathered]
            png = self.timeline.write(step, spans_by_rank, [lab for lab, _ in gathered])
            self.log.message(f"step {step}: timeline {png}")

    def _rank_stats(self) -> dict:
        """Every rank's busy / waiting / communicating / idle fractions since the last call, and its
        resident memory, as metrics columns (a collective: every rank calls it on the same steps)."""
        mine = {**timeline.fractions(self.runner.take_kind_seconds(), self.interval_wall), **timeline.memory_mb()}
        self.interval_wall = 0.0
        keys = list(mine)  # the same keys, in the same order, on every rank: one small tensor travels
        every = self.rt.all_gather(host(torch.tensor([float(mine[k]) for k in keys], dtype=torch.float64)))
        return timeline.rank_columns([dict(zip(keys, row)) for row in host(every).tolist()])

    def fit(self) -> None:
        cfg, st = self.cfg.train, self.state
        self.s.module.train()
        stop = None
        started = self.totals.begin()
        if st.step >= cfg.max_steps:
            self.log.message(f"nothing to do: the run is at step {st.step} and train.max_steps={cfg.max_steps}")
        job_control.STOP.begin_training(self._announce_stop)  # signals are stop requests from here on
        if self._stop_requested():  # before the first step (e.g. the launcher watch): nothing new to save
            stop = "signal"
            self.log.message(f"stopped by {self.stop_signal} before step {st.step + 1}: nothing new to save")
        while st.step < cfg.max_steps and not stop:
            stop = self._one_step(started)
        self._end()
        best = f"best dev BLEU {st.best_bleu:.2f}" if self.s.dev_data is not None else "no dev set (no dev BLEU)"
        self.log.message(f"done: step {st.step}, {best}; pairs left out of the last "
                         f"epoch (fewer than data.min_batch_sentences remained): {self.s.stream.left_out}")
        failed = self.rt.broadcast_object(self.log.failed, src=0)  # the last row itself may have failed
        self.s.stream.close()
        self.log.close()
        if failed:
            raise TrainingError(f"{failed}; the final checkpoint {checkpoint.step_name(st.step)} is saved, the "
                                f"metrics rows from that step on are missing")

    def _one_step(self, started: float) -> str | None:
        """A training step and what follows it: stop checks, saving and validating, the metrics row.
        Returns why the run stops after it, or None."""
        cfg, st = self.cfg.train, self.state
        self.profiler.before(st.step + 1)
        row = self.train_step()
        profile = self.profiler.after(st.step)
        if profile:
            self.log.message(f"step {st.step}: profile {profile}")
        if row.get("skipped"):
            self.log.message(f"step {st.step}: non-finite loss or gradients; update skipped "
                             f"({st.bad_steps} in a row, {st.skipped_steps} in total)")
        if st.step in self.s.faults.exit_steps_for(self.rt.rank):
            faults.hard_exit(self.rt.rank, st.step)
        stop = self._stop_reason(started)
        last = st.step == cfg.max_steps or stop is not None
        if st.bad_steps >= cfg.max_bad_steps:
            self.log.log(row)
            raise TrainingError(
                f"{st.bad_steps} optimizer steps in a row had a non-finite loss or gradients (up to step "
                f"{st.step}; train.max_bad_steps={cfg.max_bad_steps}); stopping. The weights were not "
                f"updated by those steps; the newest checkpoint is {checkpoint.read_pointer(self.run_dir, 'latest')}")
        if stop == "signal":
            self.save()
            self.log.message(f"stopped by {self.stop_signal} after step {st.step}: saved "
                             f"{checkpoint.step_name(st.step)}; continue with train.resume=auto")
        elif stop == "logging":  # metrics.jsonl cannot be written (a full disk): keep this step, then stop
            self.save()
            self._end()
            why = self._logging_failure()
            self.log.close()
            raise TrainingError(f"{why}; saved {checkpoint.step_name(st.step)} and stopped: free some space "
                                f"and continue with train.resume=auto")
        elif st.step % cfg.eval_every == 0 or last:
            row.update(self.save(evaluate=True))
            stop = stop or ("early" if self._early_stop() else None)
        elif cfg.save_every and st.step % cfg.save_every == 0:
            self.save()
        if st.step % cfg.log_every == 0 or "dev_loss" in row or last or st.step == 1 or row.get("skipped"):
            row.update(self._rank_stats())
            self.log.log(row)
        self.log.progress(st.step, row)
        if st.step == TIMING_WARMUP_STEPS:
            self.runner.restart_op_seconds()
        return stop

    def _end(self) -> None:
        profile = self.profiler.after(self.state.step, end=True)  # a window the run ended inside
        if profile:
            self.log.message(f"step {self.state.step}: profile {profile} (the run ended inside the profiled steps)")
        self.runner.sync_head()
        self._write_timing()

    def _logging_failure(self) -> str:
        return self.rt.broadcast_object(self.log.failed, src=0) or "writing metrics.jsonl failed on rank 0"

    def _announce_stop(self, reason: str) -> None:
        if self.stop_signal is None:  # (not once the ranks have agreed to stop: the step is already chosen)
            print(f"rank {self.rt.rank}: {reason}: finishing step {self.state.step + 1}, then saving and exiting",
                  flush=True)

    def _stop_requested(self) -> bool:
        """Whether any rank was asked to stop (one small all-reduce; every rank calls it together)."""
        flag = host(torch.tensor([float(job_control.STOP.reason is not None)]))
        (stop,) = self.rt.all_reduce(flag, op="max").tolist()
        if stop:
            self.stop_signal = job_control.STOP.reason or "a stop request on another rank"
        return bool(stop)

    def _stop_reason(self, started: float) -> str | None:
        """Why every rank stops after this step (a signal to any rank or its launcher's exit, the time
        budget, the epoch limit), agreed on by all ranks in one small all-reduce."""
        cfg = self.cfg.train
        flags = host(torch.tensor([float(job_control.STOP.reason is not None),
                                   float(bool(cfg.max_time_min) and (time.perf_counter() - started) / 60 >= cfg.max_time_min),
                                   float(self.log.failed is not None)]))
        signalled, out_of_time, logging_failed = self.rt.all_reduce(flags, op="max").tolist()
        if logging_failed:
            return "logging"
        if signalled:
            self.stop_signal = job_control.STOP.reason or "a stop request on another rank"
            return "signal"
        if out_of_time:
            return "time"
        if cfg.max_epochs and self.s.stream.epoch >= cfg.max_epochs:
            return "epochs"
        return None

    def _write_timing(self) -> None:
        """Per rank: mean seconds per optimizer step in each instruction type, after the warm-up steps
        (receives include the time spent waiting for the sender: pipeline bubbles show up there)."""
        steps = self.timed_steps
        if steps <= 0:
            return
        layout = self.rt.layout
        with run_files.open_write(self.run_dir, f"timing/rank{self.rt.rank}.json") as f:
            json.dump({"rank": self.rt.rank, "stage": layout.stage, "replica": layout.replica, "steps": steps,
                       "seconds_per_step": {k: v / steps for k, v in sorted(self.runner.op_seconds.items())}}, f,
                      indent=1)

    def _early_stop(self) -> bool:
        patience = self.cfg.train.early_stop_patience
        if patience and self.state.bad_evals >= patience:
            self.log.message(f"early stop at step {self.state.step}: dev BLEU did not improve in {patience} "
                             f"validations")
            return True
        return False

    # ---- checkpoints ----
    def snapshot(self) -> TrainState:
        """The TrainState with what DeepSpeed, the data stream and the layout hold right now."""
        s, e = self.s, self.engine
        return dataclasses.replace(
            self.state, stream=s.stream.state_dict(), engine=e.counters(), lr_scheduler=e.lr_scheduler_state(),
            optimizer=s.persist.optimizer_summary, layout=self.rt.spec.to_dict(),
            world_size=self.rt.world_size, batching=s.batching(), data_checksum=s.manifest.get("checksum", ""),
            config=OmegaConf.to_container(self.cfg))

    def save(self, evaluate: bool = False) -> dict:
        """Write a checkpoint of this step (with `evaluate`: validate on its files first, so the dev
        metrics and the best-so-far are part of it). Returns the dev metrics row."""
        try:
            return self._save(evaluate)
        except checkpoint.CheckpointError as e:  # every rank raises it together (Persistence._agree)
            raise TrainingError(str(e)) from None

    def _save(self, evaluate: bool) -> dict:
        st = self.state
        self.runner.sync_head()  # no async collective may be in flight when a save fails and the ranks exit
        tmp = self.s.persist.write_rank_files(st.step)
        row, best = {}, False
        if evaluate and self.s.validator is not None:
            row, samples = self.s.validator.evaluate(tmp, say=self.log.message)
            self.log.samples(st.step, samples)
            loss = row.get("dev_loss")
            self.log.message(f"step {st.step}: dev loss {loss if loss is None else round(loss, 4)} "
                             f"dev BLEU {row['dev_bleu']:.2f} chrF {row['dev_chrf']:.2f} ({self.s.bleu_tokenize})")
            if row["dev_bleu"] > st.best_bleu:
                st.best_bleu, st.bad_evals, best = row["dev_bleu"], 0, True
            else:
                st.bad_evals += 1
        meta = {"step": st.step, "epoch": self.s.stream.epoch, "data_checksum": self.s.manifest.get("checksum"),
                "layout": self.rt.spec.to_dict(), **row}
        self.s.persist.commit(st.step, self.snapshot().to_dict(), meta, best, self.cfg.train.keep_last)
        return row

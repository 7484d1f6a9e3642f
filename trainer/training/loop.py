"""The training loop around a `TrainState`: step, validate, save, stop. Its parts are built by
`trainer.training.build` and handed over by name; the same loop runs every layout."""
from __future__ import annotations

import math
import time

from trainer.artifacts.run_dir import METRICS
from trainer.checkpoint.checkpointer import CheckpointError
from trainer.observe.run_totals import RunTotals
from trainer.training import faults


class TrainingError(RuntimeError):
    """Training cannot go on (non-finite steps in a row); the message says why and what was kept."""


class Trainer:
    """`state`: the restored TrainState; `stream`: the training batches; `runner`: the schedule's interpreter;
    `checkpointer`: saves (trainer.checkpoint); `validator`: dev loss and BLEU (None without a dev set); `log`: the
    run's logger; `watch`: the profiler, timeline and timing (trainer.training.watch); `stop`: the ranks' agreed
    stop checks (trainer.training.stopping); `flops`: the model FLOPs of a batch."""

    def __init__(self, *, train_cfg, runtime, state, stream, module, engine, runner, checkpointer, validator, log,
                 watch, stop, faults, flops):
        self.cfg, self.rt, self.state, self.stream, self.module = train_cfg, runtime, state, stream, module
        self.engine, self.runner, self.checkpointer, self.validator = engine, runner, checkpointer, validator
        self.log, self.watch, self.stop, self.faults, self.flops = log, watch, stop, faults, flops
        self.totals = RunTotals()  # every row's wall_s, sentences_seen, tokens_seen

    # ---- one optimizer step ----
    def train_step(self) -> dict:
        st, engine = self.state, self.engine
        step = st.step + 1
        timed = self.watch.begin(step)
        batches = [self.stream.next() for _ in range(self.runner.window_size)]
        window_tokens = sum(b.tgt_tokens for b in batches)
        self.runner.inject_nan(step in self.faults.nan_steps)
        skipped_before = engine.skipped_steps
        start = self.watch.start_clock()
        out = self.runner.step(batches, key=(self.cfg.seed, step), timed=timed)
        loss, nll = out["loss_sum"], out["nll_sum"]
        elapsed = time.perf_counter() - start
        st.step = step
        skipped = engine.skipped_steps > skipped_before or not math.isfinite(loss)
        st.skipped_steps += skipped
        st.bad_steps = st.bad_steps + 1 if skipped else 0
        tokens = sum(b.src_tokens + b.tgt_tokens for b in batches)
        flops = sum(self.flops(b) for b in batches)
        where = self.stream.position()
        row = {"step": step, "epoch": where.epoch, "epoch_progress": where.fraction, "loss": loss / window_tokens,
               "nll": nll / window_tokens, "ppl": math.exp(min(nll / window_tokens, 50)),
               "lr": engine.lr(), "grad_norm": engine.grad_norm(),
               "tokens_per_s": tokens / elapsed, "sentences_per_s": sum(b.size for b in batches) / elapsed,
               "model_gflop": flops / 1e9, "model_gflops_per_s": flops / 1e9 / elapsed,
               "step_time_s": elapsed, "skipped_steps": st.skipped_steps}
        if engine.fp16:  # bf16 and fp32 scale nothing: no column of ones
            row["loss_scale"] = engine.loss_scale  # after this step's update (an overflow has halved it)
        row.update(self.totals.add(start + elapsed, sum(b.size for b in batches), tokens))
        if skipped:
            row.update(skipped=True, bad_steps=st.bad_steps)
        self.watch.end(step, elapsed)
        return row

    # ---- the run ----
    def fit(self) -> None:
        cfg, st = self.cfg, self.state
        self.module.train()
        stop = None
        self.totals.begin()
        if st.step >= cfg.max_steps:
            self.log.message(f"nothing to do: the run is at step {st.step} and train.max_steps={cfg.max_steps}")
        if self.stop.begin():  # before the first step (e.g. the launcher watch): nothing new to save
            stop = "signal"
            self.log.message(f"stopped by {self.stop.signal} before step {st.step + 1}: nothing new to save")
        while st.step < cfg.max_steps and not stop:
            stop = self._one_step()
        self._end()
        best = dev_bleu_summary(st.best_bleu, self.validator is not None, cfg.eval_every)
        ended = stop_summary(stop, st.step, cfg, self.stop.signal)
        self.log.message(f"done: step {st.step}, {best}{ended}; {data_summary(self.stream)}")
        failed = self.rt.broadcast_object(self.log.failed, src=0)  # the last row itself may have failed
        self.stream.close()
        self.log.close()
        if failed:
            raise TrainingError(f"{failed}; the final checkpoint {self.checkpointer.name(st.step)} is saved, the "
                                f"metrics rows from that step on are missing")

    def _one_step(self) -> str | None:
        """A training step and what follows it: stop checks, saving and validating, the metrics row.
        Returns why the run stops after it, or None."""
        cfg, st = self.cfg, self.state
        row = self.train_step()
        if row.get("skipped"):
            self.log.message(f"step {st.step}: non-finite loss or gradients; update skipped "
                             f"({st.bad_steps} in a row, {st.skipped_steps} in total)")
        if st.step in self.faults.exit_steps_for(self.rt.rank):
            faults.hard_exit(self.rt.rank, st.step)
        stop = self.stop.after_step()
        last = st.step == cfg.max_steps or stop is not None
        if st.bad_steps >= cfg.max_bad_steps:
            self.log.log(row)
            raise TrainingError(
                f"{st.bad_steps} optimizer steps in a row had a non-finite loss or gradients (up to step "
                f"{st.step}; train.max_bad_steps={cfg.max_bad_steps}); stopping. The weights were not "
                f"updated by those steps; the newest checkpoint is {self.checkpointer.latest()}")
        if stop == "signal":
            self.save()
            self.log.message(f"stopped by {self.stop.signal} after step {st.step}: saved "
                             f"{self.checkpointer.name(st.step)}; continue with train.resume=auto")
        elif stop == "logging":  # metrics.jsonl cannot be written (a full disk): keep this step, then stop
            self.save()
            self._end()
            why = self.rt.broadcast_object(self.log.failed, src=0) or f"writing {METRICS} failed on rank 0"
            self.log.close()
            raise TrainingError(f"{why}; saved {self.checkpointer.name(st.step)} and stopped: free some space "
                                f"and continue with train.resume=auto")
        elif st.step % cfg.eval_every == 0 or last:
            row.update(self.save(evaluate=True))
            stop = stop or ("early" if self._early_stop() else None)
        elif cfg.save_every and st.step % cfg.save_every == 0:
            self.save()
        if st.step % cfg.log_every == 0 or "dev_loss" in row or last or st.step == 1 or row.get("skipped"):
            row.update(self.watch.rank_stats())
            self.log.log(row)
        self.log.progress(st.step, row)
        return stop

    def _end(self) -> None:
        self.runner.sync_head()
        self.watch.finish(self.state.step)
        for line in self.watch.graph_lines():
            self.log.message(line)

    def _early_stop(self) -> bool:
        patience = self.cfg.early_stop_patience
        if patience and self.state.bad_evals >= patience:
            self.log.message(f"early stop at step {self.state.step}: dev BLEU did not improve in {patience} "
                             f"validations")
            return True
        return False

    # ---- checkpoints ----
    def save(self, evaluate: bool = False) -> dict:
        """Write a checkpoint of this step (with `evaluate`: validate on its files first, so the dev
        metrics and the best-so-far are part of it). Returns the dev metrics row."""
        self.runner.sync_head()  # no async collective may be in flight when a save fails and the ranks exit
        validate = self._validate if evaluate and self.validator is not None else None
        try:
            return self.checkpointer.save(self.state, validate)
        except CheckpointError as e:  # every rank raises it together
            raise TrainingError(str(e)) from None

    def _validate(self, weights: str) -> tuple[dict, bool]:
        """Dev loss and BLEU of the weights just written; whether they are the best so far."""
        st = self.state
        started = time.perf_counter()
        row, samples = self.validator.evaluate(weights, say=self.log.message)
        row["validation_s"] = time.perf_counter() - started  # the console's ETA counts the validations left
        self.log.samples(st.step, samples)
        loss = row.get("dev_loss")
        self.log.message(f"step {st.step}: dev loss {loss if loss is None else round(loss, 4)} "
                         f"dev BLEU {row['dev_bleu']:.2f} chrF {row['dev_chrf']:.2f} ({self.validator.bleu_tokenize})")
        best = row["dev_bleu"] > st.best_bleu
        if best:
            st.best_bleu, st.bad_evals = row["dev_bleu"], 0
        else:
            st.bad_evals += 1
        return row, best


def dev_bleu_summary(best_bleu: float, has_dev: bool, eval_every: int) -> str:
    """The final line's word on dev BLEU: the best, or why there is none (TrainState.best_bleu is -1 until a
    validation has run: a run stopped before its first one, or resumed from such a checkpoint)."""
    if not has_dev:
        return "no dev set (no dev BLEU)"
    if best_bleu < 0:
        return (f"no dev BLEU yet (no validation has run: every train.eval_every={eval_every} steps and at "
                f"train.max_steps)")
    return f"best dev BLEU {best_bleu:.2f}"


def stop_summary(stop: str | None, step: int, train_cfg, signal: str | None = None) -> str:
    """The final line's word on why the run ended before train.max_steps ('' when it did not)."""
    if stop is None or step >= train_cfg.max_steps:
        return ""
    why = {"time": f"train.max_time_min={train_cfg.max_time_min:g} reached",
           "epochs": f"train.max_epochs={train_cfg.max_epochs} reached",
           "early": f"early stop (train.early_stop_patience={train_cfg.early_stop_patience})",
           "signal": f"stopped by {signal or 'a signal'}"}.get(stop, stop)
    return f"; ended before train.max_steps={train_cfg.max_steps}: {why}"


def data_summary(stream) -> str:
    """Where the data stream ended: the epochs finished, how far through the current one, and what the last
    finished epoch left out (said only when an epoch did finish: the remainder is left out at its end)."""
    where = stream.position()
    now = f"epoch {where.epoch + 1} at {where.percent}% of its {where.total} training pairs"
    if where.epochs_done == 0:
        return f"data: no epoch finished ({now})"
    done = where.epochs_done
    left = stream.left_out_of(done - 1)
    return (f"data: {done} epoch{'s' if done > 1 else ''} finished" + (f", {now}" if done == where.epoch else "")
            + (f"; epoch {done} left out {left} pair{'s' if left != 1 else ''} (fewer than "
               f"data.min_batch_sentences remained after its last batch)" if left else ""))

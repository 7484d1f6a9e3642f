"""The training loop: build the layout, the rank's module and the DeepSpeed engine, then step,
validate, save. The same code runs every mode; the layout decides what each rank holds."""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from omegaconf import OmegaConf

from trainer import checkpoint, faults
from trainer.metrics import dev_scores, dev_tokenize
from trainer.config import to_yaml
from trainer.data import BatchStream, ParallelData, has_split, read_manifest
from trainer.distributed import device, init_distributed, peer_table, print0, set_threads
from trainer.engine import StepRunner, build_rank_module
from trainer.layout import LayoutSpec, ParallelLayout, split_even
from trainer.logger import NullLogger, RunLogger
from trainer.persist import Persistence
from trainer.state import TrainState, capture_rng, reseed, restore_rng
from trainer.translator import DATA_MANIFEST, RUN_FILES


TIMING_WARMUP_STEPS = 3
EVAL_WAIT_S = 2 * 3600  # how long other ranks wait for rank 0's dev BLEU decode


def load_ds_config(path: str, max_steps: int) -> dict:
    """The DeepSpeed JSON; a WarmupDecayLR without total_num_steps decays over train.max_steps."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"--deepspeed_config {path}: no such file")
    with open(path) as f:
        try:
            ds = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None
    sched = ds.get("scheduler")
    if sched and sched.get("type") == "WarmupDecayLR":
        sched.setdefault("params", {}).setdefault("total_num_steps", max_steps)
    if "train_micro_batch_size_per_gpu" not in ds:
        raise ValueError(f"{path}: train_micro_batch_size_per_gpu is required (sentences per replica per micro-batch)")
    if ds.get("zero_optimization", {}).get("stage", 0) > 0:
        raise ValueError(f"{path}: zero_optimization.stage > 0 is not supported: checkpoints keep optimizer state "
                         f"per parameter, which ZeRO's flat partitions do not expose (and the schedule owns the "
                         f"gradient reductions)")
    if ds.get("fp16", {}).get("enabled"):
        raise ValueError(f"{path}: fp16 is not supported (use bf16): checkpoints keep optimizer state per "
                         f"parameter, which DeepSpeed's fp16 optimizer does not expose")
    return ds


class TrainingError(RuntimeError):
    """Training cannot go on (non-finite steps in a row); the message says why and what was kept."""


class Trainer:
    def __init__(self, cfg, ds_config_path: str):
        self.cfg = cfg
        self.rank, world = init_distributed(cfg.train.comm_timeout_s)
        self.peers = peer_table()
        # ranks wait here while rank 0 decodes the dev set, which may take longer than comm_timeout_s;
        # a rank 0 that dies is still noticed at once (its connections close)
        self.eval_group = dist.new_group(timeout=timedelta(seconds=max(cfg.train.comm_timeout_s, EVAL_WAIT_S)))
        self.threads = set_threads(cfg.train.threads)
        ds = load_ds_config(ds_config_path, cfg.train.max_steps)
        spec = LayoutSpec.from_ds_config(ds, world)
        spec.check_model(cfg.model, cfg.data.min_batch_sentences, ds["train_micro_batch_size_per_gpu"])
        self.manifest = read_manifest(cfg.data.dir)
        self.bleu_tokenize = dev_tokenize(cfg.decode.bleu_tokenize, self.manifest, cfg.data.dir)
        vocab = self.manifest["vocab"]
        self.train_data = ParallelData(cfg.data.dir, "train")
        self.dev_data = ParallelData(cfg.data.dir, "dev") if has_split(cfg.data.dir, "dev") else None

        import deepspeed
        from deepspeed.runtime.pipe.topology import PipeDataParallelTopology

        topology = PipeDataParallelTopology(num_pp=spec.num_pp, num_dp=spec.num_dp)
        self.module = build_rank_module(cfg.model, spec, vocab["src_size"], vocab["tgt_size"], cfg.train.seed,
                                        topology)
        self.layout = ParallelLayout.bind(spec, self.module.stages._grid, self.rank)
        self.engine, _, _, _ = deepspeed.initialize(model=self.module, model_parameters=self.module.optimizer_parameters(),
                                                    config=ds, mpu=self.layout.grid)
        self.engine.enable_backward_allreduce = False  # the schedule owns every reduction
        self._record_grad_norm()
        self.runner = StepRunner(self.layout, self.engine, self.module, device(), cfg.model.hidden)
        self.gas = self.engine.gradient_accumulation_steps()
        self.global_micro = ds["train_micro_batch_size_per_gpu"] * spec.num_dp
        self.stream = BatchStream(self.train_data, max_sentences=self.global_micro, max_tokens=cfg.data.max_tokens,
                                  seed=cfg.train.seed, bucket_batches=cfg.data.bucket_batches,
                                  min_batch=cfg.data.min_batch_sentences)
        self.run_dir = cfg.run.dir
        self.step = 0
        self.best_bleu, self.bad_evals = -1.0, 0
        self.skipped_steps = self.bad_steps = 0
        self.faults = faults.from_env()
        self.persist = Persistence(self.run_dir, self.layout, self.module, self.engine, self.faults)
        resume_from = self._find_resume()
        if self.rank == 0:
            self._init_run_dir(ds)
        dist.barrier()
        resume_notes = self._resume(resume_from) if resume_from else []
        self.log = (RunLogger(self.run_dir, cfg, cfg.train.max_steps, start_step=self.step) if self.rank == 0
                    else NullLogger())
        self.log.message(f"layout: mode={spec.mode} num_pp={spec.num_pp} num_dp={spec.num_dp} "
                         f"units={spec.micro_batches} chunks={spec.time_chunks} threads/rank={self.threads} "
                         f"train pairs={len(self.train_data)} global micro-batch<={self.global_micro} gas={self.gas}")
        for line in resume_notes:
            self.log.message(line)
        self.stop_signal = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _record_grad_norm(self) -> None:
        """DeepSpeed's fp32 clipping path computes the global norm but does not keep it (bf16 keeps
        its own): run the same call and remember its result. In fp32 the optimizer step is also
        guarded: a non-finite global norm skips the update, as DeepSpeed's bf16 optimizer does
        (it sets `overflow`, so the engine counts the skip and holds the LR schedule)."""
        from deepspeed.runtime.utils import clip_grad_norm_

        engine, self.last_grad_norm = self.engine, None

        def global_norm(max_norm: float) -> float:
            return float(clip_grad_norm_(parameters=engine.module.parameters(), max_norm=max_norm, mpu=engine.mpu))

        def clip_and_record():
            self.last_grad_norm = global_norm(engine.gradient_clipping())

        engine.clip_fp32_gradients = clip_and_record
        if engine.bfloat16_enabled():
            return
        optimizer, step = engine.optimizer, engine.optimizer.step

        def guarded_step(*args, **kwargs):
            if self.last_grad_norm is None:
                self.last_grad_norm = global_norm(float("inf"))
            optimizer.overflow = not math.isfinite(self.last_grad_norm)
            if not optimizer.overflow:
                return step(*args, **kwargs)

        optimizer.step = guarded_step

    def _init_run_dir(self, ds: dict) -> None:
        os.makedirs(os.path.join(self.run_dir, checkpoint.CKPT_DIR), exist_ok=True)
        with open(os.path.join(self.run_dir, "config.yaml"), "w") as f:
            f.write(to_yaml(self.cfg))
        with open(os.path.join(self.run_dir, "ds_config.json"), "w") as f:
            json.dump(ds, f, indent=1)
        with open(os.path.join(self.run_dir, DATA_MANIFEST), "w") as f:
            json.dump(self.manifest, f, indent=1)
        for name in RUN_FILES:  # the run translates on its own, even if DATA_DIR moves
            shutil.copy(os.path.join(self.cfg.data.dir, name), os.path.join(self.run_dir, name))

    # ---- resuming ----
    def batching(self) -> dict:
        """What fixes the sequence of global batches: a checkpoint's data position means nothing if it differs."""
        d = self.cfg.data
        return {"global_micro_batch": self.global_micro, "max_tokens": d.max_tokens,
                "bucket_batches": d.bucket_batches, "min_batch_sentences": d.min_batch_sentences,
                "seed": self.cfg.train.seed}

    def _find_resume(self) -> str | None:
        """Rank 0 picks the checkpoint (train.resume) and every rank gets its answer or its error."""
        answer = [None, None]
        if self.rank == 0:
            try:
                which, existing = self.cfg.train.resume, checkpoint.complete_checkpoints(self.run_dir)
                if which:
                    answer[0] = checkpoint.find_resume(self.run_dir, which, log=print0)
                    if answer[0] is None:
                        print0(f"resume: {checkpoint.root(self.run_dir)} holds no usable checkpoint; "
                                      f"starting from scratch")
                elif existing:
                    raise checkpoint.CheckpointError(
                        f"run.dir={self.run_dir} already holds checkpoints (newest {existing[-1]}): continue "
                        f"that run with train.resume=auto, or choose another run.dir")
            except checkpoint.CheckpointError as e:
                answer[1] = str(e)
        dist.broadcast_object_list(answer, src=0)
        if answer[1]:
            raise checkpoint.CheckpointError(answer[1])
        return answer[0]

    def _check_compatible(self, ckpt: str, ts: TrainState) -> list[str]:
        """What differs between the checkpoint's run and this one; refused unless train.resume_force."""
        problems = []
        model_now = OmegaConf.to_container(self.cfg.model)
        model_then = ts.config.get("model", {})
        diff = [f"model.{k}: {model_then.get(k)!r} -> {v!r}" for k, v in model_now.items() if model_then.get(k) != v]
        if diff:
            problems.append("model config differs (" + ", ".join(diff) + ")")
        if ts.data_checksum != self.manifest.get("checksum"):
            problems.append(f"training data differs: the checkpoint's data checksum is {ts.data_checksum[:12]}..., "
                            f"{self.cfg.data.dir} has {str(self.manifest.get('checksum'))[:12]}...")
        now = self.batching()
        diff = [f"{k}: {ts.batching.get(k)!r} -> {v!r}" for k, v in now.items() if ts.batching.get(k) != v]
        if diff:
            problems.append("batching differs, so the saved data position would be meaningless (" +
                            ", ".join(diff) + ")")
        if problems and not self.cfg.train.resume_force:
            raise checkpoint.CheckpointError(f"cannot resume from {ckpt}: " + "; ".join(problems) +
                                             ". Set train.resume_force=true to resume anyway.")
        return problems

    def _resume(self, ckpt: str) -> list[str]:
        """Load `ckpt` into this rank; returns what to tell the user."""
        ts = TrainState.from_dict(checkpoint.read_json(os.path.join(ckpt, checkpoint.TRAIN_STATE)))
        notes = [f"resume: from {ckpt} (step {ts.step})"]
        notes += [f"resume: FORCED although {p}" for p in self._check_compatible(ckpt, ts)]
        same_layout = ts.layout == self.layout.spec.__dict__ and ts.world_size == dist.get_world_size()
        self.persist.load(ckpt, ts.optimizer, same_layout)
        if not same_layout:
            reseed(self.cfg.train.seed, ts.step, self.rank)
            then = ts.layout
            notes.append(f"resume: layout changed ({then.get('mode')} {then.get('num_pp')}x{then.get('num_dp')} on "
                         f"{ts.world_size} ranks -> {self.layout.spec.mode} {self.layout.spec.num_pp}x"
                         f"{self.layout.spec.num_dp}): weights and optimizer state restored, RNG streams reseeded")
        if self.engine.lr_scheduler is not None and ts.lr_scheduler:
            self.engine.lr_scheduler.load_state_dict(ts.lr_scheduler)
        for key, value in ts.engine.items():
            setattr(self.engine, key, value)
        self.engine.micro_steps = ts.step * self.gas  # the accumulation boundary follows the new gas
        self.stream.load_state_dict(ts.stream)  # forced with other batching: same epoch and batch count
        self.step, self.best_bleu, self.bad_evals = ts.step, ts.best_bleu, ts.bad_evals
        self.skipped_steps, self.bad_steps = ts.skipped_steps, ts.bad_steps
        if self.rank == 0:
            _truncate_metrics(os.path.join(self.run_dir, "metrics.jsonl"), ts.step)
        return notes

    # ---- one optimizer step ----
    def train_step(self) -> dict:
        batches = [self.stream.next() for _ in range(self.gas)]
        window_tokens = sum(b.tgt_tokens for b in batches)
        self.runner.poison = (self.step + 1) in self.faults.nan_steps
        self.last_grad_norm = None
        skipped_before = self.engine.skipped_steps
        start = time.perf_counter()
        loss = nll = 0.0
        for b in batches:
            out = self.runner.run(b, window_tokens=window_tokens,
                                  boundary=self.engine.is_gradient_accumulation_boundary())
            loss, nll = loss + out["loss_sum"], nll + out["nll_sum"]
        elapsed = time.perf_counter() - start
        self.step += 1
        skipped = self.engine.skipped_steps > skipped_before or not math.isfinite(loss)
        self.skipped_steps += skipped
        self.bad_steps = self.bad_steps + 1 if skipped else 0
        tokens = sum(b.src_tokens + b.tgt_tokens for b in batches)
        grad_norm = self.last_grad_norm if self.last_grad_norm is not None else self.engine.get_global_grad_norm()
        row = {"step": self.step, "epoch": self.stream.epoch, "loss": loss / window_tokens,
               "nll": nll / window_tokens, "ppl": math.exp(min(nll / window_tokens, 50)),
               "lr": self.engine.get_lr()[0], "grad_norm": float(grad_norm) if grad_norm is not None else None,
               "tokens_per_s": tokens / elapsed, "sentences_per_s": sum(b.size for b in batches) / elapsed,
               "step_time_s": elapsed, "skipped_steps": self.skipped_steps}
        if skipped:
            row.update(skipped=True, bad_steps=self.bad_steps)
        return row

    def fit(self) -> None:
        cfg = self.cfg.train
        self.module.train()
        stop = None
        started = time.perf_counter()
        if self.step >= cfg.max_steps:
            self.log.message(f"nothing to do: the run is at step {self.step} and train.max_steps={cfg.max_steps}")
        while self.step < cfg.max_steps and not stop:
            row = self.train_step()
            if row.get("skipped"):
                self.log.message(f"step {self.step}: non-finite loss or gradients; update skipped "
                                 f"({self.bad_steps} in a row, {self.skipped_steps} in total)")
            if self.step in self.faults.exit_steps_for(self.rank):
                faults.hard_exit(self.rank, self.step)
            stop = self._stop_reason(started)
            last = self.step == cfg.max_steps or stop is not None
            if self.bad_steps >= cfg.max_bad_steps:
                self.log.log(row)
                raise TrainingError(
                    f"{self.bad_steps} optimizer steps in a row had a non-finite loss or gradients (up to step "
                    f"{self.step}; train.max_bad_steps={cfg.max_bad_steps}); stopping. The weights were not "
                    f"updated by those steps; the newest checkpoint is {checkpoint.read_pointer(self.run_dir, 'latest')}")
            if stop == "signal":
                self.save()
                self.log.message(f"stopped by {self.stop_signal} after step {self.step}: saved "
                                 f"{checkpoint.step_name(self.step)}; continue with train.resume=auto")
            elif self.step % cfg.eval_every == 0 or last:
                row.update(self.save(evaluate=True))
                stop = stop or ("early" if self._early_stop(row) else None)
            elif cfg.save_every and self.step % cfg.save_every == 0:
                self.save()
            if self.step % cfg.log_every == 0 or "dev_loss" in row or last or self.step == 1 or row.get("skipped"):
                self.log.log(row)
            self.log.progress(self.step, row)
            if self.step == TIMING_WARMUP_STEPS:
                self.runner.op_seconds.clear()
        self.runner.sync_head()
        self._write_timing()
        self.log.message(f"done: step {self.step}, best dev BLEU {self.best_bleu:.2f}; pairs left out of the last "
                         f"epoch (fewer than data.min_batch_sentences remained): {self.stream.left_out}")
        self.log.close()

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.stop_signal is None:
            self.stop_signal = name
            print(f"rank {self.rank}: {name}: finishing step {self.step + 1}, then saving and exiting", flush=True)

    def _stop_reason(self, started: float) -> str | None:
        """Why every rank stops after this step (a signal to any rank, the time budget, the epoch
        limit), agreed on by all ranks in one small all-reduce."""
        cfg = self.cfg.train
        flags = torch.tensor([float(self.stop_signal is not None),
                              float(bool(cfg.max_time_min) and (time.perf_counter() - started) / 60 >= cfg.max_time_min)])
        if dist.get_world_size() > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if flags[0]:
            self.stop_signal = self.stop_signal or "a signal to another rank"
            return "signal"
        if flags[1]:
            return "time"
        if cfg.max_epochs and self.stream.epoch >= cfg.max_epochs:
            return "epochs"
        return None

    def _write_timing(self) -> None:
        """Per rank: mean seconds per optimizer step in each instruction type, after the warm-up steps
        (receives include the time spent waiting for the sender: pipeline bubbles show up there)."""
        steps = self.step - TIMING_WARMUP_STEPS
        if steps <= 0:
            return
        out = os.path.join(self.run_dir, "timing")
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"rank{self.rank}.json"), "w") as f:
            json.dump({"rank": self.rank, "stage": self.layout.stage, "replica": self.layout.replica, "steps": steps,
                       "seconds_per_step": {k: v / steps for k, v in sorted(self.runner.op_seconds.items())}}, f,
                      indent=1)

    def _early_stop(self, row: dict) -> bool:
        patience = self.cfg.train.early_stop_patience
        if patience and self.bad_evals >= patience:
            self.log.message(f"early stop at step {self.step}: dev BLEU did not improve in {patience} validations")
            return True
        return False

    # ---- validation and checkpoints ----
    def dev_loss(self) -> float | None:
        data, min_rows = self.dev_data, self.layout.spec.min_rows
        n = min(len(data), self.cfg.decode.dev_max_sentences or len(data))
        if n < min_rows:
            return None
        parts = split_even(n, max(1, math.ceil(n / self.global_micro)))
        self.module.eval()
        nll = tokens = 0.0
        for a, b in parts:
            batch = data.batch(range(a, b))
            nll += self.runner.run(batch, train=False)["nll_sum"]
            tokens += batch.tgt_tokens
        self.module.train()
        return nll / tokens

    def _evaluate(self, ckpt: str) -> dict:
        """Dev loss (every rank) and dev BLEU (rank 0 decodes from the checkpoint's files); the RNG
        streams are left as they were, so a resumed run continues exactly."""
        row, rng = {}, capture_rng()
        loss = self.dev_loss()
        scores = [None]
        if self.rank == 0:
            scores[0] = self.dev_bleu(ckpt)
        dist.broadcast_object_list(scores, src=0, group=self.eval_group)
        restore_rng(rng)
        if loss is not None:
            row.update(dev_loss=loss, dev_ppl=math.exp(min(loss, 50)))
        row.update(scores[0])
        self.log.message(f"step {self.step}: dev loss {loss if loss is None else round(loss, 4)} "
                         f"dev BLEU {row['dev_bleu']:.2f} chrF {row['dev_chrf']:.2f} ({self.bleu_tokenize})")
        return row

    def dev_bleu(self, ckpt: str) -> dict:
        """Rank 0 decodes the dev set with the whole model loaded from the checkpoint just saved:
        {"dev_bleu", "dev_chrf"}."""
        from trainer.translator import Translator, read_lines

        d = self.cfg.decode
        translator = Translator.from_run(self.run_dir, ckpt, device=device())
        src = read_lines(os.path.join(self.cfg.data.dir, "dev.src.txt"))
        ref = read_lines(os.path.join(self.cfg.data.dir, "dev.tgt.txt"))
        n = d.dev_max_sentences or len(src)
        hyps = translator.translate(src[:n], beam=d.dev_beam)
        return dev_scores(hyps, ref[:n], self.bleu_tokenize)

    def train_state(self) -> TrainState:
        e = self.engine
        return TrainState(
            step=self.step, stream=self.stream.state_dict(), best_bleu=self.best_bleu, bad_evals=self.bad_evals,
            skipped_steps=self.skipped_steps, bad_steps=self.bad_steps,
            engine={"global_steps": e.global_steps, "global_samples": e.global_samples,
                    "skipped_steps": e.skipped_steps},
            lr_scheduler=e.lr_scheduler.state_dict() if e.lr_scheduler is not None else {},
            optimizer=self.persist.optimizer_summary, layout=dict(self.layout.spec.__dict__),
            world_size=dist.get_world_size(), batching=self.batching(),
            data_checksum=self.manifest.get("checksum", ""), config=OmegaConf.to_container(self.cfg))

    def save(self, evaluate: bool = False) -> dict:
        """Write a checkpoint of this step (with `evaluate`: validate on its files first, so the dev
        metrics and the best-so-far are part of it). Returns the dev metrics row."""
        try:
            return self._save(evaluate)
        except checkpoint.CheckpointError as e:  # every rank raises it together (Persistence._agree)
            raise TrainingError(str(e)) from None

    def _save(self, evaluate: bool) -> dict:
        self.runner.sync_head()  # no async collective may be in flight when a save fails and the ranks exit
        tmp = self.persist.write_rank_files(self.step)
        row, best = {}, False
        if evaluate and self.dev_data is not None:
            row = self._evaluate(tmp)
            if row["dev_bleu"] > self.best_bleu:
                self.best_bleu, self.bad_evals, best = row["dev_bleu"], 0, True
            else:
                self.bad_evals += 1
        meta = {"step": self.step, "epoch": self.stream.epoch, "data_checksum": self.manifest.get("checksum"),
                "layout": self.layout.spec.__dict__, **row}
        self.persist.commit(self.step, self.train_state().to_dict(), meta, best, self.cfg.train.keep_last)
        return row


def _truncate_metrics(path: str, step: int) -> None:
    """Drop rows a crashed run logged after the checkpoint it resumes from (they are re-run)."""
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        rows = [line for line in f if line.strip() and json.loads(line).get("step", 0) <= step]
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(rows)
    os.replace(path + ".tmp", path)

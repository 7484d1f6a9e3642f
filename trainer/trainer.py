"""The training loop: build the layout, the rank's module and the DeepSpeed engine, then step,
validate, save. The same code runs every mode; the layout decides what each rank holds."""
from __future__ import annotations

import json
import math
import os
import shutil
import time

import torch
import torch.distributed as dist

from trainer import checkpoint
from trainer.config import to_yaml
from trainer.data import BatchStream, ParallelData, has_split, read_manifest
from trainer.distributed import device, init_distributed, set_threads
from trainer.engine import StepRunner, build_rank_module
from trainer.layout import LayoutSpec, ParallelLayout, split_even
from trainer.logger import NullLogger, RunLogger
from trainer.translator import DATA_MANIFEST, RUN_FILES


TIMING_WARMUP_STEPS = 3


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
    return ds


class Trainer:
    def __init__(self, cfg, ds_config_path: str):
        self.cfg = cfg
        self.rank, world = init_distributed()
        self.threads = set_threads(cfg.train.threads)
        ds = load_ds_config(ds_config_path, cfg.train.max_steps)
        spec = LayoutSpec.from_ds_config(ds, world)
        spec.check_model(cfg.model, cfg.data.min_batch_sentences, ds["train_micro_batch_size_per_gpu"])
        self.manifest = read_manifest(cfg.data.dir)
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
        if self.rank == 0:
            self._init_run_dir(ds)
        dist.barrier()
        self.log = RunLogger(self.run_dir, cfg, cfg.train.max_steps) if self.rank == 0 else NullLogger()
        self.log.message(f"layout: mode={spec.mode} num_pp={spec.num_pp} num_dp={spec.num_dp} "
                         f"units={spec.micro_batches} chunks={spec.time_chunks} threads/rank={self.threads} "
                         f"train pairs={len(self.train_data)} global micro-batch<={self.global_micro} gas={self.gas}")

    def _record_grad_norm(self) -> None:
        """DeepSpeed's fp32 clipping path computes the global norm but does not keep it (bf16/fp16
        keep theirs): run the same call and remember its result."""
        from deepspeed.runtime.utils import clip_grad_norm_

        engine, self.last_grad_norm = self.engine, None

        def clip_and_record():
            self.last_grad_norm = float(clip_grad_norm_(parameters=engine.module.parameters(),
                                                        max_norm=engine.gradient_clipping(), mpu=engine.mpu))

        engine.clip_fp32_gradients = clip_and_record

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

    # ---- one optimizer step ----
    def train_step(self) -> dict:
        batches = [self.stream.next() for _ in range(self.gas)]
        window_tokens = sum(b.tgt_tokens for b in batches)
        start = time.perf_counter()
        loss = nll = 0.0
        for b in batches:
            out = self.runner.run(b, window_tokens=window_tokens,
                                  boundary=self.engine.is_gradient_accumulation_boundary())
            loss, nll = loss + out["loss_sum"], nll + out["nll_sum"]
        elapsed = time.perf_counter() - start
        self.step += 1
        tokens = sum(b.src_tokens + b.tgt_tokens for b in batches)
        grad_norm = self.last_grad_norm if self.last_grad_norm is not None else self.engine.get_global_grad_norm()
        return {"step": self.step, "epoch": self.stream.epoch, "loss": loss / window_tokens,
                "nll": nll / window_tokens, "ppl": math.exp(min(nll / window_tokens, 50)),
                "lr": self.engine.get_lr()[0], "grad_norm": float(grad_norm) if grad_norm is not None else None,
                "tokens_per_s": tokens / elapsed, "sentences_per_s": sum(b.size for b in batches) / elapsed,
                "step_time_s": elapsed}

    def fit(self) -> None:
        cfg = self.cfg.train
        self.module.train()
        stop = False
        started = time.perf_counter()
        while self.step < cfg.max_steps and not stop:
            row = self.train_step()
            if cfg.max_epochs and self.stream.epoch >= cfg.max_epochs:
                stop = True
            if cfg.max_time_min:
                stop = stop or self._agree((time.perf_counter() - started) / 60 >= cfg.max_time_min)
            last = self.step == cfg.max_steps or stop
            if self.step % cfg.eval_every == 0 or last:
                row.update(self.validate())
                stop = stop or self._early_stop(row)
            elif cfg.save_every and self.step % cfg.save_every == 0:
                self.save()
            if self.step % cfg.log_every == 0 or "dev_loss" in row or last or self.step == 1:
                self.log.log(row)
            self.log.progress(self.step, row)
            if self.step == TIMING_WARMUP_STEPS:
                self.runner.op_seconds.clear()
        self.runner.sync_head()
        self._write_timing()
        self.log.message(f"done: step {self.step}, best dev BLEU {self.best_bleu:.2f}; pairs left out of the last "
                         f"epoch (fewer than data.min_batch_sentences remained): {self.stream.left_out}")
        self.log.close()

    @staticmethod
    def _agree(flag: bool) -> bool:
        """True on every rank if it is true on any (clocks differ; ranks must stop together)."""
        t = torch.tensor([float(flag)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

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

    def validate(self) -> dict:
        row = {}
        ckpt = self.save()
        if self.dev_data is None:
            return row
        loss = self.dev_loss()
        bleu = [None]
        if self.rank == 0:
            bleu[0] = self.dev_bleu(ckpt)
        dist.broadcast_object_list(bleu, src=0)
        if loss is not None:
            row.update(dev_loss=loss, dev_ppl=math.exp(min(loss, 50)))
        row["dev_bleu"] = bleu[0]
        if bleu[0] > self.best_bleu:
            self.best_bleu, self.bad_evals = bleu[0], 0
            if self.rank == 0:
                checkpoint.mark_best(self.run_dir, self.step)
        else:
            self.bad_evals += 1
        if self.rank == 0:
            checkpoint.prune(self.run_dir, self.cfg.train.keep_last)
            self.log.message(f"step {self.step}: dev loss {loss if loss is None else round(loss, 4)} "
                             f"dev BLEU {bleu[0]:.2f}")
        return row

    def dev_bleu(self, ckpt: str) -> float:
        """Rank 0 decodes the dev set with the whole model loaded from the checkpoint just saved."""
        import sacrebleu

        from trainer.translator import Translator, read_lines

        d = self.cfg.decode
        translator = Translator.from_run(self.run_dir, ckpt, device=device())
        src = read_lines(os.path.join(self.cfg.data.dir, "dev.src.txt"))
        ref = read_lines(os.path.join(self.cfg.data.dir, "dev.tgt.txt"))
        n = d.dev_max_sentences or len(src)
        hyps = translator.translate(src[:n], beam=d.dev_beam)
        return sacrebleu.corpus_bleu(hyps, [ref[:n]], tokenize=d.bleu_tokenize).score

    def save(self) -> str:
        tmp = os.path.join(self.run_dir, checkpoint.CKPT_DIR, checkpoint.step_name(self.step) + ".tmp")
        checkpoint.save_rank_weights(tmp, self.module, self.layout)
        dist.barrier()
        final = os.path.join(self.run_dir, checkpoint.CKPT_DIR, checkpoint.step_name(self.step))
        if self.rank == 0:
            meta = {"step": self.step, "epoch": self.stream.epoch, "data_checksum": self.manifest.get("checksum"),
                    "layout": self.layout.spec.__dict__}
            checkpoint.finalize(self.run_dir, self.step, meta)
        dist.barrier()
        return final

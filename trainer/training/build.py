"""Everything a training run is built from, built once, in order, from the two config files:

    config + DeepSpeed JSON -> LayoutSpec (checked before any process talks to another)
      -> ParallelRuntime (process group, grid, every group)
      -> data (manifest, splits, the batch stream)
      -> RankModule (this rank's layers and head) -> DeepSpeed engine (through the adapter)
      -> StepRunner (the schedule's interpreter) and Persistence (collective checkpoints)

`Session` only holds what was built; the loop (`trainer.training.loop`) uses it.
"""
from __future__ import annotations

from dataclasses import dataclass

from omegaconf import OmegaConf

from trainer.config import schedule_steps
from trainer.data import BatchStream, ParallelData, Prefetcher, has_split, read_manifest
from trainer.ds_config import check_batch, global_micro_batch, load_ds_config
from trainer.metrics import dev_tokenize
from trainer.model.seq2seq import LOSS_CHUNK_ROWS
from trainer.parallel import deepspeed_adapter as dsa
from trainer.parallel.interpreter import StepRunner
from trainer.parallel.layout import LayoutSpec
from trainer.parallel.rank_module import RankModule, build_rank_module
from trainer.parallel.runtime import ParallelRuntime, launched_world, set_threads
from trainer.training import faults
from trainer.checkpoint.collective import Persistence
from trainer.checkpoint.resume import RunIdentity
from trainer.training.validation import Validator


def plan(cfg, ds_config_path: str, world: int | None = None) -> tuple[dict, LayoutSpec]:
    """The DeepSpeed JSON and the layout for the launched world (or `world`: a dry run), checked against the
    model config; raises before anything is started."""
    ds = load_ds_config(ds_config_path, schedule_steps(cfg.train),
                        "train.schedule_steps" if cfg.train.schedule_steps else "train.max_steps")
    spec = LayoutSpec.from_ds_config(ds, launched_world()[1] if world is None else world)
    spec.check_model(cfg.model, cfg.data.min_batch_sentences, ds["train_micro_batch_size_per_gpu"])
    check_batch(ds, ds_config_path, spec.num_dp)
    return ds, spec


@dataclass
class Session:
    cfg: object
    ds: dict
    runtime: ParallelRuntime
    threads: int
    manifest: dict
    train_data: ParallelData
    dev_data: ParallelData | None
    module: RankModule
    engine: dsa.Engine
    runner: StepRunner
    stream: Prefetcher
    persist: Persistence
    global_micro: int  # sentences of a global micro-batch, at most
    faults: faults.Faults
    bleu_tokenize: str  # sacreBLEU tokenizer of dev BLEU (decode.bleu_tokenize resolved for the target language)
    validator: Validator | None  # None without a dev set

    @property
    def run_dir(self) -> str:
        return self.cfg.run.dir

    def identity(self) -> RunIdentity:
        """What a checkpoint must match to be resumed into this run (trainer.checkpoint.resume)."""
        return RunIdentity(model=OmegaConf.to_container(self.cfg.model), data_dir=self.cfg.data.dir,
                           data_checksum=self.manifest.get("checksum"), batching=self.batching(),
                           seed=self.cfg.train.seed, force=self.cfg.train.resume_force)

    def batching(self) -> dict:
        """What fixes the sequence of global batches: a checkpoint's data position means nothing if it differs."""
        d = self.cfg.data
        return {"global_micro_batch": self.global_micro, "max_tokens": d.max_tokens,
                "bucket_batches": d.bucket_batches, "min_batch_sentences": d.min_batch_sentences,
                "seed": self.cfg.train.seed}


def tune_head(head, train_cfg, device) -> None:
    """The head's loss chunk for the device (train.loss_chunk_rows) and, with train.compile_head, its
    forward compiled by torch.compile with dynamic shapes (batches change every shape but the hidden
    width; the token count is already rounded to a few dozen values)."""
    head.loss_chunk_rows = train_cfg.loss_chunk_rows or LOSS_CHUNK_ROWS["cpu" if device.type == "cpu" else "accelerator"]
    if train_cfg.compile_head:
        import torch

        head.forward = torch.compile(head.forward, dynamic=True)


def build_session(cfg, ds: dict, runtime: ParallelRuntime) -> Session:
    """This rank's share of the run, on a started runtime."""
    spec = runtime.spec
    threads = set_threads(cfg.train.threads)
    manifest = read_manifest(cfg.data.dir)
    bleu_tokenize = dev_tokenize(cfg.decode.bleu_tokenize, manifest, cfg.data.dir)  # can it run? before any step
    vocab = manifest["vocab"]
    train_data = ParallelData(cfg.data.dir, "train")
    dev_data = ParallelData(cfg.data.dir, "dev") if has_split(cfg.data.dir, "dev") else None
    module = build_rank_module(cfg.model, spec, runtime.layout.stage, vocab["src_size"], vocab["tgt_size"],
                               cfg.train.seed)
    if module.head is not None:
        tune_head(module.head, cfg.train, runtime.device())
    engine = dsa.initialize(module, module.optimizer_parameters(), ds, runtime.grid, runtime.stage_sum())
    runner = StepRunner(runtime, engine, module, cfg.model.hidden)
    global_micro = global_micro_batch(ds, spec.num_dp)
    stream = Prefetcher(BatchStream(train_data, max_sentences=global_micro, max_tokens=cfg.data.max_tokens,
                                    seed=cfg.train.seed, bucket_batches=cfg.data.bucket_batches,
                                    min_batch=cfg.data.min_batch_sentences),
                        ahead=engine.accumulation_steps)  # the next optimizer step's batches
    fault_plan = faults.from_env()
    persist = Persistence(cfg.run.dir, runtime, module, engine, fault_plan)
    validator = None if dev_data is None else Validator(
        runtime=runtime, runner=runner, module=module, dev_data=dev_data, global_micro=global_micro,
        decode_cfg=cfg.decode, data_dir=cfg.data.dir, run_dir=cfg.run.dir, bleu_tokenize=bleu_tokenize)
    return Session(cfg=cfg, ds=ds, runtime=runtime, threads=threads, manifest=manifest, train_data=train_data,
                   dev_data=dev_data, module=module, engine=engine, runner=runner, stream=stream, persist=persist,
                   global_micro=global_micro, faults=fault_plan, bleu_tokenize=bleu_tokenize, validator=validator)

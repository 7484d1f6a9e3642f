"""The one construction site of a training run: everything it is built from, built once, in order, from the two
config files, and handed to the Trainer by name:

    config + DeepSpeed JSON -> LayoutSpec (`plan`: checked before any process talks to another)
      -> ParallelRuntime (process group, grid, every group)
      -> data (manifest, splits, the batch stream)
      -> RankModule (this rank's layers and head) -> DeepSpeed engine (through the adapter) -> StepRunner
      -> Checkpointer -> Validator
      -> run.dir opened (trainer.training.start), the checkpoint restored
      -> logger, profiler and timeline (StepWatch), stop checks -> Trainer
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

from omegaconf import OmegaConf

from trainer.checkpoint.checkpointer import Checkpointer
from trainer.checkpoint.resume import RunIdentity
from trainer.config import schedule_steps
from trainer.data import BatchStream, Prefetcher, RunData, load_run_data
from trainer.ds_config import bf16_auto, check_batch, global_micro_batch, with_bf16
from trainer.metrics import dev_tokenize
from trainer.model.flops import batch_flops
from trainer.model.seq2seq import EncoderDecoderLayer
from trainer.observe.logger import NullLogger, RunLogger
from trainer.observe.profiling import StepProfiler
from trainer.observe.timeline import TimelineWriter
from trainer.parallel import deepspeed_adapter as dsa
from trainer.parallel.deepspeed_json import load_ds_config
from trainer.parallel.interpreter import StepRunner
from trainer.parallel.layout import LayoutSpec, ParallelLayout
from trainer.parallel.rank_module import RankModule, build_rank_module
from trainer.parallel.runtime import (ParallelRuntime, accelerator_name, launched_world, omp_threads, pin_cores,
                                      set_threads)
from trainer.training import auto_layout, faults, start, tuning
from trainer.training.loop import Trainer
from trainer.training.stopping import StopCheck
from trainer.training.validation import Validator
from trainer.training.watch import StepWatch


def plan(cfg, ds_config_path: str, world: int | None = None) -> tuple[dict, LayoutSpec | auto_layout.AutoRequest]:
    """The DeepSpeed JSON and the layout for the launched world (or `world`: a dry run), checked against the
    model config; raises before anything is started. `parallel_layout: {"mode": "auto"}`: what the planner will
    choose it from (trainer.training.auto_layout), checked the same way: a profile and prepared data, or one line."""
    ds = load_ds_config(ds_config_path, schedule_steps(cfg.train),
                        "train.schedule_steps" if cfg.train.schedule_steps else "train.max_steps")
    world = launched_world()[1] if world is None else world
    if cfg.train.cuda_graphs == "on":  # (the device asked only then: nothing else here starts CUDA)
        tuning.check_cuda_graphs(cfg.train.cuda_graphs, accelerator_name()[0])
    if auto_layout.requested(ds):
        return ds, auto_layout.check(cfg, ds, world, *accelerator_name())
    spec = LayoutSpec.from_ds_config(ds, world)
    check_layout(cfg, ds, spec, ds_config_path)
    return ds, spec


def check_layout(cfg, ds: dict, spec: LayoutSpec, ds_config_path: str) -> None:
    spec.check_model(cfg.model, cfg.data.min_batch_sentences, ds["train_micro_batch_size_per_gpu"])
    check_batch(ds, ds_config_path, spec.num_dp)


def batching(cfg, global_micro: int) -> dict:
    """What fixes the sequence of global batches: a checkpoint's data position means nothing if it differs."""
    d = cfg.data
    return {"global_micro_batch": global_micro, "max_tokens": d.max_tokens, "bucket_batches": d.bucket_batches,
            "min_batch_sentences": d.min_batch_sentences, "seed": cfg.train.seed}


def identity(cfg, manifest: dict, global_micro: int) -> RunIdentity:
    """What a checkpoint must match to be resumed into this run (trainer.checkpoint.resume)."""
    return RunIdentity(model=OmegaConf.to_container(cfg.model), data_dir=cfg.data.dir,
                       data_checksum=manifest.get("checksum"), batching=batching(cfg, global_micro),
                       seed=cfg.train.seed, force=cfg.train.resume_force)


def tune_head(module: RankModule, train_cfg, runtime: ParallelRuntime, vocab: int) -> str:
    """The head's loss chunk (train.loss_chunk_rows; 0: measured on this machine by the last rank, which always
    holds a head, and the same on every rank: trainer.training.tuning) and its projection's cut
    (train.loss_projection, likewise) and, with train.compile_head, its loss compiled (tuning.compile_head). Call
    on every rank, once the engine has cast the weights.
    Returns where the chunk came from, for the log."""
    head = module.head
    rows, origin = train_cfg.loss_chunk_rows, "train.loss_chunk_rows"
    proj, proj_origin = train_cfg.loss_projection, "train.loss_projection"
    if runtime.rank == runtime.world_size - 1:
        rows, origin, proj, proj_origin = tuning.head_settings(train_cfg, runtime.device(), head.proj.in_features,
                                                               vocab, head.proj.weight.dtype)
    rows, origin, proj, proj_origin = runtime.broadcast_object((rows, origin, proj, proj_origin),
                                                               src=runtime.world_size - 1)
    if head is not None:
        head.loss_chunk_rows, head.loss_projection = rows, proj
        if train_cfg.compile_head:
            tuning.compile_head(head, runtime.device())
    compiled = "; head compiled (train.compile_head)" if train_cfg.compile_head else ""
    return f"loss chunk: {rows} rows of logits ({origin}); projection: {proj} ({proj_origin}){compiled}"


class ModelParts(NamedTuple):
    module: RankModule
    engine: dsa.Engine
    runner: StepRunner


def lstm_weight_notes(module: RankModule, engine: dsa.Engine, cfg, device) -> list[str]:
    """train.stack_layers as it applies, and on CUDA the LSTM weights in cuDNN's flat layout, by the groups their
    calls read (one stack per side where no dropout sits between the layers); not under ZeRO, whose own flat buffer
    holds them."""
    stacked, why = tuning.stack_layers(cfg.train.stack_layers, device, engine.precision, cfg.model.residual)
    for layer in module.layers:
        if isinstance(layer, EncoderDecoderLayer):
            layer.stack = stacked
    if device.type != "cuda":
        return [f"LSTM calls: {why}"]
    if engine.zero_stage:
        return [f"LSTM calls: {why}; weights: views of ZeRO's flat buffer (cuDNN copies them at each call)"]
    return [f"LSTM calls: {why}; " + module.pack_lstm_weights(stacked=cfg.model.dropout == 0 and stacked)]


def length_notes(multiple: int) -> list[str]:
    return [] if multiple == 1 else [f"batch widths: padded up to a multiple of {multiple} (data.length_multiple)"]


def schedule_notes(ds: dict) -> list[str]:
    """What DeepSpeed would warn once per rank, said once: a schedule shorter than its warm-up."""
    sched = ds.get("scheduler") or {}
    params = sched.get("params") or {}
    total, warmup = params.get("total_num_steps"), params.get("warmup_num_steps")
    if isinstance(total, int) and isinstance(warmup, int) and total < warmup:
        return [f"lr schedule: {sched.get('type')} spans {total} steps (train.max_steps, or train.schedule_steps), "
                f"fewer than its warm-up (scheduler.params.warmup_num_steps={warmup}): the learning rate stays "
                f"below warmup_max_lr for the whole run"]
    return []


def zero_notes(engine, spec: LayoutSpec) -> list[str]:
    """ZeRO stage 1 over one replica shards nothing (and in fp32 keeps a master copy the run would not need)."""
    if not engine.zero_stage or spec.num_dp > 1:
        return []
    cost = "; in fp32 it adds an fp32 master copy (1.5x the optimizer memory)" if engine.precision == "fp32" else ""
    return [f"zero_optimization.stage={engine.zero_stage} with one replica (parallel_layout.num_dp=1) shards "
            f"nothing{cost}: drop it, or use replicas"]


class Build:
    """Builds one training run: `trainer()` starts the runtime and builds every part. What it started stays here
    so that the caller can take it down after a failure (`abandon`) or a finished run (`close`).

    The parts are built here and nowhere else (tests/test_architecture.py holds it): the calibration
    (trainer.planner.calibrate_ranks) takes them from a Build too, a world of one: `start_runtime`, then
    `model_parts`, `engine_for` and `runner_for`, then `close`."""

    def __init__(self, cfg, ds: dict, spec: LayoutSpec | auto_layout.AutoRequest, data: RunData | None = None):
        self.cfg, self.ds, self.spec, self.data = cfg, ds, spec, data  # data: loaded here if not given
        self.runtime: ParallelRuntime | None = None
        self.runner: StepRunner | None = None
        self.layout_notes: tuple = ()
        self._bf16: tuple | None = None  # bf16.enabled "auto" as rank 0 decided it: (bf16?, the line saying why)

    def trainer(self) -> Trainer:
        cfg, rt = self.cfg, self.start_runtime()
        ds = self.ds
        if rt.is_rank0:
            print(rt.describe_device(), flush=True)
        threads = set_threads(cfg.train.threads)
        pinned = pin_cores(cfg.train.pin_cores, threads, rt.device().type == "cpu")
        tf32 = tuning.set_tf32(cfg.train.tf32, rt.device())
        data = self.data or load_run_data(cfg.data.dir, "none")
        manifest = data.manifest
        bleu_tokenize = dev_tokenize(cfg.decode.bleu_tokenize, manifest, cfg.data.dir)  # can it run? before any step
        multiple = cfg.data.length_multiple
        train_data = data.train.padded(multiple)
        dev_data = data.dev.padded(multiple) if data.dev is not None else None
        module, engine, self.runner = self.model_parts(manifest["vocab"])
        part_notes = [pinned, tune_head(module, cfg.train, rt, manifest["vocab"]["tgt_size"]), *tf32,
                      *tuning.graph_notes(cfg.train.cuda_graphs, rt.device()),
                      *lstm_weight_notes(module, engine, cfg, rt.device()), *length_notes(multiple),
                      *(tuning.precision_notes(rt.device(), engine.precision, cfg.model.hidden) if rt.is_rank0 else [])]
        global_micro = global_micro_batch(ds, rt.spec.num_dp)
        stream = Prefetcher(BatchStream(train_data, max_sentences=global_micro, max_tokens=cfg.data.max_tokens,
                                        seed=cfg.train.seed, bucket_batches=cfg.data.bucket_batches,
                                        min_batch=cfg.data.min_batch_sentences),
                            ahead=engine.accumulation_steps)  # the next optimizer step's batches
        fault_plan = faults.from_env()
        checkpointer = Checkpointer(run_dir=cfg.run.dir, runtime=rt, module=module, engine=engine, stream=stream,
                                    identity=identity(cfg, manifest, global_micro),
                                    config=OmegaConf.to_container(cfg), keep_last=cfg.train.keep_last,
                                    faults=fault_plan)
        validator = None if dev_data is None else Validator(
            runtime=rt, runner=self.runner, module=module, dev_data=dev_data, global_micro=global_micro,
            decode_cfg=cfg.decode, data_dir=cfg.data.dir, run_dir=cfg.run.dir, bleu_tokenize=bleu_tokenize)
        ckpt = self._open_run_dir(checkpointer, manifest)
        state, notes = checkpointer.restore(ckpt)
        schedule = start.resume_schedule(cfg.train, ds, state, engine, ckpt)
        if schedule and rt.is_rank0:
            start.write_ds_config(cfg.run.dir, ds)  # the length that applies
        log = self._logger(state.step, ckpt is not None, threads, fault_plan, validator and validator.sentences)
        log.message(f"layout: mode={rt.spec.mode} num_pp={rt.spec.num_pp} num_dp={rt.spec.num_dp} "
                    f"units={rt.spec.micro_batches} chunks={rt.spec.time_chunks} threads/rank={threads}"
                    f"{' (OMP_NUM_THREADS)' if cfg.train.threads <= 0 and omp_threads() else ''} "
                    f"train pairs={len(train_data)} global micro-batch<={global_micro} "
                    f"gas={engine.accumulation_steps} {engine.precision} zero_stage={engine.zero_stage}")
        for line in [*self.precision_lines, *self.layout_notes, *part_notes, *notes, *schedule, *schedule_notes(ds),
                     *zero_notes(engine, rt.spec)]:
            log.message(line)
        return Trainer(train_cfg=cfg.train, runtime=rt, state=state, stream=stream, module=module, engine=engine,
                       runner=self.runner, checkpointer=checkpointer, validator=validator, log=log,
                       watch=self._watch(log), stop=StopCheck(runtime=rt, train_cfg=cfg.train, state=state,
                                                               stream=stream, log=log),
                       faults=fault_plan, flops=functools.partial(batch_flops, cfg.model, manifest["vocab"]["tgt_size"]))

    def start_runtime(self) -> ParallelRuntime:
        """The runtime of the layout, started once (a second call returns it); with parallel_layout auto, of the
        layout rank 0's planner chose, every rank taking its answer (self.ds and self.spec become the chosen)."""
        cfg = self.cfg
        if self.runtime is not None:
            return self.runtime
        if isinstance(self.spec, LayoutSpec):
            self.runtime = ParallelRuntime.start(self.spec, cfg.train.comm_timeout_s, verbose=cfg.logging.verbose)
        else:  # the planner ranks the layouts in the precision the run will train in
            request = self.spec
            self.runtime, (spec, choice) = ParallelRuntime.start_agreed(
                lambda world: auto_layout.choose(cfg, self._precise(self.ds), request), cfg.train.comm_timeout_s,
                cfg.logging.verbose)
            self.ds, self.spec, self.layout_notes = auto_layout.apply(self.ds, choice), spec, choice.lines
            check_layout(cfg, self.ds, spec, "parallel_layout auto")
        if bf16_auto(self.ds):  # every rank trains in rank 0's choice
            self._bf16 = self.runtime.broadcast_object(self._bf16_choice() if self.runtime.is_rank0 else None)
            self.ds = self._precise(self.ds)
        return self.runtime

    def _bf16_choice(self) -> tuple[bool, str]:
        """bf16.enabled "auto" decided on this process's device (once; rank 0's is every rank's)."""
        if self._bf16 is None:
            self._bf16 = tuning.bf16_choice(accelerator_name()[0], self.cfg.model.hidden)
        return self._bf16

    def _precise(self, ds: dict) -> dict:
        """`ds` with bf16.enabled "auto" made true or false."""
        return with_bf16(ds, self._bf16_choice()[0]) if bf16_auto(ds) else ds

    @property
    def precision_lines(self) -> tuple:
        return (self._bf16[1],) if self._bf16 is not None else ()

    def model_parts(self, vocab: dict, ds: dict | None = None) -> ModelParts:
        """This rank's layers and head, its DeepSpeed engine (from this build's JSON, or `ds`) and the schedule's
        interpreter, on the started runtime."""
        cfg, rt = self.cfg, self.start_runtime()
        module = build_rank_module(cfg.model, rt.spec, rt.layout.stage, vocab["src_size"], vocab["tgt_size"],
                                   cfg.train.seed)
        engine = self.engine_for(module, module.optimizer_parameters(), ds)
        return ModelParts(module, engine, self.runner_for(module, engine))

    def engine_for(self, module, parameters, ds: dict | None = None) -> dsa.Engine:
        """A DeepSpeed engine (through the adapter) for `module` on the started runtime, from this build's JSON or
        `ds` (the calibration prices DeepSpeed's step for modules of several sizes, in each precision)."""
        rt = self.start_runtime()
        return dsa.initialize(module, parameters, self.ds if ds is None else ds, rt.grid, rt.stage_sum(),
                              rt.rank_sum())

    def runner_for(self, module: RankModule, engine: dsa.Engine, spec: LayoutSpec | None = None) -> StepRunner:
        """The schedule's interpreter for these parts; `spec`: the runtime's layout with other pipeline units or
        time chunks (the calibration times several on one engine), the same ranks in the same places."""
        rt = self.start_runtime()
        if spec is not None:
            if (spec.num_pp, spec.num_dp) != (rt.spec.num_pp, rt.spec.num_dp):
                raise ValueError(f"runner_for: {spec} places the ranks otherwise than the runtime's {rt.spec}")
            rt = dataclasses.replace(rt, layout=ParallelLayout(spec, rt.rank))
        graphs = tuning.graph_cache(self.cfg.train.cuda_graphs, rt.device(), rt.rank)
        return StepRunner(rt, engine, module, self.cfg.model.hidden, graphs)

    def _open_run_dir(self, checkpointer: Checkpointer, manifest: dict) -> str | None:
        """The checkpoint to resume from (or a new run's checks), once the run's files are written and every rank
        sees them."""
        cfg, rt = self.cfg, self.runtime
        ckpt = start.open_run_dir(rt, cfg.run, cfg.train.resume, checkpointer, log=self._print0)
        if rt.is_rank0:
            start.write_run_files(cfg, self.ds, manifest)
        rt.barrier()
        start.check_shared_run_dir(rt, cfg.run.dir)
        return ckpt

    def _logger(self, start_step: int, resumed: bool, threads: int, fault_plan, dev_sentences: int | None):
        if not self.runtime.is_rank0:
            return NullLogger()
        spec = self.runtime.spec
        return RunLogger(self.cfg.run.dir, self.cfg, self.cfg.train.max_steps, start_step=start_step,
                         extra_config={"deepspeed": self.ds, "layout": {**spec.to_dict(), "world_size":
                                                                        self.runtime.world_size,
                                                                        "threads_per_rank": threads}},
                         resumed=resumed, faults=fault_plan, dev_sentences=dev_sentences)

    def _watch(self, log) -> StepWatch:
        cfg, rt = self.cfg, self.runtime
        profiler = StepProfiler(cfg.run.dir, rt.rank, cfg.train.profile_from, cfg.train.profile_steps,
                                count_ops=cfg.train.count_ops)
        return StepWatch(runtime=rt, runner=self.runner, profiler=profiler,
                         timeline_writer=TimelineWriter(cfg.run.dir) if rt.is_rank0 else None,
                         train_cfg=cfg.train, run_dir=cfg.run.dir, log=log)

    def _print0(self, text: str) -> None:
        if self.runtime.is_rank0:
            print(text, flush=True)

    def abandon(self) -> None:
        """After an error every rank raised together (a failed save, bad steps, ...): leave no collective in
        flight (or gloo aborts the process at exit), then close without waiting for the others."""
        if self.runner is not None:
            self.runner.sync_head()
        if self.runtime is not None:
            self.runtime.close(together=False)

    def close(self) -> None:
        """Leave the job with every rank, once what was built is done with (the calibration's world of one)."""
        if self.runtime is not None:
            self.runtime.close()
            self.runtime = None

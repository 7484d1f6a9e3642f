"""Jobs the in-process harness (tests/harness.py) runs on every rank of a gloo job."""
from __future__ import annotations

import json
import os

# The tests' model is the demo's (trainer/configs/demo.yaml) with a unidirectional bottom layer, which every
# layout can cut along time; a test that wants the bidirectional one says so in its overrides. One thread per
# rank: the pool's four workers share two cores, and at this model's size a second thread only waits (OpenMP's
# barriers made a one-rank job's step 2-3x slower, and much more while other work loaded the cores).
BASE = ("model.bidirectional_bottom=false", "train.threads=1")


def train_steps(overrides: list[str], ds: dict, work: str, steps: int) -> dict:
    """Build the run exactly as launch/train.py does (config, plan, trainer.training.build), take
    `steps` optimizer steps, and return the metrics rows and, from replica 0, this rank's parameters
    by global name ('layer_XX.<name>', 'head.<name>') as float32 numpy arrays."""
    trainer = _trainer(overrides, ds, work)
    rows = [trainer.train_step() for _ in range(steps)]
    return _finish(trainer, rows)


def steps_then_save(overrides: list[str], ds: dict, work: str, steps: int) -> dict:
    """As `train_steps`, from the checkpoint `train.resume` names (if it names one), then a checkpoint of the last
    step, as a run saves one; also each rank's optimizer memory (Engine.optimizer_state_bytes)."""
    trainer = _trainer(overrides, ds, work)
    rows = [trainer.train_step() for _ in range(steps)]
    trainer.save()
    optimizer_bytes = trainer.engine.optimizer_state_bytes()
    return {**_finish(trainer, rows), "optimizer_bytes": optimizer_bytes, "zero_stage": trainer.engine.zero_stage}


def layers_time_chunked(overrides: list[str], ds: dict, work: str) -> list[bool]:
    """Each of this rank's LSTM layers: built to be called in time chunks (for model.lstm_kernel=auto)?"""
    from trainer.model.seq2seq import EncoderDecoderLayer

    trainer = _trainer(overrides, ds, work)
    flags = [m.time_chunked for m in trainer.module.modules() if isinstance(m, EncoderDecoderLayer)]
    _finish(trainer, [])
    return flags


def early_reduce_points(overrides: list[str], ds: dict, work: str, steps: int) -> dict:
    """Where this rank's boundary program starts summing a group of gradients early (op, kind, parameters
    of the group), and the metrics rows of `steps` optimizer steps taken with them."""
    trainer = _trainer(overrides, ds, work)
    program = trainer.runner.programs[True]
    points = [(program[i].op, program[i].kind, len(params)) for i, params in sorted(trainer.runner.early_reduce.items())]
    rows = [trainer.train_step() for _ in range(steps)]
    return {**_finish(trainer, rows), "points": points}


def graphed_steps(overrides: list[str], ds: dict, work: str, steps: int, prove: bool = False,
                  skew: float = 0.0) -> dict:
    """As `train_steps`, with train.cuda_graphs' cache on the CPU stand-in backend forced into the runner (`prove`:
    as auto; `skew`: added to every replayed forward output, a backend that computes something else). Also the
    cache's counts, the lines it said, a logged row's columns of it and the run's end lines."""
    import dataclasses

    from trainer.model.graphs import GraphCache

    trainer = _trainer(overrides, ds, work)
    lines: list = []
    trainer.runner.graphs = GraphCache(SkewedBackend(skew), prove=prove, say=lines.append)
    rows = [trainer.train_step() for _ in range(steps)]
    stats = dataclasses.asdict(trainer.runner.graphs.stats)
    columns, end_lines = trainer.watch.rank_stats(), trainer.watch.graph_lines()  # collectives: every rank
    return {**_finish(trainer, rows), "stats": stats, "lines": lines, "columns": columns, "end_lines": end_lines}


class SkewedBackend:
    """The CPU stand-in, its replayed forward outputs shifted by `skew` (0: the stand-in itself)."""

    def __new__(cls, skew: float):
        from trainer.model.graphs import RecordingBackend

        class Skewed(RecordingBackend):
            def capture(self, thunk, pool):
                replay, static = super().capture(thunk, pool)

                def skewed() -> None:
                    replay()
                    if skew and static and static[0] is not None and static[0].requires_grad:  # the forward
                        static[0].detach().add_(skew)
                return skewed, static
        return Skewed()


def auto_precision(overrides: list[str], ds: dict, work: str, ratios: list) -> dict:
    """A trainer built with bf16.enabled "auto", where this rank's measured bf16/fp32 GEMM ratio is
    `ratios[rank]` (each rank a different CPU, as far as the choice can tell): the precision its engine trains in,
    the line the run logs and one step's row."""
    from trainer.config import load_config, merge_overrides
    from trainer.training import tuning
    from trainer.training.build import Build, plan

    measured = tuning.bf16_over_fp32
    tuning.bf16_over_fp32 = lambda width: (ratios[int(os.environ["RANK"])], "set by the test")
    try:
        cfg = load_config(None, merge_overrides(BASE, overrides, [f"run.dir={work}/run", "logging.wandb_mode=disabled",
                                                                  "logging.progress=false"]))
        build = Build(cfg, *plan(cfg, _ds_file(ds, work)))
        trainer = build.trainer()
    finally:
        tuning.bf16_over_fp32 = measured
    rows = [trainer.train_step()]
    return {**_finish(trainer, rows), "precision": trainer.engine.precision, "lines": list(build.precision_lines)}


def _finish(trainer, rows: list) -> dict:
    """Close the trainer's run (its run.dir lock too, so that the next job may resume from it) and return `rows`
    with, from replica 0, this rank's parameters by global name."""
    from trainer.artifacts.run_files import release_run_dir

    runtime = trainer.rt
    trainer.runner.sync_head()
    trainer.log.close()
    params = {}
    if runtime.layout.replica == 0:
        module = trainer.module
        for offset, layer in enumerate(module.layers):
            for name, p in layer.named_parameters():
                params[f"layer_{module.first_layer + offset:02d}.{name}"] = p.detach().float().numpy().copy()
        if module.owns_head:
            for name, p in module.head.named_parameters():
                params[f"head.{name}"] = p.detach().float().numpy().copy()
    trainer.stream.close()
    release_run_dir()
    runtime.close()
    return {"rows": rows, "params": params}


def _trainer(overrides: list[str], ds: dict, work: str, config: str | None = None, extra: tuple = ()):
    """A Trainer built exactly as launch/train.py builds one (config, plan, trainer.training.build); `config`: a
    YAML, else the demo's defaults."""
    from trainer.config import load_config, merge_overrides
    from trainer.training.build import Build, plan

    path = _ds_file(ds, work)
    cfg = load_config(config, merge_overrides(BASE, overrides, [f"run.dir={work}/run", "logging.wandb_mode=disabled",
                                                                "logging.progress=false"], extra))
    ds_loaded, spec = plan(cfg, path)
    return Build(cfg, ds_loaded, spec).trainer()


def _ds_file(ds: dict, work: str) -> str:
    """The DeepSpeed JSON as a file (rank 0 writes it, the others wait for it), as the CLI reads it. Named by its
    content: jobs that share `work` (a run resumed in another layout) each wait for their own JSON, never read the
    last job's (rank 1 of test_zero's data_2 leg read the single leg's `ds.json` before rank 0 replaced it)."""
    import hashlib

    os.makedirs(work, exist_ok=True)
    text = json.dumps(ds, sort_keys=True)
    path = os.path.join(work, f"ds-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json")
    if int(os.environ["RANK"]) == 0:
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
    else:
        _wait_for(path)
    return path


def _wait_for(path: str, timeout: float = 30) -> None:
    import time

    deadline = time.time() + timeout
    while not os.path.exists(path):
        if time.time() > deadline:
            raise TimeoutError(path)
        time.sleep(0.01)


def adapter_touch_points(overrides: list[str], ds: dict, work: str) -> dict:
    """Exercise every DeepSpeed touch point of trainer/parallel/deepspeed_adapter.py on a started
    job and report what was observed (asserted by tests/test_deepspeed_adapter.py)."""
    import glob
    import math

    import torch

    from trainer.config import load_config, merge_overrides
    from trainer.data import BatchStream, ParallelData
    from trainer.parallel import deepspeed_adapter as dsa
    from trainer.parallel.layout import LayoutSpec, group_members
    from trainer.data import read_manifest
    from trainer.ds_config import global_micro_batch
    from trainer.training.build import Build

    cfg = load_config(None, merge_overrides(BASE, overrides, [f"run.dir={work}/run", "logging.wandb_mode=disabled",
                                                            "train.comm_timeout_s=60"]))
    world = int(os.environ["WORLD_SIZE"])
    spec = LayoutSpec.from_ds_config(ds, world)
    build = Build(cfg, ds, spec)
    rt = build.start_runtime()
    obs = {"rank": rt.rank, "stage": rt.layout.stage, "replica": rt.layout.replica}
    # distributed: DeepSpeed's shm op is neither built nor loaded, so it maps no /dev/shm buffer
    obs["shm_op"] = repr(dsa.shm_op())
    obs["shm_left"] = glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_*_{os.environ['MASTER_PORT']}_*")
    # grid: the groups DeepSpeed built are the layout's, and the handles reduce over exactly them
    obs["grid_members"] = dsa.grid_members(rt.grid)
    obs["layout_members"] = {k: next(g for g in v if rt.rank in g) for k, v in group_members(spec).items()}
    for name in ("pipe", "data", "world"):
        t = torch.tensor([float(rt.rank + 1)])
        obs[f"sum_over_{name}"] = float(rt.all_reduce(t, group=name))
    # stages + engine
    module, engine, runner = build.model_parts(read_manifest(cfg.data.dir)["vocab"])
    obs["local_start"] = module.first_layer
    obs["local_layers"] = [type(m).__name__ for m in module.layers]
    obs["stage_id"] = dsa.stage_id(module.stages)
    obs["backward_allreduce"] = engine.ds.enable_backward_allreduce
    obs["mpu_is_grid"] = engine.ds.mpu is rt.grid
    obs["bf16"], obs["fp16"], obs["loss_scale"] = engine.bf16, engine.fp16, engine.loss_scale
    # one real step: the recorded global norm equals the norm of every owned gradient over all ranks
    stream = BatchStream(ParallelData(cfg.data.dir, "train"), max_sentences=global_micro_batch(ds, spec.num_dp),
                         max_tokens=0,
                         seed=1, bucket_batches=10, min_batch=cfg.data.min_batch_sentences)
    batch = stream.next()
    runner.step([batch])
    obs["grad_norm"] = engine.grad_norm()
    obs["lr"] = engine.lr()
    obs["skipped_after_good_step"] = engine.skipped_steps
    # counters round trip
    counters = engine.counters()
    engine.load_counters({**counters, "global_steps": 41}, step=41)
    obs["counters"] = engine.counters()
    obs["micro_steps"] = engine.ds.micro_steps
    obs["accumulation_steps"] = engine.accumulation_steps
    engine.load_counters(counters, step=1)
    # the optimizer by parameter
    masters = engine.masters()
    owned = [p for p in module.optimizer_parameters()]
    obs["masters"] = len(masters)
    obs["owned"] = len(owned)
    obs["masters_fp32_match"] = all(masters[id(p)].dtype == torch.float32 and
                                    torch.equal(masters[id(p)].to(p.dtype), p.detach()) for p in owned) if masters else None
    base = engine.base_optimizer()
    obs["state_keyed_by_master"] = all((masters.get(id(p), p) in base.state) for p in owned)
    obs["state_keys"] = sorted(k for k in next(iter(base.state.values())) if k != "step")
    obs["scaler"] = engine.loss_scaler_state()
    engine.load_loss_scaler_state(obs["scaler"])
    sched = engine.lr_scheduler_state()
    engine.load_lr_scheduler_state(sched)
    obs["scheduler_state"] = bool(sched)
    engine.check_per_parameter_state()
    owned[0]._hp_mapping = object()
    try:
        engine.check_per_parameter_state()
        obs["hp_mapping_refused"] = False
    except NotImplementedError:
        obs["hp_mapping_refused"] = True
    del owned[0]._hp_mapping
    # fp32 only: a non-finite gradient makes the guarded step skip the update (as bf16's optimizer does)
    if not (engine.bf16 or engine.fp16):
        before = [p.detach().clone() for p in owned]
        skipped = engine.skipped_steps
        runner.inject_nan(True)
        runner.step([stream.next()])
        runner.inject_nan(False)
        obs["nan_norm_finite"] = math.isfinite(engine.grad_norm())
        obs["nan_step_skipped"] = engine.skipped_steps == skipped + 1
        obs["nan_params_unchanged"] = all(torch.equal(a, p.detach()) for a, p in zip(before, owned))
    runner.sync_head()
    rt.close()
    return obs


def listening_sockets(master_addr: str | None = None) -> dict:
    """Start a runtime (MASTER_ADDR replaced by `master_addr` if given) and report this process's
    listening TCP sockets as (ip, port)."""
    import psutil

    from trainer.parallel.layout import LayoutSpec
    from trainer.parallel.runtime import ParallelRuntime

    if master_addr:
        os.environ["MASTER_ADDR"] = master_addr
    world = int(os.environ["WORLD_SIZE"])
    spec = LayoutSpec.from_ds_config({"parallel_layout": {"mode": "single" if world == 1 else "hybrid"}}, world)
    rt = ParallelRuntime.start(spec, comm_timeout_s=60)
    listening = [(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="tcp")
                 if c.status == psutil.CONN_LISTEN]
    rt.close()
    return {"rank": rt.rank, "listening": listening, "master_port": int(os.environ["MASTER_PORT"])}


def timeline_job(overrides: list[str], ds: dict, work: str, steps: int) -> dict:
    """`steps` steps with the timeline on every step; returns this rank's gathered per-rank stats
    (the metrics columns) and its program."""
    trainer = _trainer(overrides, ds, work, extra=("train.timeline_every=1",))
    for _ in range(steps):
        trainer.train_step()
    stats = trainer.watch.rank_stats()
    trainer.watch.finish(steps)  # RUN_DIR/timing/rank{R}.json
    program = [i.op for i in trainer.runner.programs[True]]
    trainer.runner.sync_head()
    trainer.log.close()
    trainer.rt.close()
    return {"stats": stats, "program": program, "run_dir": f"{work}/run"}


def lean_step_matches_deepspeed(overrides: list[str], ds: dict, work: str) -> dict:
    """The same gradients stepped by DeepSpeed's own step (bf16: FP16_UnfusedOptimizer.step; fp32: its
    clip_grad_norm_ hook and the torch optimizer's step) and by the adapter's lean_step: the
    parameters, masters, Adam state and global norm after each."""
    import copy

    import torch

    from trainer.config import load_config, merge_overrides
    from trainer.data import BatchStream, ParallelData
    from trainer.parallel.layout import LayoutSpec
    from trainer.data import read_manifest
    from trainer.ds_config import global_micro_batch
    from trainer.training.build import Build

    cfg = load_config(None, merge_overrides(BASE, overrides, [f"run.dir={work}/run", "logging.wandb_mode=disabled",
                                                            "train.comm_timeout_s=60"]))
    spec = LayoutSpec.from_ds_config(ds, int(os.environ["WORLD_SIZE"]))
    build = Build(cfg, ds, spec)
    rt = build.start_runtime()
    module, adapter, runner = build.model_parts(read_manifest(cfg.data.dir)["vocab"])
    engine = adapter.ds
    opt = engine.optimizer
    bf16 = hasattr(opt, "fp32_groups")
    torch_opt = opt.optimizer if bf16 else opt
    stream = BatchStream(ParallelData(cfg.data.dir, "train"), max_sentences=global_micro_batch(ds, spec.num_dp),
                         max_tokens=0,
                         seed=1, bucket_batches=10, min_batch=cfg.data.min_batch_sentences)
    batch = stream.next()
    outcome = {}
    lows = [p for g in opt.fp16_groups for p in g] if bf16 else []
    highs = [p for g in opt.fp32_groups for p in g] if bf16 else [p for g in opt.param_groups for p in g["params"]]
    every = list(module.parameters())  # the head replica too (the owner broadcasts into it)
    saved = ([p.detach().clone() for p in every], [p.detach().clone() for p in highs],
             copy.deepcopy(torch_opt.state_dict()))
    lean = opt.step  # the adapter's, bound to this instance
    for name in ("deepspeed", "lean"):
        runner.sync_head()
        with torch.no_grad():
            for p, v in zip(every, saved[0]):
                p.copy_(v)
            for p, v in zip(highs, saved[1]):
                p.copy_(v)
        torch_opt.load_state_dict(copy.deepcopy(saved[2]))
        if name == "deepspeed":  # DeepSpeed's own methods, not the instance's replacements
            opt.step = type(opt).step.__get__(opt)
            engine.clip_fp32_gradients = type(engine).clip_fp32_gradients.__get__(engine)
        else:
            opt.step = lean
            del engine.clip_fp32_gradients
            engine.clip_fp32_gradients = lambda: None
        runner.step([batch], key=(1, 1))
        norm = opt._global_grad_norm if bf16 else adapter.last_grad_norm
        if name == "deepspeed" and not bf16:  # DeepSpeed's fp32 hook does not keep its norm: recompute it
            norm = None
        outcome[name] = {"norm": None if norm is None else float(norm),
                         "lows": [p.detach().float().clone() for p in lows],
                         "highs": [p.detach().clone() for p in highs],
                         "exp_avg_sq": [torch_opt.state[p]["exp_avg_sq"].clone() for p in highs]}
    runner.sync_head()
    rt.close()
    a, b = outcome["deepspeed"], outcome["lean"]
    diff = max(max((float((x - y).abs().max()) for x, y in zip(a[k], b[k])), default=0.0)
               for k in ("lows", "highs", "exp_avg_sq"))
    return {"norm": (a["norm"], b["norm"]), "max_diff": diff, "bf16": bf16,
            "moved": max(float((x - y).abs().max()) for x, y in zip(a["highs"], saved[1]))}


def count_step_ops(overrides: list[str], ds: dict, work: str, warmup: int = 1, config: str | None = None) -> dict:
    """`warmup` optimizer steps, then one more under trainer.observe.op_counter.OpCounter: the would-be device
    syncs (op, place) and the operator launches of that step on this rank (`config`: a YAML, else the
    demo's defaults)."""
    from trainer.observe.op_counter import OpCounter

    trainer = _trainer(overrides, ds, work, config)
    for _ in range(warmup):
        trainer.train_step()
    with OpCounter() as counter:
        row = trainer.train_step()
    trainer.runner.sync_head()
    trainer.log.close()
    trainer.rt.close()
    return {"syncs": counter.syncs, "launches": counter.launches, "by_op": dict(counter.by_op), "row": row}


def overflow_steps(overrides: list[str], ds: dict, work: str, steps: int) -> dict:
    """`steps` optimizer steps: per step whether it was skipped, the learning rate after it, the loss scale before
    and after it, and whether this rank's fp32 master weights (ZeRO: its partitions) changed (fp16's dynamic loss
    scaling)."""
    import torch

    trainer = _trainer(overrides, ds, work)
    masters = trainer.engine.masters()
    params = ([g.master for g in trainer.engine.zero_groups] or
              [masters.get(id(p), p) for p in trainer.module.optimizer_parameters()])
    out = []
    for _ in range(steps):
        before, scale = [p.detach().clone() for p in params], trainer.engine.loss_scale
        row = trainer.train_step()
        out.append({"skipped": bool(row.get("skipped")), "lr": row["lr"], "scale": (scale, trainer.engine.loss_scale),
                    "moved": any(not torch.equal(a, p.detach()) for a, p in zip(before, params)),
                    "skipped_steps": trainer.engine.skipped_steps})
    trainer.runner.sync_head()
    trainer.log.close()
    trainer.rt.close()
    return {"steps": out}


def lean_zero_step_matches_deepspeed(overrides: list[str], ds: dict, work: str) -> dict:
    """ZeRO stage 1: the same gradients stepped by DeepSpeed's own DeepSpeedZeroOptimizer.step (its gradient
    partitions built as its unmanaged-accumulation boundary builds them, from the parameters' gradients) and by the
    adapter's lean_zero_step: this rank's master partition, weights, Adam state and global norm after each; and
    what the adapter saw of ZeRO's layout (the elements of each parameter this rank's partition holds)."""
    import copy

    import torch

    from trainer.config import load_config, merge_overrides
    from trainer.data import BatchStream, ParallelData, read_manifest
    from trainer.ds_config import global_micro_batch
    from trainer.parallel.layout import LayoutSpec
    from trainer.training.build import Build

    cfg = load_config(None, merge_overrides(BASE, overrides, [f"run.dir={work}/run", "logging.wandb_mode=disabled",
                                                            "train.comm_timeout_s=60"]))
    spec = LayoutSpec.from_ds_config(ds, int(os.environ["WORLD_SIZE"]))
    build = Build(cfg, ds, spec)
    rt = build.start_runtime()
    module, adapter, runner = build.model_parts(read_manifest(cfg.data.dir)["vocab"])
    opt, groups = adapter.ds.optimizer, adapter.zero_groups
    names = {id(p): n for n, p in module.named_parameters()}
    held = {names[id(p)]: count for g in groups for p, _, _, count in g.pieces}
    layout = {"held": held, "numel": {names[id(p)]: p.numel() for p in module.optimizer_parameters()},
              "hooks": len(opt._grad_acc_hooks), "masters": [g.master.numel() for g in groups]}
    batch = BatchStream(ParallelData(cfg.data.dir, "train"), max_sentences=global_micro_batch(ds, spec.num_dp),
                        max_tokens=0, seed=1, bucket_batches=10, min_batch=cfg.data.min_batch_sentences).next()
    base, every = opt.optimizer, list(module.parameters())
    saved = ([p.detach().clone() for p in every], [g.master.detach().clone() for g in groups],
             copy.deepcopy(base.state_dict()))
    lean = opt.step

    def deepspeeds_step(closure=None):
        for i, params in enumerate(opt.params_in_partition):
            opt.all_grad_tensors[i] = opt.get_all_grad_tensors(params, dtype=opt.gradient_accumulation_dtype)
        opt.finalize_gradient_accumulation_boundary()
        return type(opt).step(opt)

    outcome = {}
    for name, step in (("deepspeed", deepspeeds_step), ("lean", lean)):
        runner.sync_head()
        with torch.no_grad():
            for p, v in zip(every, saved[0]):
                p.copy_(v)
            for g, v in zip(groups, saved[1]):
                g.master.copy_(v)
        base.load_state_dict(copy.deepcopy(saved[2]))
        opt.step = step
        runner.step([batch], key=(1, 1))
        runner.sync_head()  # the owner's updated head, broadcast into the replicas
        norm = opt._global_grad_norm if name == "deepspeed" else adapter.last_grad_norm
        outcome[name] = {"norm": float(norm), "weights": [p.detach().float().clone() for p in every],
                         "masters": [g.master.detach().clone() for g in groups],
                         "exp_avg_sq": [base.state[g.master]["exp_avg_sq"].clone() for g in groups]}
    runner.sync_head()
    rt.close()
    a, b = outcome["deepspeed"], outcome["lean"]
    diff = max(max(float((x - y).abs().max()) for x, y in zip(a[k], b[k])) for k in ("weights", "masters", "exp_avg_sq"))
    return {"norm": (a["norm"], b["norm"]), "max_diff": diff, "layout": layout,
            "moved": max(float((x - y).abs().max()) for x, y in zip(a["masters"], saved[1]))}


def shared_memory_collectives(slot_bytes: int) -> dict:
    """A data-parallel runtime's shared-memory sum (slots of `slot_bytes`, so that larger sums go in pieces)
    against gloo's, on tensors of two dtypes and uneven sizes; and what is left in
    /dev/shm once the file is mapped."""
    import glob

    import torch
    import torch.distributed as dist

    from trainer.parallel.layout import LayoutSpec
    from trainer.parallel.runtime import ParallelRuntime
    from trainer.parallel.shm_sum import SHM_DIR

    world = int(os.environ["WORLD_SIZE"])
    spec = LayoutSpec.from_ds_config({"parallel_layout": {"mode": "data", "num_dp": world}}, world)
    rt = ParallelRuntime.start(spec, comm_timeout_s=60)
    members = list(range(world))
    shm = rt.open_shared_memory("data", [p["host"] for p in rt.peers], slot_bytes=slot_bytes)
    left = glob.glob(os.path.join(SHM_DIR, f"hybrid-nmt-{rt.peers[0]['pid']}-*"))
    gen = torch.Generator().manual_seed(rt.rank)
    shapes = [(37,), (5, 300), (1000,), (3,)]
    tensors = [torch.randn(s, generator=gen) for s in shapes] + [torch.randn(700, generator=gen).bfloat16(),
                                                                  torch.randn(4, 9, generator=gen).bfloat16()]
    by_gloo = [t.clone() for t in tensors]
    for t in by_gloo:
        dist.all_reduce(t)
    mine = [t.clone() for t in tensors]
    for _ in range(3):  # the regions in turn: each round must not see the last one's slots
        mine = [t.clone() for t in tensors]
        shm.sum(mine)
    same_sum = all(torch.equal(a, b) for a, b in zip(mine, by_gloo))
    close_sum = all(torch.allclose(a.float(), b.float(), rtol=1e-2 if a.dtype == torch.bfloat16 else 1e-5,
                                   atol=3e-2 if a.dtype == torch.bfloat16 else 1e-5)
                    for a, b in zip(mine, by_gloo))
    other_host = rt.open_shared_memory("data", [f"host{r}" for r in members])
    via_runtime = rt.shared_memory("data") is not None
    rt.close()
    return {"sum_equals_gloo": same_sum, "sum_close_to_gloo": close_sum, "left_in_shm": left,
            "other_host": other_host is None, "runtime_uses_it": via_runtime}

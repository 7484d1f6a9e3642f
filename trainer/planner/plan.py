"""Predict and rank: every candidate layout's schedule simulated (trainer.parallel.simulate) over real
batches of the configured data, each instruction priced by a device profile (trainer.planner.costs).

A step is `gradient_accumulation_steps` micro-steps run back to back on every rank; steps are timed
from a common start (the trainer gathers every rank's metrics between steps). The predicted step time
is the mean over the sampled steps of the last rank's end; the head broadcast that the next step's
head waits for is charged when it would arrive later than that head starts.
"""
from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field

import torch

from data_prep.dataformat import MANIFEST, files
from trainer.data import BatchStream, ParallelData, read_manifest
from trainer.ds_config import bf16_auto, check_batch, global_micro_batch, with_bf16
from trainer.parallel.deepspeed_json import load_ds_config
from trainer.parallel.layout import LayoutSpec, group_members, layout_world
from trainer.parallel.simulate import simulate, simulate_shared
from trainer.planner import profile as profiles
from trainer.planner.candidates import Candidate, enumerate_layouts
from trainer.planner.costs import MicroStepCosts
from trainer.planner.roofline import RooflineDevice
from trainer.planner.shapes import Cut, ModelDims, stages_of
from trainer.training import tuning


@dataclass
class Workload:
    """What is being planned: the model, the batches of the first steps, the precision."""

    cfg: object
    dims: ModelDims
    windows: list  # per sampled step: its global micro-batches
    global_batch: int  # sentences per global micro-batch (at most)
    precision: str
    base_ds: dict
    math: str = ""  # what a GPU's matrix work runs in: the precision, or tf32 (train.tf32); "": the precision

    @property
    def dtype_bytes(self) -> int:
        return 2 if self.precision == "bf16" else 4

    def stacked(self, device_type: str) -> bool:
        """Whether a stage's LSTM layers run as one call per side on this device (train.stack_layers as the trainer
        applies it: trainer.training.tuning.stack_layers; never with dropout between them, nor residual layers)."""
        on, _ = tuning.stack_layers(self.cfg.train.stack_layers, torch.device(device_type), self.precision,
                                    self.cfg.model.residual)
        return on and self.cfg.model.dropout == 0

    def tokens(self, window) -> int:
        return sum(b.src_tokens + b.tgt_tokens for b in window)


DEMO_DATA = "data/demo"  # what launch/prepare_demo.sh makes on any clone (demo.yaml's data.dir)


def require_prepared(data_dir: str, config: str | None = None) -> None:
    """The planner (and its calibration) reads real batches of data.dir: on a fresh clone there are none. Says
    the command that prepares it: the demo corpus's script, or for another corpus where its command is."""
    if os.path.exists(os.path.join(data_dir, MANIFEST)):
        return
    if os.path.normpath(data_dir) == DEMO_DATA:
        fix = "bash launch/prepare_demo.sh (the demo corpus: nothing to download, about 20 s)"
    else:
        fix = (f"python -m data_prep.prepare ... --out {data_dir} (the first lines of "
               f"{config or 'the YAML'} give the command for its corpus; docs/planner.md for "
               f"paper_size.yaml), or plan on the demo corpus any clone can make: bash launch/prepare_demo.sh, then "
               f"data.dir={DEMO_DATA}")
    raise FileNotFoundError(f"data.dir={data_dir}: not prepared (no {MANIFEST}); the planner reads real batches of "
                            f"it: prepare it first: {fix}")


def base_batch(ds: dict) -> int:
    """The base DeepSpeed JSON's global micro-batch (train_micro_batch_size_per_gpu x its layout's replicas)."""
    world = layout_world(ds)
    base = LayoutSpec.from_ds_config(ds, world) if "parallel_layout" in ds else LayoutSpec("single", 1, 1)
    return global_micro_batch(ds, base.num_dp)


def batch_per_rank(ds: dict) -> int:
    """--scale-batch: the base's global micro-batch per rank of its layout (single.json: all of it; hybrid_2.json's
    64 pairs on 2 ranks: 32), which a plan for N devices multiplies by N."""
    world, batch = layout_world(ds), base_batch(ds)
    if batch % world:
        raise ValueError(f"--scale-batch: the base's global micro-batch of {batch} pairs does not divide among its "
                         f"layout's {world} ranks; give a base JSON whose batch does (e.g. ds_configs/single.json)")
    return batch // world


def workload(cfg, ds: dict, steps: int, skip: int = 0, global_batch: int | None = None) -> Workload:
    """The first `skip + steps` steps' batches of the training stream (the trainer's own batching),
    the last `steps` of them kept; global micro-batches of the base's size, or of `global_batch` pairs."""
    global_batch = global_batch or base_batch(ds)
    require_prepared(cfg.data.dir)
    vocab = read_manifest(cfg.data.dir)["vocab"]
    train = ParallelData(cfg.data.dir, "train", cfg.data.length_multiple)  # padded as the trainer pads it
    stream = BatchStream(train, max_sentences=global_batch,
                         max_tokens=cfg.data.max_tokens, seed=cfg.train.seed, bucket_batches=cfg.data.bucket_batches,
                         min_batch=cfg.data.min_batch_sentences)
    accumulation = ds.get("gradient_accumulation_steps", 1)
    windows = [[stream.next() for _ in range(accumulation)] for _ in range(skip + steps)][skip:]
    dims = ModelDims.build(cfg.model, vocab["src_size"], vocab["tgt_size"])
    # fp16 is priced as bf16: the same bytes moved and the same tensor-core rate (its loss scaling costs nothing)
    precision = "bf16" if ds.get("bf16", {}).get("enabled") or ds.get("fp16", {}).get("enabled") else "fp32"
    math = "tf32" if precision == "fp32" and cfg.train.tf32 else precision
    return Workload(cfg, dims, windows, global_batch, precision, ds, math)


def device_for(profile: dict, precision: str, threads: int, link: str | None, dims: ModelDims, math: str | None = None):
    if "layers" in profile:
        return profiles.MeasuredDevice(profile, precision, threads, dims)
    links = profiles._get(profile, "roofline", "links")
    return RooflineDevice(profile, precision, link or profile["roofline"].get("default_link") or sorted(links)[0], dims,
                          math)


@dataclass
class Prediction:
    candidate: Candidate
    step_s: float
    tokens_per_s: float
    fractions: dict = field(default_factory=dict)  # rank -> {busy, waiting, communicating}
    speedup: float = 0.0
    op_seconds: dict = field(default_factory=dict)  # rank -> {op: seconds per step}, like RUN_DIR/timing/rank*.json
    screened_only: bool = False  # simulated on the screening steps only (not among the best)
    steps_s: list = field(default_factory=list)  # each simulated step's seconds, in the workload's order
    global_batch: int = 0  # the workload's pairs per global micro-batch


def predict(candidate: Candidate, work: Workload, profile: dict, link: str | None = None,
            steps: int | None = None, devices: dict | None = None) -> Prediction:
    """`devices`: a memo of the priced devices (per thread count) that the candidates of one ranking share;
    a calibrated machine's device fits its curves when built."""
    spec = candidate.spec
    devices = {} if devices is None else devices
    if candidate.threads not in devices:
        devices[candidate.threads] = device_for(profile, work.precision, candidate.threads, link, work.dims,
                                                work.math or work.precision)
    device = devices[candidate.threads]
    stacked = work.stacked("cpu" if device.kind == "measured" else "cuda")
    stages = stages_of(work.dims, spec)
    groups = group_members(spec)
    shared = device.kind == "measured" and candidate.ranks > 1  # ranks on one host's cores
    windows = work.windows[:steps] if steps else work.windows
    total, tokens, steps_s = 0.0, 0, []
    sums = {r: {"busy": 0.0, "waiting": 0.0, "communicating": 0.0} for r in range(spec.world_size)}
    ops = {r: {} for r in range(spec.world_size)}
    for window in windows:
        clock = {r: 0.0 for r in range(spec.world_size)}
        for i, batch in enumerate(window):
            costs = MicroStepCosts(device, work.dims, spec, stages, Cut(batch, spec), work.dtype_bytes,
                                   boundary=i == len(window) - 1, stacked=stacked)
            start = {r: clock[r] + device.micro_step for r in clock}
            kw = dict(start=start, inner_sync=costs.inner_sync, async_at_end=False, keep_spans=True, post=costs.post)
            if shared:
                result = simulate_shared(costs.programs, groups, costs.cost, costs.transfer,
                                         {r: "host" for r in clock}, costs.slowdown, **kw)
            else:
                result = simulate(costs.programs, groups, costs.cost, costs.transfer, **kw)
            for r, rt in result.items():
                clock[r] = rt.end
                for k in sums[r]:
                    sums[r][k] += getattr(rt, k)
                for op, t0, t1 in rt.spans:
                    ops[r][op] = ops[r].get(op, 0.0) + t1 - t0
            end = max(clock.values())
            late = max((_late_broadcast(rt, end) for rt in result.values()), default=0.0)
            clock = {r: max(t, end + late) if late else t for r, t in clock.items()}
        total += max(clock.values())
        steps_s.append(max(clock.values()))
        tokens += work.tokens(window)
    step = total / len(windows)
    fractions = {r: {k: v / total for k, v in s.items()} for r, s in sums.items()}
    per_step = {r: {op: s / len(windows) for op, s in o.items()} for r, o in ops.items()}
    return Prediction(candidate, step, tokens / total, fractions, op_seconds=per_step, steps_s=steps_s,
                      global_batch=work.global_batch)


def _late_broadcast(rt, end: float) -> float:
    """How long the next step's first head would wait for this step's head broadcast."""
    heads = [t0 for op, t0, _ in rt.spans if op == "head"]
    if not heads or rt.async_done <= end:
        return 0.0
    first_head = min(heads) - min((t0 for _, t0, _ in rt.spans), default=0.0)
    return max(0.0, rt.async_done - end - first_head)


def auto_precision(cfg, ds: dict, profile: dict, devices: int, link: str | None, steps: int,
                   global_batch: int | None = None, baseline_batch: int | None = None) -> tuple[dict, str, tuple | None]:
    """A base JSON with `"bf16": {"enabled": "auto"}` planned in the precision a launch on the profile's device
    would choose (trainer.training.tuning.bf16_choice): (the JSON with true or false, the line that says why, and
    the chosen precision's (work, rank_layouts' result) where both precisions were ranked to choose, else None:
    the caller ranks it once). `global_batch` and `baseline_batch` as the caller's workload and baseline.
    A GPU's profile: bf16 where its datasheet has a bf16 rate (Ampere and later), as torch.cuda.is_bf16_supported
    decides at launch. A calibrated CPU: bf16 unless its best predicted step is more than tuning.BF16_SLOWER times
    fp32's (at launch the CPU's GEMM ratio decides; the profile holds both precisions' measured layers)."""
    if not bf16_auto(ds):
        return ds, "", None
    where = (profile.get("device") or {}).get("name", "?")
    ranked = None
    if "layers" not in profile:
        on = "bf16" in ((profile.get("datasheet") or {}).get("peak_tflops") or {})
        why = f"{where}'s datasheet {'has' if on else 'has no'} bf16 rate"
    else:
        have = [p for p in ("bf16", "fp32") if p in profile["layers"]]
        if len(have) == 1:
            on, why = have[0] == "bf16", f"the profile of {where} measured {have[0]} only"
        else:
            results = {precision: ranked_plan(cfg, with_bf16(ds, precision == "bf16"), profile, devices, link, steps,
                                              global_batch, baseline_batch) for precision in have}
            best = {precision: result[1][0][0].step_s for precision, result in results.items()}
            ratio = best["bf16"] / best["fp32"]
            on = ratio <= tuning.BF16_SLOWER
            ranked = results["bf16" if on else "fp32"]
            why = (f"on {where} the best bf16 layout is predicted at {1000 * best['bf16']:.1f} ms/step, fp32's at "
                   f"{1000 * best['fp32']:.1f} ({ratio:.2f}x; bf16 above {tuning.BF16_SLOWER}x is left)")
    return with_bf16(ds, on), (f"precision: bf16.enabled=auto planned as {'bf16' if on else 'fp32'}: {why} "
                               f"(a launch decides on its own device)"), ranked


def ranked_plan(cfg, ds: dict, profile: dict, devices: int, link: str | None, steps: int,
                global_batch: int | None = None, baseline_batch: int | None = None) -> tuple:
    """(the workload, rank_layouts' result) of a plan: `global_batch` pairs per step (None: the base's), its speed-ups
    over one device at `baseline_batch` pairs (None: at the same workload)."""
    work = workload(cfg, ds, steps, global_batch=global_batch)
    base = workload(cfg, ds, steps, global_batch=baseline_batch) if baseline_batch else None
    return work, rank_layouts(work, profile, devices, link, baseline_work=base)


def rank_layouts(work: Workload, profile: dict, devices: int, link: str | None = None,
                 screen_steps: int = 4, baseline_work: Workload | None = None) -> tuple[list[Prediction], Prediction, int]:
    """(predictions best first, the one-device baseline, how many candidates were invalid). All
    candidates are first simulated on `screen_steps` steps; the best dozen and the best of each mode on
    each number of ranks again on every sampled step (they come first; the rest keep their screening
    numbers). A speed-up is tokens/s over the baseline's: one device on `baseline_work` (a global batch grown
    with the devices is compared with one device at the batch per device), else on `work`."""
    cpu_threads = ()
    if "layers" in profile:
        cpu_threads = tuple(sorted(int(t) for t in profiles._get(profile, "layers", work.precision)))
    method = work.base_ds.get("parallel_layout", {}).get("partition_method", "type:EncoderDecoderLayer")
    cands, invalid = enumerate_layouts(devices, work.cfg.model, work.cfg.data.min_batch_sentences, work.global_batch,
                                       cpu_threads, method)
    if not cands:
        raise ValueError(f"--devices {devices}: no layout fits (model.layers={work.dims.layers}, batch of "
                         f"{work.global_batch}, data.min_batch_sentences={work.cfg.data.min_batch_sentences})")
    baseline = Candidate(LayoutSpec("single", 1, 1, partition_method=method), 1, 1 if cpu_threads else 0)
    devices: dict = {}
    screened = sorted((predict(c, work, profile, link, screen_steps, devices) for c in cands), key=lambda p: p.step_s)
    keep = screened[:12] + [p for p in screened[12:] if p is next(q for q in screened if _mode(q) == _mode(p))]
    final = sorted((predict(p.candidate, work, profile, link, None, devices) for p in keep), key=lambda p: p.step_s)
    kept = {id(p) for p in keep}
    rest = [p for p in screened if id(p) not in kept]
    one = predict(baseline, baseline_work or work, profile, link, None, devices)
    one_screened = predict(baseline, baseline_work or work, profile, link, screen_steps, devices)
    for p in final + [one]:  # on the same batches: one.step_s / p.step_s
        p.speedup = p.tokens_per_s / one.tokens_per_s
    for p in rest:  # screened on fewer steps: against the baseline on those steps
        p.speedup = p.tokens_per_s / one_screened.tokens_per_s
        p.screened_only = True
    return final + rest, one, invalid


def _mode(p: "Prediction") -> tuple[str, int]:
    return ("hybrid" if p.candidate.spec.mode == "grid" else p.candidate.spec.mode), p.candidate.ranks


def best_by_mode(ranked: list[Prediction], devices: int) -> dict[str, Prediction]:
    """The fastest layout of each mode (hybrid counts the grid) on one or all `devices`, among those
    simulated on every sampled step (`rank_layouts`' order)."""
    best: dict[str, Prediction] = {}
    for pred in (q for q in ranked if not q.screened_only and q.candidate.ranks in (1, devices)):
        best.setdefault(_mode(pred)[0], pred)
    return best


def winner_config(base: dict, winner: Candidate, global_batch: int) -> dict:
    """The base DeepSpeed JSON (optimizer, schedule, precision ...) with the winner's layout and the
    micro-batch per replica that keeps the global micro-batch."""
    ds = copy.deepcopy(base)
    # the schedule's length is the trainer's (train.max_steps of the run that uses the file), never the plan's
    (ds.get("scheduler") or {}).get("params", {}).pop("total_num_steps", None)
    ds["train_micro_batch_size_per_gpu"] = global_batch // winner.spec.num_dp
    ds.pop("train_batch_size", None)
    ds["parallel_layout"] = winner.layout_json()
    return ds


def write_config(path: str, ds: dict, ranks: int) -> None:
    """Write it, then read it back as the trainer would (never over an existing file; the file layer refuses a
    link and a missing directory in one line)."""
    if os.path.exists(path):
        raise FileExistsError(f"--write-config {path}: exists; choose another path (the planner never overwrites a file)")
    with files.replace(path, "the DeepSpeed JSON", flag="--write-config", ours=lambda _: False) as f:
        f.write(json.dumps(ds, indent=2) + "\n")
    back = load_ds_config(path, max_steps=None)
    spec = LayoutSpec.from_ds_config(back, ranks)
    check_batch(back, path, spec.num_dp)

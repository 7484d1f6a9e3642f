"""The one module that touches DeepSpeed's internals (private attributes, patched methods, engine
counters, the optimizer's parameter groups). A DeepSpeed upgrade that moves any of them fails here,
at start (`check_version`) or in tests/test_deepspeed_adapter.py (one test per touch point), not
silently somewhere in the training loop.

Touch points, each wrapped by one function or `Engine` method below:
    distributed  deepspeed.init_distributed on a process group we started, without the CPU comm op
                 `deepspeed_shm_comm` (`comm.torch.build_shm_op`, see `init_comm`); the CPU accelerator's
                 `is_fp16_supported` answered yes (fp16 rehearsed on a CPU, see `_let_the_cpu_run_fp16`)
    grid         PipeDataParallelTopology / PipelineParallelGrid and its group members (`pp_group`,
                 `dp_group`)
    stages       PipelineModule + LayerSpec: `_local_start`, `forward_funcs`, `parts`, `stage_id`
    engine       deepspeed.initialize with the grid as mpu, `enable_backward_allreduce`, the fp32
                 clipping hook `clip_fp32_gradients` (a no-op) and `optimizer.step` (`lean_step`), the counters
                 `global_steps`, `global_samples`, `skipped_steps`, `micro_steps`, the LR scheduler's
                 `total_num_steps` (a resume may keep its checkpoint's); its `backward` is not used
                 (plain autograd: the interpreter scales the loss once, `Engine.loss_scale`)
    names        the optimizer and scheduler types DeepSpeed accepts (`optimizer_names`, `scheduler_names`),
                 and those its ZeRO tests (`zero_optimizer_names`), checked when the JSON is read
    optimizer    the bf16 / fp16 wrapper's `fp16_groups` / `fp32_groups` (masters), `optimizer.optimizer`,
                 `_hp_mapping` (flat-partitioned optimizers we refuse), `loss_scale_config`, `_skip_invalid_grad_norm`,
                 `_update_scale`; its `step` replaced by `lean_step` (same arithmetic, a third of the
                 passes, one device sync)
    zero         ZeRO stage 1's optimizer (DeepSpeedZeroOptimizer): its partitions, gradient hooks, loss
                 scaler and `step`, in trainer/parallel/deepspeed_zero.py (`Engine._install_zero_step`)
    torch.optim  the wrappers of Optimizer's methods that import torch._dynamo (`torch._disable_dynamo`'s
                 `__dynamo_disable`, `_use_grad_for_differentiable` around `step`): gone around before DeepSpeed
                 builds the optimizer (`optimizers_without_dynamo`)
    muon         ZeRO's support check imports DeepSpeed's Muon module, whose import compiles its kernels
                 (torch.compile: torch._dynamo, 1.1 s): kept out while deepspeed.initialize runs, unless the JSON
                 asks for Muon (`_muon_left_out`)
"""
from __future__ import annotations

import contextlib
import functools
import io
import logging
import math
import sys
import types
import typing
import warnings
from datetime import timedelta

import torch
import torch.nn as nn

from trainer.model.meta import shapes_only
from trainer.parallel import deepspeed_zero as zero

WRITTEN_FOR = "0.19"  # major.minor of the DeepSpeed these touch points were written and tested against

# ---- quiet unless logging.verbose ----
# What DeepSpeed says on every start that tells a user nothing: the CPU fallback notice of its
# accelerator (this trainer runs on CPUs on purpose), WarmupLR's warning that get_lr() ran before the
# first step (its own constructor calls it), and the prints of PipelineModule and its comm op build.
# (and WarmupDecayLR's warning, once per rank, that the schedule is shorter than its warm-up: the trainer says
# that once, in its own words).
NOISE = ("Setting accelerator to CPU", "Attempting to get learning rate from scheduler before it has started",
         "is less than warmup_num_steps")
_verbose = False


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _verbose or not any(n in record.getMessage() for n in NOISE)


logging.getLogger("DeepSpeed").addFilter(_DropNoise())  # before deepspeed is imported: it reuses this logger
# ZeRO's all-gather of the updated partitions calls a torch function that torch 2.13 deprecates, once per rank
warnings.filterwarnings("ignore", message=r".*all_gather_into_tensor` is deprecated", category=FutureWarning)


def set_verbose(verbose: bool) -> None:
    global _verbose
    _verbose = verbose


@contextlib.contextmanager
def _quiet_prints():
    """DeepSpeed's own prints (topology, layer partition, op builds) go nowhere unless verbose."""
    if _verbose:
        yield
        return
    with contextlib.redirect_stdout(io.StringIO()):
        yield


class DeepSpeedVersionError(RuntimeError):
    """The installed DeepSpeed is not the one this adapter was written for."""


def check_version() -> str:
    import deepspeed

    version = deepspeed.__version__
    if ".".join(version.split(".")[:2]) != WRITTEN_FOR:
        raise DeepSpeedVersionError(
            f"deepspeed {version} is installed, but trainer/parallel/deepspeed_adapter.py was written for "
            f"{WRITTEN_FOR}.x (requirements.txt pins it): its use of DeepSpeed internals must be checked "
            f"against the new version first (tests/test_deepspeed_adapter.py)")
    return version


# ---- distributed ----
def accelerator():
    from deepspeed.accelerator import get_accelerator

    return get_accelerator()


def init_comm(timeout_s: int) -> None:
    """Let DeepSpeed wrap the torch.distributed process group the runtime has started.

    Without its C++ shared-memory op: on a CPU, DeepSpeed's comm backend otherwise compiles
    `deepspeed_shm_comm` with g++ the first time it starts (~70 s before the first step of a fresh
    machine), into ~/.cache/torch_extensions, which every environment of the user shares: a concurrent
    build elsewhere made our starts wait past their timeouts, and the lock file of a build that was
    killed makes every later start wait forever, silently. Once built, the op also maps a 66 MB
    /dev/shm buffer per rank that it never unlinks. Only DeepSpeed's inference all-reduce uses the op;
    training never does (every collective here goes through torch.distributed, gloo or NCCL, and the
    replicas' gradient sums on one CPU host through our own shared memory, trainer.parallel.shm_sum). So
    `build_shm_op` answers None, DeepSpeed's own path for a platform without the op: nothing is
    compiled, loaded, locked or mapped."""
    import importlib

    import deepspeed

    # (`import deepspeed.comm.torch as m` would bind torch itself: deepspeed.comm has an attribute `torch`)
    importlib.import_module("deepspeed.comm.torch").build_shm_op = _no_shm_op
    with _quiet_prints():
        deepspeed.init_distributed(dist_backend=comm_backend(), timeout=timedelta(seconds=timeout_s))


def _no_shm_op():
    return None


def release_comm() -> None:
    """Drop DeepSpeed's module-level hold on a job's groups once the process group is destroyed: its comm backend
    (`deepspeed.comm.comm.cdb`) and the grid an engine registered (`deepspeed.utils.groups.mpu`) keep every group
    of the job, and with each its gloo threads (two polling threads per group), alive for as long as the process
    lives. A process that runs job after job (the test suite's ranks) had 60 such threads after one job, polling
    2.7% of a core while idle, more with each job. The next job's `init_comm` starts DeepSpeed's backend afresh, as
    a new process would."""
    import sys

    comm, groups = sys.modules.get("deepspeed.comm.comm"), sys.modules.get("deepspeed.utils.groups")
    if comm is not None:
        comm.cdb = None
    if groups is not None:
        release = getattr(groups, "_release_process_group_references", None)  # DeepSpeed's own, where it has one
        if release is not None:
            release(group=None)
        groups.mpu = None


def shm_op():
    """The shared-memory op DeepSpeed's comm backend loaded (None: none, as `init_comm` arranges)."""
    from deepspeed.comm import comm as ds_comm

    return getattr(ds_comm.cdb, "shm_comm_op", None)


def comm_backend() -> str:
    """gloo on CPU. On CUDA, NCCL for CUDA tensors and gloo for the few CPU tensors (the per-step
    loss sums, the stop flags): a pure NCCL group refuses CPU tensors. CUDA ranks that share a GPU
    (`gpus_shared`): gloo alone, since NCCL refuses two ranks on one device."""
    if accelerator().device_name() != "cuda":
        return "gloo"
    return "gloo" if gpus_shared() else "cpu:gloo,cuda:nccl"


def gpus_shared() -> bool:
    """More local ranks than this host's GPUs (the launcher's LOCAL_SIZE / LOCAL_WORLD_SIZE): rank r then computes
    on GPU r mod count. For checking a multi-rank CUDA job on one GPU."""
    import os

    local = int(os.environ.get("LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return local > max(1, accelerator().device_count())


# ---- grid ----
def make_grid(num_pp: int, num_dp: int):
    """DeepSpeed's PipelineParallelGrid over the pipe x data topology (rank = stage * num_dp + replica):
    it creates the pipe and data-parallel process groups, and is the `mpu` of deepspeed.initialize."""
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology, PipelineParallelGrid

    with _quiet_prints():
        return PipelineParallelGrid(topology=PipeDataParallelTopology(num_pp=num_pp, num_dp=num_dp))


def grid_members(grid) -> dict[str, list[int]]:
    """This rank's pipe and data groups as global ranks, as the grid built them."""
    return {"pipe": sorted(grid.pp_group), "data": sorted(grid.dp_group)}


def grid_groups(grid) -> dict[str, object]:
    return {"pipe": grid.get_pipe_parallel_group(), "data": grid.get_data_parallel_group()}


# ---- stages ----
class StageError(ValueError):
    """A partition that does not fit the model (message names the JSON key)."""


def build_stages(layer_builders, *, num_pp: int, num_dp: int, partition_method: str, seed: int, seed_fn,
                 must_hold) -> nn.Module:
    """This rank's slice of the global layers: a deepspeed.pipe PipelineModule built from LayerSpecs
    (only the local layers are constructed, layer k after `seed_fn(seed + k)`). Every stage must
    hold a layer of class `must_hold`. (PipelineModule always builds a grid of its own, over the
    same topology; it is never used: the runtime's grid is the one DeepSpeed's engine gets.)"""
    from deepspeed.pipe import LayerSpec, PipelineModule
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology

    specs = [LayerSpec(cls, **kwargs) for cls, kwargs in layer_builders]
    try:
        with _quiet_prints():
            stages = PipelineModule(layers=specs, topology=PipeDataParallelTopology(num_pp=num_pp, num_dp=num_dp),
                                    partition_method=partition_method, seed_layers=True, seed_fn=seed_fn,
                                    base_seed=seed)
    except (NotImplementedError, ValueError, IndexError) as e:
        raise StageError(f"parallel_layout.partition_method={partition_method!r}: {e}") from None
    parts = stages.parts
    for s in range(num_pp):
        kinds = [specs[i].typename for i in range(parts[s], parts[s + 1])]
        if must_hold not in kinds:
            raise StageError(f"parallel_layout.partition_method={partition_method!r} gives stage {s} no "
                             f"{must_hold.__name__} layer (layers {parts[s]}..{parts[s + 1] - 1}); use "
                             f"'type:{must_hold.__name__}'")
    return stages


def layer_parts(layer_builders, num_pp: int, partition_method: str) -> list[int]:
    """The partition `build_stages` would make, without building a module or a process group (for
    the planner): stage s holds global layers parts[s] .. parts[s + 1] - 1. The same calls as
    PipelineModule._partition_layers (uniform, parameters, type:regex)."""
    import re

    from deepspeed.runtime import utils as ds_utils

    method = partition_method.lower()
    try:
        if method == "uniform":
            return [int(x) for x in ds_utils.partition_uniform(num_items=len(layer_builders), num_parts=num_pp)]
        if method == "parameters":
            with shapes_only():
                counts = [sum(p.numel() for p in cls(**kw).parameters() if p.requires_grad)
                          for cls, kw in layer_builders]
            return [int(x) for x in ds_utils.partition_balanced(weights=counts, num_parts=num_pp)]
        if method.startswith("type:"):
            pattern = re.compile(partition_method.split(":", 1)[1], re.IGNORECASE)
            weights = [1 if pattern.search(cls.__name__) else 0 for cls, _ in layer_builders]
            return [int(x) for x in ds_utils.partition_balanced(weights=weights, num_parts=num_pp)]
    except (ValueError, IndexError, re.error) as e:
        raise StageError(f"parallel_layout.partition_method={partition_method!r}: {e}") from None
    raise StageError(f"parallel_layout.partition_method={partition_method!r}: not one of uniform, parameters, "
                     f"type:REGEX")


def stage_id(stages) -> int:
    return stages.stage_id


def local_start(stages) -> int:
    """Global index of the first layer this rank holds."""
    return stages._local_start


def local_layers(stages) -> list[nn.Module]:
    return list(stages.forward_funcs)


# ---- engine ----
def lean_step(opt, closure=None, *, mixed: bool, clip: float, sum_over_stages=None,
              engine: "Engine | None" = None) -> bool:
    """The optimizer step DeepSpeed's engine calls at an accumulation boundary (bound to the optimizer
    instance, replacing its `step`), with the same arithmetic as DeepSpeed's and one device sync.

    DeepSpeed's steps read the gradient norm back to the host several times (its bf16 step also checks
    every gradient for inf/nan with amax/amin and an all-reduce, converts the gradients into newly
    allocated fp32 tensors, multiplies every one by 1 / (loss scale x clip factor) even when that is 1,
    and frees them). Here the global norm is computed on the device (one fused norm per tensor list,
    one all-reduce over the pipeline's stages: DeepSpeed's get_weight_norm / clip_grad_norm_ with the
    grid as mpu), and read back once, in the same copy as `engine.step`'s `along` values (the step's
    loss sums): that read decides the skip (a non-finite norm skips the update, as an overflow does)
    and the clip factor, and gives the logged norm. `mixed` (bf16 or fp16, DeepSpeed's FP16_UnfusedOptimizer): the
    gradients go into fp32 buffers kept from step to step (the masters' `.grad`), and the masters are copied back
    into the low-precision weights. fp16: the gradients carry the dynamic loss scale (the interpreter multiplied
    the loss by `Engine.loss_scale`); an overflow is a non-finite norm, which skips the update and halves the scale,
    as DeepSpeed's fp16 step does; the logged norm is the unscaled one.
    Returns `overflow`, as DeepSpeed's."""
    grads, scale = _master_grads(opt) if mixed else (
        [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None], 1.0)
    norm, read = _read_global_norm(grads, sum_over_stages, engine.along if engine is not None else None)
    if engine is not None:
        engine.read, engine.last_grad_norm = read, norm / scale
    if not math.isfinite(norm):
        if mixed:
            return opt._skip_invalid_grad_norm()
        opt.overflow = True
        return True
    opt.overflow = False
    if mixed:
        opt._global_grad_norm = norm
        opt._update_scale(False)
    combined = zero.unscale_factor(norm, scale, clip)
    if combined != 1.0:
        torch._foreach_mul_(grads, 1.0 / combined)
    if not mixed:
        type(opt).step(opt)  # the torch optimizer's own step (the instance's is this function)
        return False
    opt.optimizer.step()
    with torch.no_grad():
        torch._foreach_copy_([p.data for g in opt.fp16_groups for p in g], [p for g in opt.fp32_groups for p in g])
    return opt.overflow


_OPTIMIZER_METHODS = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


def optimizers_without_dynamo() -> None:
    """torch.optim's optimizers without the two wrappers that import torch._dynamo (1.1 s of every training
    process's start, AMD EPYC) only to serve torch.compile, which never traces an optimizer here:
    - Optimizer's `add_param_group`, `zero_grad`, `state_dict` and `load_state_dict` are wrapped by
      `torch._disable_dynamo`, which keeps what it calls in the function's `__dynamo_disable` attribute: set to
      the function itself, the wrapper calls it directly;
    - every optimizer's `step` is wrapped by `_use_grad_for_differentiable`, which sets grad mode to the
      optimizer's `differentiable` and marks a graph break on each side (`torch._dynamo.graph_break()`, nothing
      outside a compiled region): the class's `step` becomes the same grad mode without the marks.
    Nothing is changed where torch._dynamo is already imported, or where torch no longer wraps a method this way
    (a slower start, the same arithmetic)."""
    if "torch._dynamo" in sys.modules:
        return
    for name in _OPTIMIZER_METHODS:
        own = getattr(getattr(torch.optim.Optimizer, name), "__wrapped__", None)
        if own is not None and getattr(own, "__dynamo_disable", None) is None:
            setattr(own, "__dynamo_disable", own)
    for cls in vars(torch.optim).values():
        step = getattr(cls, "step", None) if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) else None
        if step is not None and not getattr(step, "hooked", False) and step.__code__.co_name == "_use_grad" \
                and "step" in cls.__dict__:
            cls.step = _grad_mode_step(step.__wrapped__)


MUON_MODULE = "deepspeed.runtime.zero.muon.muon_optimizer"


@contextlib.contextmanager
def _muon_left_out(ds_config: dict):
    """ZeRO's `is_zero_supported_optimizer` imports DeepSpeed's Muon module only to add it to the supported list
    (an ImportError is taken as "not installed"), and that import compiles Muon's kernels: torch._dynamo, 1.1 s of
    a ZeRO run's start. While DeepSpeed builds an optimizer that is not Muon, the module is marked unimportable
    (None in sys.modules), and the mark removed after. Nothing is changed where the JSON names Muon, where the
    module or torch._dynamo is already imported."""
    optimizer = str((ds_config.get("optimizer") or {}).get("type", "")).lower()
    if "muon" in optimizer or MUON_MODULE in sys.modules or "torch._dynamo" in sys.modules:
        yield
        return
    sys.modules[MUON_MODULE] = None
    try:
        yield
    finally:
        if MUON_MODULE in sys.modules and sys.modules[MUON_MODULE] is None:
            del sys.modules[MUON_MODULE]


def _grad_mode_step(own):
    """`own` (an optimizer class's step) under the grad mode torch's wrapper sets: on only for `differentiable`."""

    @functools.wraps(own)
    def step(self, *args, **kwargs):
        with torch.set_grad_enabled(bool(self.defaults.get("differentiable", False))):
            return own(self, *args, **kwargs)

    return step


def _master_grads(opt) -> tuple[list, float]:
    """bf16 / fp16: the gradients copied into the fp32 masters' `.grad` buffers (kept from step to step), and the
    loss scale."""
    lows = [p for g in opt.fp16_groups for p in g]
    highs = [p for g in opt.fp32_groups for p in g]
    missing = [hp for hp in highs if hp.grad is None]
    if missing:  # the first step: the buffers, kept from then on
        for hp in missing:
            hp.grad = torch.empty_like(hp)
    pairs = [(hp.grad, lp.grad) for hp, lp in zip(highs, lows) if lp.grad is not None]
    unused = [hp.grad for hp, lp in zip(highs, lows) if lp.grad is None]
    # one fused copy over the whole list (a Python loop of 2 launches per parameter was 1 ms of the H200's
    # host time per step at the paper's size, 38 tensors: ../shared/gpu/2026-12-04)
    if pairs:
        torch._foreach_copy_([h for h, _ in pairs], [g for _, g in pairs])
    if unused:
        torch._foreach_zero_(unused)
    return [hp.grad for hp in highs], opt.loss_scale_config.cur_scale


def _read_global_norm(grads: list, sum_over_stages, along) -> tuple[float, list]:
    """The global gradient norm (this rank's on the device, summed over the pipeline's stages by the
    runtime's all-reduce: DeepSpeed's get_weight_norm / clip_grad_norm_ with the grid as mpu) and the
    values of `along`, read back to the host in one copy: the step's one device sync."""
    if grads:
        norm_sq = torch.stack(torch._foreach_norm(grads)).float().square().sum()
    else:
        norm_sq = torch.zeros((), dtype=torch.float32, device=accelerator().current_device_name())
    if sum_over_stages is not None:
        sum_over_stages(norm_sq)
    parts = [norm_sq.double().sqrt().view(1)] + ([along.double().view(-1)] if along is not None else [])
    values = torch.cat(parts).tolist()
    return values[0], values[1:]


# ---- the names DeepSpeed accepts in the JSON ----
PREFERRED = {"optimizer": ("Adam", "AdamW"), "scheduler": ("WarmupDecayLR", "WarmupCosineLR", "WarmupLR")}


def optimizer_names() -> frozenset:
    """What `optimizer.type` may be: DeepSpeed's own optimizers (matched case-insensitively, as its config
    does) and any torch.optim class (DeepSpeedEngine._is_supported_optimizer). Anything else DeepSpeed only
    refuses with an AssertionError after the model is built."""
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    torch_names = {n for n in dir(torch.optim) if isinstance(getattr(torch.optim, n), type)
                   and issubclass(getattr(torch.optim, n), torch.optim.Optimizer) and n != "Optimizer"}
    return frozenset(DEEPSPEED_OPTIMIZERS) | torch_names


def scheduler_names() -> frozenset:
    """What `scheduler.type` may be: DeepSpeed's schedules (lr_schedules.VALID_LR_SCHEDULES) and any class of
    torch.optim.lr_scheduler (DeepSpeedEngine._scheduler_from_config looks in both)."""
    from deepspeed.runtime.lr_schedules import VALID_LR_SCHEDULES

    sched = torch.optim.lr_scheduler
    torch_names = {n for n in dir(sched) if isinstance(getattr(sched, n), type)
                   and issubclass(getattr(sched, n), sched.LRScheduler) and n != "LRScheduler" and n[0] != "_"}
    return frozenset(VALID_LR_SCHEDULES) | torch_names


def zero_optimizer_names() -> frozenset:
    """The `optimizer.type`s DeepSpeed's ZeRO runs without "zero_allow_untested_optimizer" (its
    ZERO_SUPPORTED_OPTIMIZERS, by the name the JSON gives them, lower case): anything else it refuses with an
    AssertionError after the model is built."""
    from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS

    names = set()
    for cls in ZERO_SUPPORTED_OPTIMIZERS:
        name = cls.__name__
        for prefix in ("Fused", "DeepSpeedCPU", "ZenFlowCPU"):
            name = name[len(prefix):] if name.startswith(prefix) else name
        names.add(name.lower())
    return frozenset(names)


# ---- the keys DeepSpeed reads from the JSON ----
# Read outside DeepSpeedConfig._initialize_params: by deepspeed.initialize (a sequence-parallel mesh) and by
# DeepSpeedConfig's warning check.
READ_ELSEWHERE = ("sequence_parallel_size", "data_parallel_size", "vocabulary_size")


class UnreadKey(typing.NamedTuple):
    """A key of a DeepSpeed JSON that DeepSpeed does not take: `refused` is DeepSpeed's own refusal (a removed
    key, a section's model that forbids it, a value its reader rejects), None where it would ignore the key."""

    key: str  # dotted: "gradient_clipping", "checkpoint.tag_validation", "zero_optimization.stage"
    known: tuple  # the names DeepSpeed looked up beside it (for a suggestion)
    refused: str | None = None


class _Reading(dict):
    """A section of the JSON that records which keys DeepSpeed's reader looks up (`log`: path -> keys; a section
    it iterates or unpacks, `**section` into its pydantic models, is read whole). log[None]: the last top-level
    key looked up, the section a model's refusal is about."""

    def __init__(self, data: dict, path: tuple, log: dict):
        super().__init__(data)
        self._path, self._log = path, log
        log.setdefault(path, set())

    def _note(self, key) -> None:
        self._log[self._path].add(key)
        if not self._path:
            self._log[None] = (key,)

    def _value(self, key):
        value = dict.__getitem__(self, key)
        return _Reading(value, self._path + (key,), self._log) if type(value) is dict else value

    def get(self, key, default=None):
        self._note(key)
        return self._value(key) if dict.__contains__(self, key) else default

    def __getitem__(self, key):
        self._note(key)
        return self._value(key)

    def __contains__(self, key):
        self._note(key)
        return dict.__contains__(self, key)

    def keys(self):
        return _ReadKeys(self)

    def __iter__(self):
        self._log[self._path].update(dict.keys(self))
        return iter(list(dict.keys(self)))

    def items(self):
        return [(k, self._value(k)) for k in self]

    def values(self):
        return [v for _, v in self.items()]

    def __copy__(self):
        return _Reading(dict(dict.items(self)), self._path, self._log)


class _ReadKeys:
    """`section.keys()`: `key in section.keys()` is a look-up of that key; iterating it reads the section whole."""

    def __init__(self, section: _Reading):
        self._section = section

    def __contains__(self, key):
        return key in self._section

    def __iter__(self):
        return iter(self._section)

    def __len__(self):
        return dict.__len__(self._section)


def unread_keys(ds: dict) -> list[UnreadKey]:
    """The keys of a DeepSpeed JSON that DeepSpeed does not read, found by running its own config reader
    (DeepSpeedConfig's removed-key check and `_initialize_params`) on `ds` while recording every key it looks
    up: in a section it looks into key by key (the top level, checkpoint, data_types, the optimizer's type and
    params, ...) any other key is one it would ignore. A section it hands on whole is not judged here: its
    pydantic models (zero_optimization, bf16, fp16, ...) refuse unknown keys themselves, which is turned into an
    UnreadKey now rather than a multi-line error after the model is built, and optimizer.params /
    scheduler.params are the arguments of the optimizer's and the schedule's constructors."""
    from deepspeed.runtime import config as ds_config

    log: dict = {}
    reading = _Reading(ds, (), log)
    reader = ds_config.DeepSpeedConfig.__new__(ds_config.DeepSpeedConfig)
    reader.global_rank, reader.world_size, reader._param_dict = 0, 1, reading
    try:
        ds_config._reject_removed_config_keys(reading)
        reader._initialize_params(reading)
    except Exception as e:  # what deepspeed.initialize would raise, after the model is built
        return [_refusal(e, log.get(None, ()), log)]
    log[()].update(READ_ELSEWHERE)
    for section in ("optimizer", "scheduler"):
        arguments = constructor_arguments(section, ds)
        if arguments is not None and (ds.get(section) or {}).get("params"):
            log[(section, "params")] = set(arguments)
    return _unread(ds, (), log)


# What DeepSpeed takes out of optimizer.params before the rest goes to the optimizer's constructor
# (DeepSpeedEngine._configure_basic_optimizer, get_optimizer_configuration).
ADAM_OWN_PARAMS = ("adam_w_mode", "torch_adam", "fp32_optimizer_states", "foreach")


def constructor_arguments(section: str, ds: dict) -> tuple | None:
    """The names `optimizer.params` or `scheduler.params` may hold: the arguments of the class DeepSpeed builds
    from them (they are passed as keyword arguments, so any other name is a TypeError once the model is built);
    None where that class is not known before it is built (DeepSpeed's fused or CPU optimizers) or takes any
    name. For the optimizer, the torch classes: torch.optim.Adam(W) for Adam/AdamW with torch_adam, or the
    torch.optim class the type names."""
    import inspect

    from deepspeed.runtime import lr_schedules

    spec = ds.get(section) or {}
    name, params = spec.get("type"), spec.get("params") or {}
    if not isinstance(name, str):  # no section, or no type: nothing is built from its params
        return None
    if section == "scheduler":
        cls = getattr(lr_schedules, name, None) or getattr(torch.optim.lr_scheduler, name, None)
        own: tuple = ()
    elif str(name).lower() in ("adam", "adamw") and params.get("torch_adam"):
        cls = torch.optim.AdamW if str(name).lower() == "adamw" or params.get("adam_w_mode", True) else torch.optim.Adam
        own = ADAM_OWN_PARAMS
    else:
        cls, own = getattr(torch.optim, str(name), None), ()
    if not isinstance(cls, type):
        return None
    arguments = list(inspect.signature(cls.__init__).parameters.values())[2:]  # self, the optimizer / parameters
    if any(a.kind is inspect.Parameter.VAR_KEYWORD for a in arguments):
        return None
    return tuple(a.name for a in arguments) + own


def _unread(section: dict, path: tuple, log: dict) -> list[UnreadKey]:
    seen = log.get(path)
    if seen is None or (path and not seen):  # never looked into, or handed on whole
        return []
    out = []
    for key, value in section.items():
        if key not in seen:
            out.append(UnreadKey(".".join(map(str, path + (key,))), tuple(sorted(map(str, seen)))))
        elif type(value) is dict:
            out += _unread(value, path + (key,), log)
    return out


def _refusal(e: Exception, section: tuple, log: dict) -> UnreadKey:
    """DeepSpeed's reader refused the JSON: the key (in `section`, the last one it looked up) and its reason."""
    errors = e.errors() if callable(getattr(e, "errors", None)) else []
    if errors:  # a section's pydantic model: the key inside that section
        loc, forbidden = tuple(errors[0].get("loc", ())), errors[0].get("type") == "extra_forbidden"
        if loc and loc[0] in log.get((), ()):  # a model over several sections (the monitors) names its section
            section = ()
        return UnreadKey(".".join(map(str, section + loc)), (),
                         "not a key of this section" if forbidden else str(errors[0].get("msg", e)))
    return UnreadKey(".".join(map(str, section)) or "(top level)", (),
                     (str(e).strip().splitlines() or [type(e).__name__])[0][:300])


def initialize(module: nn.Module, parameters, ds_config: dict, grid, sum_over_stages=None,
               sum_over_ranks=None) -> "Engine":
    """deepspeed.initialize with the runtime's grid as mpu. The schedule owns every gradient
    reduction, so DeepSpeed's own backward all-reduce is switched off. `sum_over_stages(tensor)`: an
    in-place all-reduce over the pipeline's stages (the runtime's), for the global gradient norm; None
    with one stage. `sum_over_ranks`: the same over every rank (ZeRO: each replica holds a partition), None
    with one rank."""
    import deepspeed

    if ds_config.get("fp16", {}).get("enabled"):
        _let_the_cpu_run_fp16()
    optimizers_without_dynamo()
    with _quiet_prints(), _muon_left_out(ds_config):
        ds_engine, _, _, _ = deepspeed.initialize(model=module, model_parameters=parameters, config=ds_config,
                                                  mpu=grid)
    ds_engine.enable_backward_allreduce = False
    return Engine(ds_engine, sum_over_stages, sum_over_ranks)


def _let_the_cpu_run_fp16() -> None:
    """DeepSpeed's CPU accelerator refuses fp16 unless oneDNN has fast fp16 kernels (AVX512-FP16 / AMX-FP16 CPUs),
    though torch computes every op of this model in fp16 on any CPU (slowly: it is for rehearsing a V100/T4 run's
    fp16 path, loss scaling and overflow skips, not for speed). On the CPU accelerator its answer becomes yes;
    a GPU's answer is left alone."""
    accel = accelerator()
    if accel.device_name() == "cpu" and not accel.is_fp16_supported():
        type(accel).is_fp16_supported = _yes


def _yes(*_args) -> bool:
    return True


class Engine:
    """What the trainer uses of a DeepSpeedEngine: backward, step, the
    learning rate and counters, and the optimizer state by parameter (for layout-independent
    checkpoints)."""

    def __init__(self, ds_engine, sum_over_stages=None, sum_over_ranks=None):
        self.ds = ds_engine
        self.sum_over_stages, self.sum_over_ranks = sum_over_stages, sum_over_ranks
        self.module = ds_engine.module
        self.zero_groups: list[zero.ZeroGroup] = []  # ZeRO stage 1: this rank's partition of each parameter group
        self.last_grad_norm = None
        self.along = None  # a device tensor read back with the gradient norm at the next optimizer step
        self.read = None  # its values, once read
        self._install_step()

    def _install_step(self) -> None:
        """The optimizer's `step` becomes `lean_step` (DeepSpeed's fp32 clipping hook a no-op: the step
        clips), so a step reads the device back once; DeepSpeed's engine still counts a skipped step
        and holds the LR schedule on `overflow`."""
        from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

        ds = self.ds
        mixed = ds.bfloat16_enabled() or ds.fp16_enabled()
        opt = ds.optimizer
        if self.zero_stage:
            if zero.is_zero_optimizer(opt):
                self._install_zero_step()
            return
        if mixed and not isinstance(opt, FP16_UnfusedOptimizer):
            return  # a flat-partitioned optimizer: refused by check_per_parameter_state
        ds.clip_fp32_gradients = lambda: None
        opt.step = types.MethodType(functools.partial(lean_step, mixed=mixed, clip=ds.gradient_clipping(),
                                                      sum_over_stages=self.sum_over_stages, engine=self), opt)

    def _install_zero_step(self) -> None:
        """ZeRO stage 1: its gradient hooks removed (the schedule reduces), its `step` the one-sync
        `lean_zero_step` over this rank's partitions (trainer.parallel.deepspeed_zero)."""
        opt = self.ds.optimizer
        zero.remove_gradient_hooks(opt)
        self.zero_groups = zero.zero_groups(opt)
        opt.step = types.MethodType(functools.partial(
            zero.lean_zero_step, groups=self.zero_groups, clip=self.ds.gradient_clipping(),
            sum_over_ranks=self.sum_over_ranks, read_norm=_read_global_norm, engine=self), opt)

    @property
    def zero_stage(self) -> int:
        """zero_optimization.stage (0, or 1: the optimizer state and fp32 masters sharded over the replicas)."""
        return int(self.ds.zero_optimization_stage())

    # the step
    @property
    def loss_scale(self) -> float:
        """What the loss is multiplied by before its backward: fp16's dynamic loss scale (DeepSpeed's optimizer
        keeps it, halves it on an overflow and doubles it after a quiet window); 1 in bf16 and fp32."""
        cfg = self._scaler()
        return float(cfg.cur_scale) if cfg is not None else 1.0

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of a scalar whose scale the interpreter chose (the loss scale and the window's tokens, applied
        to the head's loss once; the pipeline's hand-on gradients carry it). Plain autograd: DeepSpeed's
        engine.backward would add its own scaling to every call (ZeRO's optimizers scale each one, which would
        scale the hand-on gradients twice; FP16_UnfusedOptimizer scales none in 0.19), and its gradient
        all-reduce is off: the schedule reduces."""
        loss.backward()

    def step(self, *, boundary: bool, along: torch.Tensor | None = None) -> list[float] | None:
        """Call after every micro-batch; `boundary`: the accumulation window's last (the runner's window decides:
        trainer.parallel.interpreter.AccumulationWindow). DeepSpeed applies the update there, by its own
        micro-step counter, which must agree. At the boundary `along` (a small device tensor: the window's loss
        sums) is read back to the host in the same copy as the gradient norm, and its values are returned; None
        between boundaries."""
        if self.ds.is_gradient_accumulation_boundary() != boundary:
            raise RuntimeError(f"the accumulation window and DeepSpeed disagree on the boundary (micro step "
                               f"{self.ds.micro_steps}, gradient_accumulation_steps={self.accumulation_steps})")
        if boundary:
            self.last_grad_norm = None
        self.along, self.read = along, None
        self.ds.step()
        self.along = None
        return self.read


    @property
    def accumulation_steps(self) -> int:
        return self.ds.gradient_accumulation_steps()

    @property
    def bf16(self) -> bool:
        return self.ds.bfloat16_enabled()

    @property
    def fp16(self) -> bool:
        return self.ds.fp16_enabled()

    @property
    def precision(self) -> str:
        return "bf16" if self.bf16 else "fp16" if self.fp16 else "fp32"

    @property
    def skipped_steps(self) -> int:
        return self.ds.skipped_steps

    def lr(self) -> float:
        return self.ds.get_lr()[0]

    def grad_norm(self) -> float | None:
        norm = self.last_grad_norm if self.last_grad_norm is not None else self.ds.get_global_grad_norm()
        return float(norm) if norm is not None else None

    # counters and schedules (checkpoints)
    COUNTERS = ("global_steps", "global_samples", "skipped_steps")

    def counters(self) -> dict:
        return {k: getattr(self.ds, k) for k in self.COUNTERS}

    def load_counters(self, counters: dict, step: int) -> None:
        for key, value in counters.items():
            if key in self.COUNTERS:
                setattr(self.ds, key, value)
        self.ds.micro_steps = step * self.accumulation_steps  # the accumulation boundary follows the new gas

    def lr_scheduler_state(self) -> dict:
        return self.ds.lr_scheduler.state_dict() if self.ds.lr_scheduler is not None else {}

    def load_lr_scheduler_state(self, state: dict) -> None:
        if self.ds.lr_scheduler is not None and state:
            self.ds.lr_scheduler.load_state_dict(state)

    def lr_schedule_length(self) -> int | None:
        """The steps the LR scheduler spans (WarmupDecayLR / WarmupCosineLR `total_num_steps`, which their
        state_dict leaves out); None for a scheduler without a length, or none."""
        return getattr(self.ds.lr_scheduler, "total_num_steps", None)

    def set_lr_schedule_length(self, total: int) -> float:
        """Span the LR scheduler over `total` steps from its current step on (a resume's train.resume_schedule);
        returns the learning rate it gives at that step."""
        self.ds.lr_scheduler.total_num_steps = total
        return float(self.ds.lr_scheduler.get_lr()[0])

    # the optimizer by parameter
    def check_per_parameter_state(self) -> None:
        if any(getattr(p, "_hp_mapping", None) is not None for p in self.ds.module.parameters()):
            raise NotImplementedError("checkpointing DeepSpeed's BF16_Optimizer (flat partitions) per layer is not "
                                      "implemented; use zero_optimization.stage 0 or 1 without "
                                      "data_types.grad_accum_dtype")

    def masters(self) -> dict:
        """id(model parameter) -> its fp32 master, for DeepSpeed's per-parameter mixed-precision
        optimizer (bf16 without ZeRO: FP16_UnfusedOptimizer keeps `fp32_groups` beside the model's
        `fp16_groups`); {} when the model parameters are the masters (fp32)."""
        opt = self.ds.optimizer
        if not (hasattr(opt, "fp16_groups") and hasattr(opt, "fp32_groups")):
            return {}
        return {id(lp): hp for lp_group, hp_group in zip(opt.fp16_groups, opt.fp32_groups)
                for lp, hp in zip(lp_group, hp_group)}

    def base_optimizer(self):
        """The torch optimizer whose `state` is keyed by the master parameters (ZeRO: by the master partitions)."""
        opt = self.ds.optimizer
        return opt.optimizer if hasattr(opt, "fp32_groups") or zero.is_zero_optimizer(opt) else opt

    def optimizer_state_bytes(self) -> int:
        """Bytes of optimizer memory on this rank: the fp32 masters kept beside low-precision weights (ZeRO: this
        rank's partition, kept in every precision) and the torch optimizer's state (Adam's two moments: of the
        partition with ZeRO). Gradients and the weights themselves are not counted."""
        opt, base = self.ds.optimizer, self.base_optimizer()
        tensors = [t for st in base.state.values() for t in st.values() if torch.is_tensor(t)]
        if self.zero_groups:
            tensors += [g.master for g in self.zero_groups]
        elif hasattr(opt, "fp32_groups"):
            tensors += [p for group in opt.fp32_groups for p in group]
        return sum(t.numel() * t.element_size() for t in tensors)

    SCALER_KEYS = ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis")

    def _scaler(self):
        """The loss scaler's state object: FP16_UnfusedOptimizer's `loss_scale_config`, ZeRO's `loss_scaler`."""
        opt = self.ds.optimizer
        return getattr(opt, "loss_scale_config", None) or getattr(opt, "loss_scaler", None)

    def loss_scaler_state(self) -> dict:
        cfg = self._scaler()
        if cfg is None:
            return {}
        return {k: getattr(cfg, k) for k in self.SCALER_KEYS
                if isinstance(getattr(cfg, k, None), (int, float)) and not isinstance(getattr(cfg, k), bool)}

    def load_loss_scaler_state(self, state: dict) -> None:
        cfg = self._scaler()
        for k, v in state.items():
            if cfg is not None and hasattr(cfg, k):
                setattr(cfg, k, v)

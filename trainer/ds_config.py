"""The DeepSpeed JSON's own checks: types, ranges and what the trainer supports, before anything is built.

DeepSpeed checks most values only deep inside `deepspeed.initialize` (a string learning rate fails
after the optimizer is built), with a traceback. Every key we rely on is checked here first, and an
error names the file and the key. This module knows nothing of parallel: a run reads the JSON through
trainer.parallel.deepspeed_json.load_ds_config, which adds what DeepSpeed's own lists say (the optimizers,
schedulers and keys it knows); the layout's world size is trainer.parallel.layout.layout_world.
"""
from __future__ import annotations

import json
import math
import numbers
import os

from data_prep.dataformat import userfiles

MAX_BYTES = 1 << 20  # a DeepSpeed JSON is a few hundred bytes; refuse to parse anything huge


class DSConfigError(ValueError):
    """A bad DeepSpeed JSON; the message names the file and the key."""


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    """A finite number (JSON as Python reads it also has Infinity and NaN)."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


def _check(path: str, key: str, value, ok: bool, what: str) -> None:
    if not ok:
        raise DSConfigError(f"{path}: {key}={json.dumps(value)}: must be {what}")


def _section(path: str, ds: dict, key: str) -> dict:
    value = ds.get(key, {})
    _check(path, key, value, isinstance(value, dict), "an object")
    return value


def validate(ds, path: str) -> None:
    """Types and ranges of the keys the trainer and DeepSpeed rely on."""
    if not isinstance(ds, dict):
        raise DSConfigError(f"{path}: the top level must be a JSON object, got {type(ds).__name__}")
    if "train_micro_batch_size_per_gpu" not in ds:
        raise DSConfigError(f"{path}: train_micro_batch_size_per_gpu is required (sentences per replica per "
                            f"micro-batch)")
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
                "steps_per_print"):
        if key in ds:
            _check(path, key, ds[key], _is_int(ds[key]) and ds[key] >= 1, "an integer >= 1")
    if "gradient_clipping" in ds:
        v = ds["gradient_clipping"]
        _check(path, "gradient_clipping", v, _is_number(v) and v >= 0, "a finite number >= 0")
    for key in ("bf16", "fp16"):
        sec = _section(path, ds, key)
        if "enabled" in sec:
            if key == "bf16":  # "auto": chosen at launch by what the device does (bf16_auto)
                _check(path, "bf16.enabled", sec["enabled"], isinstance(sec["enabled"], bool) or sec["enabled"] == AUTO,
                       'true, false or "auto" (bf16 where the device runs it faster than fp32)')
            else:
                _check(path, f"{key}.enabled", sec["enabled"], isinstance(sec["enabled"], bool), "true or false")
    _check_fp16(ds, path)
    zero = _section(path, ds, "zero_optimization")
    if "stage" in zero:
        _check(path, "zero_optimization.stage", zero["stage"], _is_int(zero["stage"]) and 0 <= zero["stage"] <= 3,
               "an integer in 0..3")
    for name in ("optimizer", "scheduler"):
        sec = _section(path, ds, name)
        if not sec:
            continue
        _check(path, f"{name}.type", sec.get("type"), isinstance(sec.get("type"), str), "a string")
        params = sec.get("params", {})
        _check(path, f"{name}.params", params, isinstance(params, dict), "an object")
        for k, v in params.items():
            key = f"{name}.params.{k}"
            if k == "betas":
                _check(path, key, v, isinstance(v, list) and len(v) == 2 and all(_is_number(b) and 0 <= b < 1 for b in v),
                       "a list of two numbers in [0, 1)")
            elif k in ("fused", "foreach", "amsgrad", "torch_adam", "adam_w_mode", "nesterov"):
                _check(path, key, v, isinstance(v, bool), "true or false")
            elif k.endswith("_type") or k == "warmup_type":
                _check(path, key, v, isinstance(v, str), "a string")
            elif k in ("total_num_steps", "warmup_num_steps"):
                _check(path, key, v, _is_int(v) and v >= 0, "an integer >= 0")
            else:
                _check(path, key, v, _is_number(v) and v >= 0, "a finite number >= 0")
    _check_zero(ds, path)
    _check_grad_accum_dtype(ds, path)


AUTO = "auto"


def bf16_auto(ds: dict) -> bool:
    """`"bf16": {"enabled": "auto"}`: the precision is chosen at launch, by what the device runs faster
    (trainer.training.tuning.bf16_choice; every rank takes rank 0's choice: trainer.training.build)."""
    return (ds.get("bf16") or {}).get("enabled") == AUTO


def with_bf16(ds: dict, on: bool) -> dict:
    """A copy of `ds` with bf16.enabled set to `on` (the other keys of its bf16 section kept)."""
    return {**ds, "bf16": {**(ds.get("bf16") or {}), "enabled": on}}


FP16_KEYS = {"loss_scale": ("a finite number >= 0 (0: dynamic loss scaling)", lambda v: _is_number(v) and v >= 0),
             "initial_scale_power": ("an integer in 0..64", lambda v: _is_int(v) and 0 <= v <= 64),
             "loss_scale_window": ("an integer >= 1", lambda v: _is_int(v) and v >= 1),
             "hysteresis": ("an integer >= 1", lambda v: _is_int(v) and v >= 1),
             "min_loss_scale": ("a finite number > 0", lambda v: _is_number(v) and v > 0),
             "consecutive_hysteresis": ("true or false", lambda v: isinstance(v, bool))}


def _check_fp16(ds: dict, path: str) -> None:
    """fp16 (DeepSpeed's dynamic loss scaling by default) for GPUs without bf16; one precision at a time."""
    fp16, bf16 = ds.get("fp16", {}), ds.get("bf16", {})
    if not fp16.get("enabled"):
        return
    if bf16.get("enabled"):
        raise DSConfigError(f"{path}: fp16.enabled and bf16.enabled are both {'set' if bf16_auto(ds) else 'true'}: "
                            f"choose one (bf16 where the GPU has it, fp16 on V100/T4-class GPUs)")
    for key, (what, ok) in FP16_KEYS.items():
        if key in fp16:
            _check(path, f"fp16.{key}", fp16[key], ok(fp16[key]), what)
    if fp16.get("auto_cast"):
        raise DSConfigError(f"{path}: fp16.auto_cast=true: the trainer calls its layers itself, so DeepSpeed would "
                            f"cast nothing; the weights are already fp16 with fp16.enabled: drop auto_cast")


ZERO_REFUSED = {
    2: "ZeRO-2 partitions the gradients by reducing each one inside the backward pass (DeepSpeed's hooks), once per "
       "micro-batch; here the schedule runs several backward passes per micro-batch (pipeline units, time chunks, "
       "the head) and sums the replicas' gradients after them, so there is nothing to partition early (and "
       "DeepSpeed itself refuses ZeRO-2 with pipeline parallelism)",
    3: "ZeRO-3 partitions the weights and gathers them inside each layer's forward and backward, which the "
       "schedule's stages (each holding its layers whole) do not do",
}


def _check_zero(ds: dict, path: str) -> None:
    """ZeRO stage 1 (the optimizer state and fp32 masters sharded over the data-parallel replicas) in every
    layout; stages 2 and 3 and offloading refused, each saying what to use instead."""
    zero = ds.get("zero_optimization", {})
    stage = zero.get("stage", 0)
    if stage in ZERO_REFUSED:
        raise DSConfigError(f"{path}: zero_optimization.stage={stage} is not supported: {ZERO_REFUSED[stage]}; use "
                            f"stage 1 (the optimizer state and fp32 masters sharded over the replicas)")
    if stage != 1:
        return
    for key in ("offload_optimizer", "offload_param", "cpu_offload"):
        value = zero.get(key)
        if value not in (None, False) and not (isinstance(value, dict) and value.get("device", "none") == "none"):
            raise DSConfigError(f"{path}: zero_optimization.{key}={json.dumps(value)}: offloading is not supported "
                                f"(the trainer steps the partition where it lives); drop it")


DTYPE_NAMES = {name: canon for canon, names in {"fp16": ("torch.float16", "fp16", "float16", "half"),
                                                 "fp32": ("torch.float32", "fp32", "float32", "float"),
                                                 "bf16": ("torch.bfloat16", "bf16", "bfloat16")}.items()
               for name in names}  # DeepSpeed's DtypeEnum spellings


def _check_grad_accum_dtype(ds: dict, path: str) -> None:
    """Gradients accumulate in the weights' precision (fp32 masters beside bf16/fp16 weights); DeepSpeed would
    switch to another optimizer (BF16_Optimizer) or refuse (without ZeRO) for any other."""
    value = (ds.get("data_types") or {}).get("grad_accum_dtype")
    if value is not None and bf16_auto(ds):
        raise DSConfigError(f"{path}: data_types.grad_accum_dtype={json.dumps(value)} with bf16.enabled \"auto\": "
                            f"gradients accumulate in the weights' precision, chosen at launch; drop it")
    precision = "bf16" if ds.get("bf16", {}).get("enabled") else "fp16" if ds.get("fp16", {}).get("enabled") else "fp32"
    if value is not None and DTYPE_NAMES.get(value) != precision:
        raise DSConfigError(f"{path}: data_types.grad_accum_dtype={json.dumps(value)}: gradients accumulate in the "
                            f"weights' precision ({precision}; the fp32 masters are kept beside them); drop it")


def global_micro_batch(ds: dict, num_dp: int) -> int:
    """Sentences of a global micro-batch (at most): train_micro_batch_size_per_gpu per replica x replicas. Every
    rank builds the same global micro-batches and cuts out its rows (trainer.parallel.cut)."""
    return ds["train_micro_batch_size_per_gpu"] * num_dp


def check_batch(ds: dict, path: str, num_dp: int) -> None:
    """DeepSpeed refuses (with a traceback) a train_batch_size that is not micro x accumulation x replicas; here it
    is one line with the three numbers. (It is derived: a JSON need not state it.)"""
    if "train_batch_size" in ds:
        micro, gas = ds["train_micro_batch_size_per_gpu"], ds.get("gradient_accumulation_steps", 1)
        want = global_micro_batch(ds, num_dp) * gas
        if ds["train_batch_size"] != want:
            raise DSConfigError(f"{path}: train_batch_size={ds['train_batch_size']} != train_micro_batch_size_per_gpu="
                                f"{micro} x gradient_accumulation_steps={gas} x replicas (parallel_layout.num_dp)="
                                f"{num_dp} = {want}: drop train_batch_size (it is derived) or make it {want}")


def read_json_file(path: str, *, flag: str, kind: str, max_bytes: int, error: type[Exception]):
    """A JSON file the user names with `flag` (a config, a profile), read strictly (data_prep.userfiles): a
    missing file, a special file, one over `max_bytes`, non-UTF-8 text, invalid JSON, a key stated twice or
    nesting past userfiles.MAX_DEPTH is one line naming the file (and line and key)."""
    if not os.path.lexists(path):
        raise FileNotFoundError(f"{flag} {path}: no such file")
    try:
        return userfiles.read_json(path, max_bytes, what=kind)
    except FileNotFoundError:
        raise FileNotFoundError(f"{flag} {path}: no such file (a link to nothing)") from None
    except (userfiles.UserFileError, OSError) as e:  # OSError: the file layer's one line (files.FileError)
        raise error(str(e)) from None


SCHEDULES_WITH_LENGTH = ("WarmupDecayLR", "WarmupCosineLR")  # DeepSpeed schedules with a total_num_steps


def complete_schedule(ds: dict, path: str, max_steps: int | None, where: str = "train.max_steps") -> dict:
    """The length of a WarmupDecayLR / WarmupCosineLR schedule comes from the YAML (`max_steps`:
    train.schedule_steps or train.max_steps, named by `where`), never from two places: a `total_num_steps`
    stated in the JSON is refused unless it is the same number. `max_steps=None` leaves the JSON as it is."""
    sched = ds.get("scheduler")
    if max_steps is not None and sched and sched.get("type") in SCHEDULES_WITH_LENGTH:
        params = sched.setdefault("params", {})
        stated = params.get("total_num_steps")
        if stated is not None and stated != max_steps:
            raise DSConfigError(
                f"{path}: scheduler.params.total_num_steps={stated} but {where}={max_steps}: the schedule's length "
                f"comes from the YAML; drop total_num_steps from the JSON (or set train.schedule_steps={stated} to "
                f"decay over {stated} steps)")
        params["total_num_steps"] = max_steps
    return ds

"""DeepSpeed's ZeRO stage 1 optimizer as the trainer uses it: the second half of the DeepSpeed adapter
(trainer/parallel/deepspeed_adapter.py builds the engine and calls in here; tests/test_deepspeed_adapter.py tests
each touch point).

ZeRO stage 1 (DeepSpeedZeroOptimizer) flattens each parameter group into one buffer (the model's weights become
views of it), cuts the buffer into one equal partition per data-parallel replica, and gives each replica an fp32
master of its partition only: the torch optimizer's parameter, so its state (Adam's two moments) is sharded too.
After a step each replica writes its partition into the buffer and the replicas all-gather it.

Its gradient reduction is not used: the schedule has already summed the replicas' gradients in place
(trainer.parallel.replica_grads), so every replica holds the whole gradient, as ZeRO-1 keeps it. DeepSpeed's
per-parameter gradient hooks (which would stage every gradient into a reduce bucket of `reduce_bucket_size`
elements) are removed, and its `step` is replaced by `lean_zero_step`: each replica copies its partition's slice of
the gradient into its master's fp32 `.grad`, the norm is the partitions' norms summed over every rank (DeepSpeed's
get_grad_norm_direct over the data- and model-parallel groups), read once; then DeepSpeed's own arithmetic.

Touch points: `bit16_groups`, `bit16_groups_flat`, `partition_size`, `single_partition_of_fp32_groups`,
`dp_process_group`, `_grad_acc_hooks`, `loss_scale` and `_update_scale` (its loss scaler), `optimizer` (the torch
optimizer over the master partitions), `update_lp_params` (partition -> weights, all-gather), `overflow`.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch


class ZeroGroup(NamedTuple):
    """One parameter group as ZeRO flattened it, seen from this rank."""

    master: torch.Tensor  # this rank's fp32 partition of the group's flat buffer (the torch optimizer's parameter)
    start: int  # where the partition starts in the flat buffer
    params: list  # (parameter, its offset in the flat buffer) for every parameter of the group
    pieces: list  # (parameter, first element, offset in the partition, elements) of those this partition holds


def is_zero_optimizer(opt) -> bool:
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    return isinstance(opt, DeepSpeedZeroOptimizer)


def _offset_in(flat: torch.Tensor, p: torch.Tensor) -> int:
    """Where parameter `p` (a view ZeRO made of its flat buffer) starts in `flat`, in elements."""
    if p.data.untyped_storage().data_ptr() != flat.untyped_storage().data_ptr():
        raise RuntimeError("ZeRO's parameters are no longer views of its flat buffer (bit16_groups_flat): "
                           "trainer/parallel/deepspeed_zero.py must be checked against this DeepSpeed")
    return p.data.storage_offset() - flat.storage_offset()


def zero_groups(opt) -> list[ZeroGroup]:
    """The partition layout of a DeepSpeedZeroOptimizer on this rank: which slice of which parameter each element
    of this rank's fp32 master partition is."""
    from deepspeed import comm as ds_comm

    rank = ds_comm.get_rank(group=opt.dp_process_group)
    groups = []
    for i, params in enumerate(opt.bit16_groups):
        flat, size, master = opt.bit16_groups_flat[i], int(opt.partition_size[i]), opt.single_partition_of_fp32_groups[i]
        if master.numel() != size:
            raise RuntimeError(f"ZeRO's fp32 partition of group {i} has {master.numel()} elements, its partition_size "
                               f"is {size}: trainer/parallel/deepspeed_zero.py must be checked against this DeepSpeed")
        start = rank * size
        offsets = [(p, _offset_in(flat, p)) for p in params]
        pieces = []
        for p, off in offsets:
            a, b = max(off, start), min(off + p.numel(), start + size)
            if a < b:
                pieces.append((p, a - off, a - start, b - a))
        groups.append(ZeroGroup(master, start, offsets, pieces))
    return groups


def remove_gradient_hooks(opt) -> None:
    """The schedule reduces the gradients: ZeRO's hooks (bucketing each gradient as autograd accumulates it) go."""
    for handle in opt._grad_acc_hooks:
        handle.remove()
    opt._grad_acc_hooks = []


def _partition_grads(groups: list[ZeroGroup]) -> list[torch.Tensor]:
    """Each master partition's fp32 `.grad` (kept from step to step; its padding stays zero), filled with this
    partition's slice of the (summed) gradients."""
    grads = []
    for g in groups:
        if g.master.grad is None:
            g.master.grad = torch.zeros_like(g.master)
        dst = g.master.grad
        for p, first, at, count in g.pieces:
            if p.grad is None:
                dst.narrow(0, at, count).zero_()
            else:
                dst.narrow(0, at, count).copy_(p.grad.reshape(-1).narrow(0, first, count))
        grads.append(dst)
    return grads


def unscale_factor(norm: float, scale: float, clip: float) -> float:
    """What DeepSpeed's steps divide the gradients by: the loss scale, times the clip factor when the unscaled
    norm exceeds `clip` (DeepSpeed's ((norm / scale) + 1e-6) / clip)."""
    factor = ((norm / scale) + 1e-6) / clip if clip > 0.0 else 1.0
    return factor * scale if factor > 1 else scale


def lean_zero_step(opt, closure=None, *, groups: list[ZeroGroup], clip: float, sum_over_ranks, read_norm,
                   engine) -> bool:
    """ZeRO stage 1's step, bound to the optimizer instance in place of its `step`: the arithmetic of
    DeepSpeedZeroOptimizer.step (skip on a non-finite norm and update the loss scale; unscale and clip by
    ((norm / scale) + 1e-6) / clip; the torch optimizer on the partition; the partition into the weights and
    all-gathered) with the norm's one read (`read_norm`: the adapter's, which also reads `engine.along`).
    `sum_over_ranks`: an in-place SUM over every rank (the partitions of every replica and stage), or None."""
    grads = _partition_grads(groups)
    scale = float(opt.loss_scale)
    norm, read = read_norm(grads, sum_over_ranks, engine.along)
    engine.read, engine.last_grad_norm = read, norm / scale
    if not math.isfinite(norm):
        opt.overflow = True
        opt._update_scale(True)
        opt._global_grad_norm = float("inf")
        return True
    opt.overflow = False
    opt._update_scale(False)
    opt._global_grad_norm = norm / scale
    combined = unscale_factor(norm, scale, clip)
    if combined != 1.0:
        torch._foreach_mul_(grads, 1.0 / combined)
    opt.optimizer.step()
    opt.update_lp_params()
    return False

"""Process start-up: torch.distributed via DeepSpeed, threads, device, rank-0-only printing."""
from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(timeout_s: int = 300) -> tuple[int, int]:
    """Start torch.distributed (gloo on CPU, nccl on CUDA); works under the deepspeed launcher and as
    a plain `python` process (then a world of one). Returns (rank, world_size)."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    if "RANK" not in os.environ:  # plain `python launch/train.py`: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    os.environ.setdefault("LOCAL_RANK", "0")
    accel = get_accelerator()
    backend = "nccl" if accel.device_name() == "cuda" else "gloo"
    if accel.device_name() == "cuda":
        accel.set_device(int(os.environ["LOCAL_RANK"]))
    deepspeed.init_distributed(dist_backend=backend, timeout=timedelta(seconds=timeout_s))
    import torch.distributed as dist

    return dist.get_rank(), dist.get_world_size()


def set_threads(threads: int) -> int:
    """torch threads per rank: `threads`, or the host's cores divided among its local ranks."""
    if threads <= 0:
        local = int(os.environ.get("LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", "1")))
        threads = max(1, (os.cpu_count() or 1) // max(1, local))
    torch.set_num_threads(threads)
    return threads


def device():
    from deepspeed.accelerator import get_accelerator

    return torch.device(get_accelerator().current_device_name())


def is_rank0() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def print0(*args, **kwargs) -> None:
    if is_rank0():
        print(*args, **kwargs, flush=True)

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


class CommError(RuntimeError):
    """A collective or point-to-point transfer failed: a peer died, or stopped answering for longer
    than train.comm_timeout_s."""


def init_distributed(timeout_s: int = 300) -> tuple[int, int]:
    """Start torch.distributed (gloo on CPU, nccl on CUDA); works under the deepspeed launcher and as
    a plain `python` process (then a world of one). Returns (rank, world_size).

    `timeout_s` bounds every wait on a peer, in every process group: torch gives groups made later
    by `new_group` (DeepSpeed's pipe and data-parallel groups) its own 30-minute default instead of
    the world's timeout, so the module default is set before any group exists."""
    import deepspeed
    import torch.distributed.distributed_c10d as c10d
    from deepspeed.accelerator import get_accelerator

    c10d.default_pg_timeout = timedelta(seconds=timeout_s)
    if hasattr(c10d, "default_pg_nccl_timeout"):
        c10d.default_pg_nccl_timeout = timedelta(seconds=timeout_s)

    if "RANK" not in os.environ:  # plain `python launch/train.py`: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    os.environ.setdefault("LOCAL_RANK", "0")
    accel = get_accelerator()
    # on CUDA, NCCL for CUDA tensors and gloo for CPU ones: a pure NCCL group refuses the CPU tensors
    # of the metrics all-reduce and the stop-flag all-reduce ("No backend type associated with device
    # type cpu"), even in a world of one; object collectives then travel over gloo as well
    backend = "cpu:gloo,cuda:nccl" if accel.device_name() == "cuda" else "gloo"
    if accel.device_name() == "cuda":
        accel.set_device(int(os.environ["LOCAL_RANK"]))
    deepspeed.init_distributed(dist_backend=backend, timeout=timedelta(seconds=timeout_s))
    import torch.distributed as dist

    _unlink_shm_buffers(dist)
    return dist.get_rank(), dist.get_world_size()


def _unlink_shm_buffers(dist) -> None:
    """DeepSpeed's CPU communication op creates a 66 MB /dev/shm buffer per rank
    (deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank>) and never unlinks it, so every run --
    even a clean one -- leaves world_size x 66 MB of RAM behind, until /dev/shm fills the machine.
    Once every rank has mapped every buffer (the barrier), the names can go: the mappings stay
    valid, and the memory is freed when the last rank exits, however it exits. Only DeepSpeed's
    inference all-reduce uses these buffers; training never does."""
    import glob

    dist.barrier()
    port, rank = os.environ.get("MASTER_PORT", "*"), dist.get_rank()
    for path in glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_{rank}"):
        try:
            os.unlink(path)
        except OSError:
            pass


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


def is_comm_failure(err: BaseException) -> bool:
    """Whether `err` is a transport failure (peer gone, timeout) rather than a bug in our code."""
    import torch.distributed as dist

    if isinstance(err, (CommError, getattr(dist, "DistError", CommError))):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and any(s in text for s in (
        "gloo", "Connection closed by peer", "Connection reset by peer", "Timed out", "NCCL", "Broken pipe"))


def peer_table() -> list[dict]:
    """(host, pid) of every rank, gathered once at start-up for failure messages."""
    import torch.distributed as dist

    me = {"host": socket.gethostname(), "pid": os.getpid()}
    table = [None] * dist.get_world_size()
    dist.all_gather_object(table, me)
    return table


def peer_status(table: list[dict]) -> str:
    """Which ranks on this host are gone or stopped (others cannot be checked from here)."""
    import psutil

    host, notes = socket.gethostname(), []
    for rank, peer in enumerate(table):
        if peer["host"] != host:
            continue
        try:
            status = psutil.Process(peer["pid"]).status()
        except psutil.NoSuchProcess:
            notes.append(f"rank {rank} (pid {peer['pid']}) has exited")
            continue
        if status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            notes.append(f"rank {rank} (pid {peer['pid']}) has exited")
        elif status in (psutil.STATUS_STOPPED, getattr(psutil, "STATUS_TRACING_STOP", "tracing-stop")):
            notes.append(f"rank {rank} (pid {peer['pid']}) is stopped (SIGSTOP?)")
    return "; ".join(notes) or "every rank on this host is still running"

"""Gradient sums among the ranks of one host through shared memory, for CPU jobs.

gloo moves a collective's bytes through loopback TCP: copied into the kernel and out again, in gloo's own
threads, which on a CPU job share the rank's core with its compute. Here the ranks of a group that all run
on this host map one shared file (in /dev/shm), and a collective is plain tensor copies and additions on
the caller's thread:

    every rank copies its tensors into its own slot; each rank adds up its 1/N of the slots into slot 0;
    every rank copies slot 0 back into its tensors

The steps are ordered by gloo barriers on the group, so a peer that dies or hangs is noticed as in any other
collective (the group's timeout, the runtime's error message). Two regions are used in turn, so a rank may
start writing the next collective while a slower one still copies out the last. A sum larger than a slot goes in
pieces.

Every element is added in rank order (rank 0's + rank 1's + ...) in the tensors' own dtype: for two ranks
the same bits as gloo's SUM (an addition of two numbers does not depend on their order), for more equal to
rounding (gloo's ring adds each part of a tensor in another order), and the same on every rank.

The file is created by the group's first rank under a name holding its pid, opened by the others, and
unlinked as soon as every rank has it mapped: nothing is left in /dev/shm when a job ends, however it ends.
The runtime (`ParallelRuntime.shared_memory`, which owns every message between ranks) runs that protocol and
keeps gloo where shared memory cannot serve: ranks on more than one host, or too little free space in
/dev/shm.
"""
from __future__ import annotations

import os
import shutil

import torch

SHM_DIR = "/dev/shm"
SLOT_BYTES = 16 << 20  # per rank and region: a 40 M-parameter model's fp32 gradients go in 10 pieces
REGIONS = 2


def region_bytes(ranks: int, slot_bytes: int = SLOT_BYTES) -> int:
    """The shared file's size for a group of `ranks`."""
    return REGIONS * ranks * slot_bytes


def create(tag: str, size: int) -> str | None:
    """The group's first rank: a new shared file of `size` bytes (named by this process and `tag`), or None
    where /dev/shm cannot hold it with room to spare."""
    path = os.path.join(SHM_DIR, f"hybrid-nmt-{os.getpid()}-{tag}")
    try:
        if shutil.disk_usage(SHM_DIR).free < 2 * size:
            return None
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
    except OSError:
        return None
    return path


def attach(path: str, size: int) -> torch.Tensor | None:
    """The shared file mapped (bytes), or None if it cannot be."""
    try:
        return torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
    except (OSError, RuntimeError):
        return None


def unlink(path: str) -> None:
    """Once every rank has it mapped: the mappings stay, the name goes."""
    try:
        os.unlink(path)
    except OSError:
        pass


class SharedMemorySum:
    """A group's sums over its mapped shared file: `buffer` (REGIONS x n slots of `slot_bytes`), this
    rank's place `me` among the group's `n`, and `barrier()`, the group's gloo barrier (the runtime's)."""

    def __init__(self, buffer: torch.Tensor, n: int, me: int, slot_bytes: int, barrier):
        self.buffer, self.n, self.me, self.slot_bytes, self.barrier = buffer, n, me, slot_bytes, barrier
        self.region = 0

    def sum(self, tensors: list[torch.Tensor]) -> None:
        """In-place SUM of `tensors` over the group (every rank passes tensors of the same shapes and dtypes)."""
        for dtype, group in _by_dtype(tensors).items():
            for piece in _pieces(group, self.slot_bytes // _itemsize(dtype)):
                self._sum_piece(piece, dtype)

    def _sum_piece(self, piece: list, dtype) -> None:
        _copy_in(piece, self._slot(self.me, dtype))
        self.barrier()
        count = sum(b - a for _, a, b in piece)
        share = -(-count // self.n)
        a, b = min(self.me * share, count), min((self.me + 1) * share, count)
        if b > a:
            total = self._slot(0, dtype)[a:b]
            for k in range(1, self.n):
                total.add_(self._slot(k, dtype)[a:b])
        self.barrier()
        _copy_out(self._slot(0, dtype), piece)
        self.region = (self.region + 1) % REGIONS

    def _slot(self, k: int, dtype) -> torch.Tensor:
        start = (self.region * self.n + k) * self.slot_bytes
        return self.buffer[start:start + self.slot_bytes].view(dtype)


def _itemsize(dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _by_dtype(tensors: list[torch.Tensor]) -> dict:
    out: dict = {}
    for t in tensors:
        if not t.is_contiguous():
            raise ValueError(f"a collective in place needs contiguous tensors, got strides {t.stride()}")
        out.setdefault(t.dtype, []).append(t.view(-1))
    return out


def _pieces(flat: list[torch.Tensor], capacity: int):
    """(tensor, start, stop) segments of `flat`, `capacity` elements at most per piece, in order."""
    piece, used = [], 0
    for t in flat:
        start = 0
        while start < t.numel():
            take = min(t.numel() - start, capacity - used)
            piece.append((t, start, start + take))
            used += take
            start += take
            if used == capacity:
                yield piece
                piece, used = [], 0
    if piece:
        yield piece


def _copy_in(piece: list, slot: torch.Tensor) -> None:
    at = 0
    for t, a, b in piece:
        slot[at:at + b - a].copy_(t[a:b])
        at += b - a


def _copy_out(slot: torch.Tensor, piece: list) -> None:
    at = 0
    for t, a, b in piece:
        t[a:b].copy_(slot[at:at + b - a])
        at += b - a

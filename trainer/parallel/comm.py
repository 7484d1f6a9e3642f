"""Point-to-point transfers between pipeline stages as named verbs, and the in-place async
collectives the runtime starts (`trainer.parallel.runtime` owns both).

Point-to-point sends are non-blocking (kept alive until `flush()`), receives block. Receive shapes
are always known locally (every rank reads the same batch), so only the payload travels. gloo needs
contiguous tensors on both sides.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


class StageComm:
    """`staged`: the device's tensors travel as host copies (gloo between ranks that share one GPU: NCCL refuses
    two ranks on one device, and gloo's point-to-point transfers take host memory only)."""

    def __init__(self, stage_ranks: list[int], device, dtype, staged: bool = False):
        self.stage_ranks = stage_ranks  # global rank of each stage of this rank's pipeline
        self.device, self.dtype, self.staged = device, dtype, staged
        self._pending: list = []
        self.bytes_sent = 0

    def _send(self, tensors, stage: int) -> None:
        for t in tensors:
            if t.numel() == 0:  # an empty time chunk: the receiver knows its shape and waits for nothing
                continue
            t = t.detach().to("cpu" if self.staged else t.device, self.dtype).contiguous()
            self._pending.append((dist.isend(t, self.stage_ranks[stage]), t))
            self.bytes_sent += t.numel() * t.element_size()

    def _recv(self, shapes, stage: int) -> list[torch.Tensor]:
        out = []
        for shape in shapes:
            t = torch.empty(shape, device="cpu" if self.staged else self.device, dtype=self.dtype)
            if t.numel():
                dist.recv(t, self.stage_ranks[stage])
            out.append(t.to(self.device) if self.staged else t)
        return out

    # activations, stage k -> k+1
    def send_forward(self, activation: torch.Tensor, stage: int) -> None:
        self._send([activation], stage)

    def recv_forward(self, shape, stage: int) -> torch.Tensor:
        return self._recv([shape], stage)[0]

    # gradients w.r.t. activations, stage k+1 -> k
    def send_backward(self, grad: torch.Tensor, stage: int) -> None:
        self._send([grad], stage)

    def recv_backward(self, shape, stage: int) -> torch.Tensor:
        return self._recv([shape], stage)[0]

    # the head phase: top encoder/decoder outputs split by sentences, and their gradients
    def scatter_shard(self, enc: torch.Tensor, dec: torch.Tensor, stage: int) -> None:
        self._send([enc, dec], stage)

    def recv_shard(self, enc_shape, dec_shape, stage: int) -> tuple[torch.Tensor, torch.Tensor]:
        enc, dec = self._recv([enc_shape, dec_shape], stage)
        return enc, dec

    def send_shard_grad(self, enc_grad: torch.Tensor, dec_grad: torch.Tensor, stage: int) -> None:
        self._send([enc_grad, dec_grad], stage)

    def gather_grad(self, enc_shape, dec_shape, stage: int) -> tuple[torch.Tensor, torch.Tensor]:
        enc, dec = self._recv([enc_shape, dec_shape], stage)
        return enc, dec

    def flush(self) -> None:
        """Wait for every pending send (end of a micro-step). Each handle is waited for once and dropped: with
        torch 2.13's gloo a second `wait()` on a finished send blocks until the group's timeout."""
        for work, _ in self._pending:
            work.wait()
        self._pending.clear()


class AsyncCollective:
    """One collective per tensor, in place, all started without blocking; `wait()` finishes them.

    In place rather than on one flat copy: the head's tensors (what these carry) are 2.2M elements, and
    flattening them before and copying the result back cost ~3.5 ms per step per rank in fp32, about as
    much as the transfers themselves (docs/BENCHMARKS.md 2.1). A tensor being received
    into must not be read before `wait()`, nor one being sent written."""

    def __init__(self, tensors: list[torch.Tensor], start):
        for t in tensors:
            if not t.is_contiguous():
                raise ValueError(f"a collective in place needs contiguous tensors, got strides {t.stride()}")
        self.works = [start(t) for t in tensors]

    def wait(self) -> None:
        for work in self.works:
            work.wait()
        self.works = []


class _CopyBack:
    """A collective started on a host copy of a device tensor: `wait()` finishes it, then copies the result back."""

    def __init__(self, work, host: torch.Tensor, target: torch.Tensor):
        self.work, self.host, self.target = work, host, target

    def wait(self) -> None:
        self.work.wait()
        self.target.copy_(self.host)


def staged(start):
    """`start` (tensor -> its started in-place collective) run on a host copy of a device tensor, copied back at
    `wait()`: for gloo between ranks that share one GPU. A host tensor goes as it is."""
    def run(t: torch.Tensor):
        if t.device.type == "cpu":
            return start(t)
        host = t.detach().to("cpu")
        return _CopyBack(start(host), host, t)

    return run
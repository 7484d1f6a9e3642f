"""Point-to-point transfers between pipeline stages as named verbs, and the flat-buffer async
collective the runtime starts (`trainer.parallel.runtime` owns both).

Point-to-point sends are non-blocking (kept alive until `flush()`), receives block. Receive shapes
are always known locally (every rank reads the same batch), so only the payload travels. gloo needs
contiguous tensors on both sides.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


class StageComm:
    def __init__(self, stage_ranks: list[int], device, dtype):
        self.stage_ranks = stage_ranks  # global rank of each stage of this rank's pipeline
        self.device, self.dtype = device, dtype
        self._pending: list = []
        self.bytes_sent = 0

    def _send(self, tensors, stage: int) -> None:
        for t in tensors:
            t = t.detach().to(self.dtype).contiguous()
            self._pending.append((dist.isend(t, self.stage_ranks[stage]), t))
            self.bytes_sent += t.numel() * t.element_size()

    def _recv(self, shapes, stage: int) -> list[torch.Tensor]:
        out = []
        for shape in shapes:
            t = torch.empty(shape, device=self.device, dtype=self.dtype)
            dist.recv(t, self.stage_ranks[stage])
            out.append(t)
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
        """Wait for every pending send (end of a micro-step)."""
        for work, _ in self._pending:
            work.wait()
        self._pending.clear()


class FlatCollective:
    """One collective on a flat buffer holding `tensors`, started without blocking; `wait()` finishes
    it and copies the result back into the tensors (if `copy_back`)."""

    def __init__(self, tensors: list[torch.Tensor], start, copy_back: bool = True):
        self.tensors, self.copy_back = tensors, copy_back
        self.flat = torch.cat([t.reshape(-1) for t in tensors]) if tensors else None
        self.work = start(self.flat) if tensors else None

    def wait(self) -> None:
        if self.work is None:
            return
        self.work.wait()
        if self.copy_back:
            offset = 0
            for t in self.tensors:
                n = t.numel()
                t.copy_(self.flat[offset:offset + n].view_as(t))
                offset += n
        self.work = None

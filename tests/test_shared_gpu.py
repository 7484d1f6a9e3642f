"""Ranks that share one GPU (the GPU check's 2-rank hybrid on its one H200): more local ranks than GPUs talk gloo
alone (NCCL refuses two ranks on one device), rank r computes on GPU r mod count, and every device tensor crosses
ranks as a host copy, copied back when the collective is done. What a CPU can check of it: the choice of backend
and device, and the copy-back; the run itself is the GPU check's `shared_gpu` stage (benchmarks/gpu/gpu_check.py),
rehearsed on the CPU in tests/test_gpu_check.py."""
from __future__ import annotations

import torch

from trainer.parallel import deepspeed_adapter as dsa
from trainer.parallel.comm import StageComm, _CopyBack, staged


class _FakeCuda:
    def __init__(self, count: int):
        self.count = count

    def device_name(self) -> str:
        return "cuda"

    def device_count(self) -> int:
        return self.count


def test_more_local_ranks_than_gpus_share_them_over_gloo(monkeypatch):
    monkeypatch.setattr(dsa, "accelerator", lambda: _FakeCuda(1))
    monkeypatch.setenv("LOCAL_SIZE", "2")
    assert dsa.gpus_shared() and dsa.comm_backend() == "gloo"
    monkeypatch.setenv("LOCAL_SIZE", "1")
    assert not dsa.gpus_shared() and dsa.comm_backend() == "cpu:gloo,cuda:nccl"
    monkeypatch.delenv("LOCAL_SIZE")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun's name for it
    monkeypatch.setattr(dsa, "accelerator", lambda: _FakeCuda(4))
    assert not dsa.gpus_shared()


class _Work:
    def __init__(self, host: torch.Tensor, value: float):
        self.host, self.value, self.waited = host, value, False

    def wait(self) -> None:  # the collective lands in the host copy
        self.host.fill_(self.value)
        self.waited = True


def test_a_staged_collective_lands_in_the_device_tensor_only_at_wait():
    target = torch.zeros(3)
    host = target.clone()
    work = _CopyBack(_Work(host, 5.0), host, target)
    assert torch.equal(target, torch.zeros(3))  # a tensor being received into is not read before wait()
    work.wait()
    assert work.work.waited and torch.equal(target, torch.full((3,), 5.0))
    started = []
    run = staged(lambda t: started.append(t) or "work")
    cpu = torch.ones(2)
    assert run(cpu) == "work" and started[0] is cpu  # a host tensor goes as it is, no copy


def test_a_staged_stage_comm_sends_host_copies_and_receives_into_the_device(monkeypatch):
    sent, received = [], []
    monkeypatch.setattr("torch.distributed.isend", lambda t, dst: sent.append((t, dst)) or _Done())
    monkeypatch.setattr("torch.distributed.recv", lambda t, src: received.append(t) or t.fill_(2.0))
    comm = StageComm([7, 9], torch.device("cpu"), torch.float32, staged=True)
    comm.send_forward(torch.ones(2, 3, dtype=torch.float64), 1)
    (t, dst), = sent
    assert dst == 9 and t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()
    out = comm.recv_backward((2, 3), 0)
    assert received[0].device.type == "cpu" and torch.equal(out, torch.full((2, 3), 2.0))
    comm.flush()


class _Done:
    def wait(self) -> None:
        pass


def test_a_sharing_ranks_local_rank_becomes_its_gpus_index_for_deepspeed(monkeypatch):
    """DeepSpeed places the pipeline's modules and the engine on GPU LOCAL_RANK: rank 1 of 2 on one GPU was
    'invalid device ordinal' in the GPU check of 2026-12-04 (its second version)."""
    from trainer.parallel.runtime import device_index

    monkeypatch.setattr(dsa, "accelerator", lambda: _FakeCuda(1))
    monkeypatch.setenv("LOCAL_SIZE", "2")
    env = {"LOCAL_RANK": "1"}
    assert device_index(_FakeCuda(1), env) == 0 and env == {"LOCAL_RANK": "0", "HNMT_LOCAL_RANK": "1"}
    assert device_index(_FakeCuda(1), env) == 0 and env["HNMT_LOCAL_RANK"] == "1"  # asked again: the same
    monkeypatch.setenv("LOCAL_SIZE", "1")
    env = {"LOCAL_RANK": "0"}
    assert device_index(_FakeCuda(1), env) == 0 and env == {"LOCAL_RANK": "0"}  # one rank per GPU: untouched

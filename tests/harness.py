"""An in-process harness for multi-rank tests: a pool of spawned worker processes that import torch and
DeepSpeed once, then run job after job as real gloo jobs of any world size (up to the pool's size).

A job is a module-level function `fn(*args)` run on ranks 0..world-1 with RANK/WORLD_SIZE/MASTER_*
set as the deepspeed launcher sets them; it starts its own `ParallelRuntime` (the real rendezvous,
groups and DeepSpeed engine), returns a picklable result per rank, and the harness closes the
process group afterwards. A job that hangs or dies fails the test after `timeout` seconds, and the
pool is restarted for the next one.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import traceback


def free_port() -> int:
    """A TCP port nothing listens on now, on the loopback: a job's MASTER_PORT (the tests' one copy; the
    benchmarks have theirs in benchmarks/common.py, and tests never import benchmarks for it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(inbox, outbox) -> None:
    os.environ.setdefault("WANDB_MODE", "disabled")
    import torch

    torch.set_num_threads(1)
    import trainer.parallel.runtime  # noqa: F401  (torch.distributed + DeepSpeed, once)

    while True:
        job = inbox.get()
        if job is None:
            return
        rank, world, port, fn, args = job
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_SIZE=str(world),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        try:
            outbox.put((rank, True, fn(*args)))
        except BaseException:  # noqa: BLE001  (reported to the test, which fails with it)
            outbox.put((rank, False, traceback.format_exc()))
        finally:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def _meet() -> None:
    from trainer.parallel.runtime import start_process_group

    start_process_group(60)


class JobError(AssertionError):
    pass


class Workers:
    def __init__(self, size: int):
        self.size = size
        self.ctx = mp.get_context("spawn")
        self.procs: list = []
        self._start()

    def _start(self) -> None:
        self.inboxes = [self.ctx.Queue() for _ in range(self.size)]
        self.outbox = self.ctx.Queue()
        self.procs = [self.ctx.Process(target=_serve, args=(q, self.outbox), daemon=True) for q in self.inboxes]
        for p in self.procs:
            p.start()
        # DeepSpeed's comm layer is set up once per process, for the world it first sees: meet once
        # with all workers.
        self.run(self.size, _meet)

    def run(self, world: int, fn, *args, timeout: float = 120) -> list:
        """fn(*args) on ranks 0..world-1; returns their results in rank order."""
        if world > self.size:
            raise ValueError(f"world {world} > pool size {self.size}")
        if not all(p.is_alive() for p in self.procs):
            self.restart()
        port = free_port()
        for rank in range(world):
            self.inboxes[rank].put((rank, world, port, fn, args))
        results, errors = {}, []
        try:
            for _ in range(world):
                rank, ok, value = self.outbox.get(timeout=timeout)
                (results.__setitem__(rank, value) if ok else errors.append(f"rank {rank}:\n{value}"))
        except queue.Empty:
            self.restart()
            raise JobError(f"{fn.__name__} on {world} ranks: no answer within {timeout}s (a hang?); "
                           f"finished ranks: {sorted(results)}") from None
        if errors:
            self.restart()  # a failed rank may leave its peers waiting in a collective
            raise JobError(f"{fn.__name__} on {world} ranks failed:\n" + "\n".join(errors))
        return [results[r] for r in range(world)]

    def restart(self) -> None:
        self.close()
        self._start()

    def close(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=10)
        self.procs = []

"""An in-process harness for multi-rank tests: a pool of spawned worker processes that import torch and
DeepSpeed once, then run job after job as real gloo jobs of any world size (up to the pool's size).

A job is a module-level function `fn(*args)` run on ranks 0..world-1 with RANK/WORLD_SIZE/MASTER_*
set as the deepspeed launcher sets them; it starts its own `ParallelRuntime` (the real rendezvous,
groups and DeepSpeed engine), returns a picklable result per rank, and the harness closes the
process group afterwards. A job that hangs, dies or fails fails its test (after `timeout` seconds for a
hang, at once for a worker that exits) and the pool is stopped; the next job starts a fresh one.

The pool starts with the first job that needs it: the workers import first, each says when it is ready,
and only then do they meet (a gloo rendezvous on a fresh port). Meeting before every worker had imported is
what failed under load: the first rank's rendezvous timed out while the last one was still importing torch,
and the others saw "Gloo connectFullMesh failed ... Connection closed by peer". A start that fails anyway
is retried (START_TRIES, a fresh port and fresh processes each time); if it never succeeds, the test that
asked fails with the cause of each try, and the next test tries again, so one bad start fails one test.

The workers of a preloading pool start with what a training process runs with (its allocator preloaded, its
oneDNN cache and mimalloc settings: `trainer.training.memory.training_environ`), as the ranks a launcher starts
do; under the C library's malloc a worker spent as much CPU time in the kernel (fresh pages) as in its jobs.
"""
from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import os
import queue
import shutil
import sys
import tempfile
import time
import traceback

from trainer.parallel.ports import free_port  # noqa: F401  (the tests' MASTER_PORT: conftest and test_multinode import it here)
from trainer.training.memory import training_environ  # (no torch: the pool's own process stays light)

START_TRIES = 3
READY_TIMEOUT_S = 300  # spawning and importing torch + DeepSpeed, four at once on two loaded cores
MEET_TIMEOUT_S = 60  # every worker has imported by then: the rendezvous itself takes a second
CLOSE_GRACE_S = 10  # idle workers asked to end, then killed (Workers.close)


def _quiet(err_path: str) -> None:
    """A worker's own prints (the trainer's start-up lines, DeepSpeed's) go nowhere, and what it writes to stderr
    (gloo's C++ log of a failed rendezvous, warnings) to `err_path`: pytest -q shows dots; a failing job's
    traceback comes back through the outbox, and a worker that dies or a start that fails quotes that file's tail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(err, 2)
    os.close(err)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)


def running(pid: int) -> bool:
    """Whether process `pid` exists and has not exited (a zombie awaiting its parent's wait has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _end_with_parent() -> None:
    """This worker ends when the process that spawned it does, however that ends (SIGKILL or SIGTERM to pytest run
    no teardown): a met pool's gloo threads poll, and four orphaned workers took 5-9% of a core each for as long
    as they lived. Linux's PR_SET_PDEATHSIG; a parent already gone by then: exit now."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the pool's close() and unconfigure remain
        return
    parent = mp.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # gone before the request was made
        os._exit(1)


def _serve(inbox, outbox, index: int, preload: bool, err_path: str) -> None:
    _end_with_parent()
    os.environ.setdefault("WANDB_MODE", "disabled")
    _quiet(err_path)
    if preload:
        import torch

        torch.set_num_threads(1)
        import trainer.parallel.runtime  # noqa: F401  (torch.distributed + DeepSpeed, once)

    outbox.put((index, True, "ready"))
    allowed = os.sched_getaffinity(0)  # a job's rank may pin its threads (train.pin_cores): not the next job's
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
            if "trainer.parallel.runtime" in sys.modules:  # only what imported it can have pinned its threads
                sys.modules["trainer.parallel.runtime"].keep_threads_on(allowed)
            if preload:
                import torch.distributed as dist

                if dist.is_initialized():  # a job that did not close its runtime (ParallelRuntime.close releases)
                    from trainer.parallel.deepspeed_adapter import release_comm

                    dist.destroy_process_group()
                    release_comm()  # its groups and their polling gloo threads, gone with it (as with its process)
                gc.collect()  # what holds them in reference cycles (an engine, its grid)


@contextlib.contextmanager
def _environ(values: dict):
    """os.environ with `values` set, as it was afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _meet() -> None:
    from trainer.parallel.runtime import start_process_group

    start_process_group(MEET_TIMEOUT_S)


class JobError(AssertionError):
    pass


def _tracebacks(errors: dict) -> str:
    return "".join(f"\nrank {rank}:\n{tb}" for rank, tb in sorted(errors.items()))


class Workers:
    """`size` workers. `meet(*meet_args)`: the job every worker runs once at a start (a module-level function);
    `preload`: import torch and DeepSpeed before saying ready (the harness's own tests start light pools)."""

    def __init__(self, size: int, start_tries: int = START_TRIES, meet=_meet, meet_args: tuple = (),
                 preload: bool = True):
        self.size, self.start_tries, self.preload = size, start_tries, preload
        self.meet, self.meet_args = meet, meet_args
        self.ctx = mp.get_context("spawn")
        self.procs: list = []
        self.starts = 0  # pools started: a failed job costs the next one a start, never every later test
        self.error_grace_s = 10.0  # after a rank failed, how long its peers may take to answer
        self._failed_start = False
        self._met = False  # the workers of self.procs have met (a started pool)
        self.err_dir = tempfile.mkdtemp(prefix="hnmt-workers-")  # each worker's stderr (_quiet)

    def spawn_early(self) -> None:
        """Spawn the workers now, without waiting: they import torch and DeepSpeed on the core the tests
        before the first job leave idle; that job then only meets them."""
        if not self.procs:
            self._spawn()

    def run(self, world: int, fn, *args, timeout: float = 120) -> list:
        """fn(*args) on ranks 0..world-1; returns their results in rank order."""
        if world > self.size:
            raise ValueError(f"world {world} > pool size {self.size}")
        if not self._met or not all(p.is_alive() for p in self.procs):
            self._start()
        try:
            return self._dispatch(world, fn, args, timeout)
        except JobError:
            self._stop()  # a failed or hung rank may leave its peers waiting in a collective
            raise

    def _start(self) -> None:
        """Spawn (unless spawn_early did), wait until every worker has imported, then meet; a bounded number
        of tries. After a start that failed every try, a later test gets one try (its own cause, without the
        whole wait again)."""
        if self._met or not all(p.is_alive() for p in self.procs):
            self._stop()
        causes = []
        for attempt in range(1 if self._failed_start else self.start_tries):
            try:
                if not self.procs:
                    self._spawn()
                self._collect(self.size, READY_TIMEOUT_S, "starting the workers")
                self._dispatch(self.size, self.meet, self.meet_args, 2 * MEET_TIMEOUT_S)
                self.starts += 1
                self._failed_start, self._met = False, True
                return
            except JobError as e:
                causes.append(f"try {attempt + 1}: {e}")
                self._stop()
        self._failed_start = True
        raise JobError(f"the pool of {self.size} workers did not start:\n" + "\n".join(causes))

    def _spawn(self) -> None:
        os.makedirs(self.err_dir, exist_ok=True)  # again after a close()
        self.inboxes = [self.ctx.Queue() for _ in range(self.size)]
        self.outbox = self.ctx.Queue()
        self.procs = [self.ctx.Process(target=_serve, args=(q, self.outbox, i, self.preload, self._err_path(i)),
                                       daemon=True) for i, q in enumerate(self.inboxes)]
        with _environ(training_environ() if self.preload else {}):  # a spawned process takes this environ
            for p in self.procs:
                p.start()

    def _dispatch(self, world: int, fn, args, timeout: float) -> list:
        port = free_port()
        for rank in range(world):
            self.inboxes[rank].put((rank, world, port, fn, args))
        return self._collect(world, timeout, f"{fn.__name__} on {world} ranks")

    def _collect(self, n: int, timeout: float, what: str) -> list:
        """The answers of ranks (workers) 0..n-1 in order, or a JobError naming what failed: each failed rank's
        traceback (once its peers have answered, or `error_grace_s` after it), a worker that exited, or no
        answer within `timeout` seconds."""
        results, errors, deadline, last = {}, {}, time.monotonic() + timeout, time.monotonic()
        while len(results) + len(errors) < n:
            try:
                rank, ok, value = self.outbox.get(timeout=1)
            except queue.Empty:
                now = time.monotonic()
                if errors and now - last > self.error_grace_s:
                    break  # a failed rank's peers wait in a collective that never completes
                dead = [f"worker {i} exited with code {p.exitcode}" for i, p in enumerate(self.procs[:n])
                        if not p.is_alive()]
                if dead or now > deadline:
                    raise JobError(f"{what}: {'; '.join(dead) or f'no answer within {timeout:.0f}s (a hang?)'}; "
                                   f"answered: {sorted(results)}" + _tracebacks(errors) + self._stderr(n)) from None
                continue
            last = time.monotonic()
            (results if ok else errors)[rank] = value
        if errors:
            silent = sorted(set(range(n)) - set(results) - set(errors))
            raise JobError(f"{what} failed" + (f" (ranks {silent} did not answer)" if silent else "") + ":" +
                           _tracebacks(errors))
        return [results[r] for r in range(n)]

    def _err_path(self, index: int) -> str:
        return os.path.join(self.err_dir, f"worker_{index}.err")

    def _stderr(self, n: int, tail: int = 1500) -> str:
        """The last `tail` characters each of workers 0..n-1 wrote to stderr, for a JobError's message."""
        said = []
        for i in range(n):
            try:
                with open(self._err_path(i), errors="replace") as f:
                    text = f.read()[-tail:].strip()
            except OSError:
                continue
            if text:
                said.append(f"\nworker {i}'s stderr (its end):\n{text}")
        return "".join(said)

    def close(self) -> None:
        """End the workers and remove their stderr files: the pool is done (a later job would start afresh).
        Idle workers are asked to end (a process that ends by itself runs its exit handlers: what torch.compile
        started in it goes, and the semaphores it registered with multiprocessing's resource tracker are released;
        a killed one left one behind, reported as leaked when the session ended); any still there after
        CLOSE_GRACE_S are killed."""
        if self._met:
            for q, p in zip(self.inboxes, self.procs):
                if p.is_alive():
                    q.put(None)
            deadline = time.monotonic() + CLOSE_GRACE_S
            for p in self.procs:
                p.join(timeout=max(0.0, deadline - time.monotonic()))
        self._stop()
        shutil.rmtree(self.err_dir, ignore_errors=True)

    def _stop(self) -> None:
        """Stop the workers (a failed start or job): their stderr files stay for the report."""
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=10)
        self.procs, self._met = [], False

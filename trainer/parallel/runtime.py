"""The parallel runtime: one object per training process that starts torch.distributed, owns every
process group and is the only way anything crosses ranks.

Built front to back from the layout: LayoutSpec -> the process group (`start`) -> DeepSpeed's grid
over the spec's topology (checked against `layout.group_members`, the same map the schedule replay
uses) -> the eval group. Verbs:

    p2p              `stage_comm(dtype)`: activations, shards and their gradients between stages
    collectives      `all_reduce`, `reduce_async`, `broadcast_async`, `gather` over a named group; on a CPU
                     the replicas' gradient sums (`all_reduce_async`) of a group whose ranks share this
                     host go through shared memory (trainer.parallel.shm_sum; parallel_layout.shared_memory_sums),
                     finished when they return; the head's reduce and broadcast stay asynchronous on gloo (a
                     pipeline's stages reach them at different times: waiting for each other there cost more
                     than the transfer, docs/BENCHMARKS.md)
    objects          `broadcast_object`, `all_gather_object` (small Python values: errors, answers)
    lifetime         `barrier`, `close`

Rendezvous: a single process needs no store server (an in-memory HashStore); a multi-process job's
store listens only on MASTER_ADDR (loopback for a job on one host), never on every interface, and a
job on one host keeps gloo's own connections on loopback too.
"""
from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from trainer.parallel import deepspeed_adapter as dsa
from trainer.parallel.comm import AsyncCollective, StageComm, staged
from trainer.parallel.layout import LayoutSpec, ParallelLayout, group_members
from trainer.parallel import shm_sum

EVAL_WAIT_S = 2 * 3600  # how long other ranks wait for rank 0's dev BLEU decode


class CommError(RuntimeError):
    """A collective or point-to-point transfer failed: a peer died, or stopped answering for longer
    than train.comm_timeout_s."""


class RendezvousError(RuntimeError):
    """The job could not meet: no address to listen on or to reach (the message says which)."""


def is_comm_failure(err: BaseException) -> bool:
    """Whether `err` is a transport failure (peer gone, timeout) rather than a bug in our code."""
    if isinstance(err, (CommError, getattr(dist, "DistError", CommError))):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and any(s in text for s in (
        "gloo", "Connection closed by peer", "Connection reset by peer", "Timed out", "NCCL", "Broken pipe"))


def launched_world() -> tuple[int, int]:
    """(rank, world size) as the launcher set them; a plain `python` process is a world of one."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _is_loopback(host: str) -> bool:
    try:
        return all(ipaddress.ip_address(info[4][0]).is_loopback
                   for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP))
    except (OSError, ValueError):
        return False


def _store(rank: int, world: int, timeout: timedelta):
    """The rendezvous store. World of one: in memory. Otherwise a TCPStore whose server (rank 0)
    listens on MASTER_ADDR:MASTER_PORT only (torch's own server would bind every interface)."""
    if world == 1:
        return dist.HashStore()
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if rank != 0:
        return dist.TCPStore(addr, port, world, False, timeout)
    infos = sorted(socket.getaddrinfo(addr, port, proto=socket.IPPROTO_TCP), key=lambda i: i[0] != socket.AF_INET)
    family, _, _, _, sockaddr = infos[0]
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(sockaddr)
    except OSError as e:
        listener.close()
        raise RendezvousError(f"rendezvous: cannot listen on MASTER_ADDR={addr} MASTER_PORT={port}: {e.strerror or e}") from None
    listener.listen(128)
    store = dist.TCPStore(addr, port, world, True, timeout, master_listen_fd=listener.detach())
    return store


def start_process_group(timeout_s: int) -> tuple[int, int]:
    """Start torch.distributed (gloo on CPU, nccl on CUDA) and DeepSpeed's comm layer on it.

    `timeout_s` bounds every wait on a peer, in every process group: torch gives groups made later by
    `new_group` (DeepSpeed's grid) its own 30-minute default instead of the world's timeout, so the
    module default is set before any group exists."""
    import torch.distributed.distributed_c10d as c10d

    dsa.check_version()
    timeout = timedelta(seconds=timeout_s)
    c10d.default_pg_timeout = timeout
    if hasattr(c10d, "default_pg_nccl_timeout"):
        c10d.default_pg_nccl_timeout = timeout
    rank, world = launched_world()
    if "RANK" not in os.environ:  # plain `python launch/train.py`: DeepSpeed reads these
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(os.getpid() + 20000))  # nothing listens on it: the store is in memory
    os.environ.setdefault("LOCAL_RANK", "0")
    if world == 1 or _is_loopback(os.environ["MASTER_ADDR"]):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one host: gloo's pair sockets on loopback
    accel = dsa.accelerator()
    if accel.device_name() == "cuda":
        accel.set_device(device_index(accel))
    dist.init_process_group(dsa.comm_backend(), store=_store(rank, world, timeout), rank=rank, world_size=world,
                            timeout=timeout)
    dsa.init_comm(timeout_s)
    return rank, world


def device_index(accel, environ=os.environ) -> int:
    """This rank's GPU: its local rank; where more local ranks than GPUs share them (dsa.gpus_shared: gloo, tensors
    staged through host memory), local rank mod the GPU count. DeepSpeed places the pipeline's modules and the
    engine on GPU LOCAL_RANK (PipelineModule, DeepSpeedEngine), so a sharing rank's LOCAL_RANK becomes that GPU's
    index; the launcher's stays in HNMT_LOCAL_RANK."""
    local = int(environ["LOCAL_RANK"])
    if not dsa.gpus_shared():
        return local
    environ.setdefault("HNMT_LOCAL_RANK", str(local))
    index = int(environ["HNMT_LOCAL_RANK"]) % max(1, accel.device_count())
    environ["LOCAL_RANK"] = str(index)
    return index


@dataclass
class ParallelRuntime:
    """This process's place in the job and its process groups (see the module docstring)."""

    layout: ParallelLayout
    grid: object  # DeepSpeed's PipelineParallelGrid: the `mpu` of deepspeed.initialize
    groups: dict  # name -> process group handle (None = the world group)
    peers: list = field(default_factory=list)  # host, pid, start time of every rank, for failure messages
    comm_timeout_s: int = 300
    shared: dict = field(default_factory=dict)  # group name -> SharedMemorySum, or None: gloo (made at first use)

    @classmethod
    def start(cls, spec: LayoutSpec, comm_timeout_s: int = 300, verbose: bool = False) -> "ParallelRuntime":
        """Start this process's share of the job for `spec` (every rank calls it); `verbose`: let
        DeepSpeed print its start-up notices."""
        dsa.set_verbose(verbose)
        rank, world = start_process_group(comm_timeout_s)
        spec.check_world(world)
        return cls.on_started(spec, rank, comm_timeout_s)

    @classmethod
    def start_agreed(cls, choose, comm_timeout_s: int = 300, verbose: bool = False) -> tuple["ParallelRuntime", object]:
        """Start this process's share of a job whose layout rank 0 chooses once the process group is up:
        `choose(world)` -> (LayoutSpec, anything that goes with it), run on rank 0 only; every rank takes rank 0's
        answer (a broadcast), or raises rank 0's error. Returns (the runtime of that layout, the answer)."""
        dsa.set_verbose(verbose)
        rank, world = start_process_group(comm_timeout_s)
        answer = None
        if rank == 0:
            try:
                answer = ("ok", choose(world))
            except (ValueError, OSError) as e:  # every rank leaves with rank 0's one line
                answer = ("error", f"{type(e).__name__}: {e}" if isinstance(e, OSError) else str(e))
        if world > 1:
            box = [answer]
            dist.broadcast_object_list(box, src=0)
            answer = box[0]
        if answer[0] == "error":
            raise ValueError(answer[1])
        spec = answer[1][0]
        spec.check_world(world)
        return cls.on_started(spec, rank, comm_timeout_s), answer[1]

    @classmethod
    def on_started(cls, spec: LayoutSpec, rank: int, comm_timeout_s: int = 300) -> "ParallelRuntime":
        """The groups of `spec` on a process group that is already up."""
        grid = dsa.make_grid(spec.num_pp, spec.num_dp)
        layout = ParallelLayout(spec, rank)
        expected = {name: next(g for g in lists if rank in g) for name, lists in group_members(spec).items()}
        built = dsa.grid_members(grid)
        for name in ("pipe", "data"):
            if built[name] != expected[name]:
                raise RuntimeError(f"rank {rank}: DeepSpeed's grid built the {name} group {built[name]}, the layout "
                                   f"expects {expected[name]} (topology order changed?)")
        # ranks wait on this group while rank 0 decodes the dev set, which may take longer than
        # comm_timeout_s; a rank 0 that dies is still noticed at once (its connections close)
        eval_group = dist.new_group(timeout=timedelta(seconds=max(comm_timeout_s, EVAL_WAIT_S)))
        groups = {"world": None, **dsa.grid_groups(grid), "eval": eval_group}
        rt = cls(layout=layout, grid=grid, groups=groups, comm_timeout_s=comm_timeout_s)
        import psutil

        rt.peers = rt.all_gather_object({"host": socket.gethostname(), "pid": os.getpid(),
                                         "started": psutil.Process().create_time()})
        return rt

    # ---- who am I ----
    @property
    def spec(self) -> LayoutSpec:
        return self.layout.spec

    @property
    def rank(self) -> int:
        return self.layout.rank

    @property
    def world_size(self) -> int:
        return self.spec.world_size

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    def device(self) -> torch.device:
        return torch.device(dsa.accelerator().current_device_name())

    def describe_device(self) -> str:
        """Where this rank computes, as the trainer prints it at start (`device: cuda:0 (NVIDIA H200) ...`):
        a GPU job that fell back to DeepSpeed's CPU accelerator says `device: cpu` here."""
        dev = self.device()
        name = f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else ""
        shared = (f"; {_local_ranks()} local ranks share {torch.cuda.device_count()} GPU(s): tensors cross ranks "
                  f"through host memory over gloo (a check of the multi-rank path, not for speed)"
                  if self.staged else "")
        return (f"device: {dev}{name}; DeepSpeed accelerator {dsa.accelerator().device_name()}, "
                f"backend {dsa.comm_backend()}{shared}")

    # ---- point to point ----
    def stage_comm(self, dtype) -> StageComm:
        return StageComm(self.layout.stage_ranks, self.device(), dtype, staged=self.staged)

    @property
    def staged(self) -> bool:
        """Whether device tensors cross ranks as host copies: CUDA ranks sharing a GPU talk gloo, whose transfers
        take host memory (dsa.gpus_shared). For checking the multi-rank CUDA path on one GPU, not for speed."""
        return self.device().type != "cpu" and dsa.comm_backend() == "gloo"

    def _collective(self, start):
        return staged(start) if self.staged else start

    # ---- collectives (group: a name of layout.group_members, or "eval") ----
    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", group: str = "world") -> torch.Tensor:
        if self.world_size > 1:
            reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
            self._collective(lambda t: dist.all_reduce(t, op=reduce_op, group=self.groups[group], async_op=True))(
                tensor).wait()
        return tensor

    def stage_sum(self):
        """An in-place SUM over this rank's pipeline stages (the gradient norm's), or None with one stage."""
        if self.spec.num_pp == 1:
            return None
        return lambda tensor: self.all_reduce(tensor, group="pipe")

    def rank_sum(self):
        """An in-place SUM over every rank (ZeRO's gradient norm: a partition per replica and stage), or None with
        one rank."""
        if self.world_size == 1:
            return None
        return lambda tensor: self.all_reduce(tensor, group="world")

    def shared_memory(self, group: str) -> shm_sum.SharedMemorySum | None:
        """The group's shared-memory sums, where they serve: a CPU job with parallel_layout.shared_memory_sums,
        every rank of the group on this host. Every rank of the group asks at the same point (its first
        gradient sum): they map the shared file together."""
        if group not in self.shared:
            members = next(g for g in group_members(self.spec)[group] if self.rank in g)
            usable = (self.spec.shared_memory_sums and len(members) > 1 and self.device().type == "cpu"
                      and dist.is_initialized())
            self.shared[group] = self.open_shared_memory(group, [p["host"] for p in self.peers]) if usable else None
        return self.shared[group]

    def open_shared_memory(self, group: str, hosts: list[str],
                           slot_bytes: int = shm_sum.SLOT_BYTES) -> shm_sum.SharedMemorySum | None:
        """Map a shared file for `group` (collective over it): its first rank creates it, the others map it, it
        is unlinked once all have, before any rank returns; None (stay on gloo) if the group's ranks are on more
        than one host (`hosts`: each global rank's) or any rank could not map it."""
        members = next(g for g in group_members(self.spec)[group] if self.rank in g)
        if len({hosts[r] for r in members}) != 1:
            return None
        size, first = shm_sum.region_bytes(len(members), slot_bytes), self.rank == members[0]
        path = self.broadcast_object(shm_sum.create(f"{group}{members[0]}", size) if first else None,
                                     src=members[0], group=group)
        if path is None:
            return None
        buffer = shm_sum.attach(path, size)
        failed = self.all_reduce(torch.tensor([float(buffer is None)]), op="max", group=group)
        if first:
            shm_sum.unlink(path)
        pg = self.groups[group]
        dist.barrier(group=pg)  # once any rank returns, the name is gone from /dev/shm
        if failed.item() > 0:
            return None
        return shm_sum.SharedMemorySum(buffer, len(members), members.index(self.rank), slot_bytes,
                                       lambda: dist.barrier(group=pg))

    @property
    def sums_overlap(self) -> bool:
        """Whether a started gradient sum runs while the caller goes on (gloo, NCCL); shared-memory sums are
        done when they return, so starting them early only adds waits."""
        return self.shared_memory("data") is None

    def reduce_async(self, tensors: list[torch.Tensor], dst: int, group: str) -> AsyncCollective:
        """Start the SUM of `tensors` over `group` into global rank `dst`; after `wait()` it is in `dst`'s
        tensors (the others' are scratch)."""
        return AsyncCollective(tensors, self._collective(lambda t: dist.reduce(
            t, dst=dst, op=dist.ReduceOp.SUM, group=self.groups[group], async_op=True)))

    def all_reduce_async(self, tensors: list[torch.Tensor], group: str) -> AsyncCollective:
        """Start the in-place SUM of `tensors` over `group`; after `wait()` every rank of it has the sums."""
        if (shm := self.shared_memory(group)) is not None:
            shm.sum(tensors)
            return AsyncCollective([], None)
        return AsyncCollective(tensors, self._collective(lambda t: dist.all_reduce(
            t, op=dist.ReduceOp.SUM, group=self.groups[group], async_op=True)))

    def broadcast_async(self, tensors: list[torch.Tensor], src: int, group: str) -> AsyncCollective:
        """Start sending `src`'s values of `tensors` to every rank of `group`; after `wait()` every rank
        has them."""
        return AsyncCollective(tensors, self._collective(lambda t: dist.broadcast(
            t, src=src, group=self.groups[group], async_op=True)))

    def broadcast_object(self, obj, src: int = 0, group: str = "world"):
        """`src`'s `obj` on every rank of `group`."""
        if self.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src, group=self.groups[group])
        return box[0]

    def gather(self, tensor: torch.Tensor, dst: int, group: str) -> list[torch.Tensor] | None:
        """Every rank of `group`'s `tensor` (same shape and dtype), in the group's rank order, on global rank
        `dst`; None on the others."""
        if self.world_size == 1:
            return [tensor]
        device, tensor = tensor.device, tensor.cpu() if self.staged else tensor
        out = [torch.empty_like(tensor) for _ in range(dist.get_world_size(self.groups[group]))] \
            if self.rank == dst else None
        dist.gather(tensor, gather_list=out, dst=dst, group=self.groups[group])
        return None if out is None else [t.to(device) for t in out]

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's `tensor` stacked in rank order: (world, *shape), on every rank."""
        if self.world_size == 1:
            return tensor.unsqueeze(0)
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(out, tensor)
        return torch.stack(out)

    def all_gather_object(self, obj) -> list:
        """Every rank's `obj`, in rank order, on every rank."""
        if self.world_size == 1:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    # ---- lifetime ----
    def close(self, together: bool = True) -> None:
        """Leave the job: `together` waits for every rank first (no rank tears gloo down under a peer
        still talking); after an error all ranks raised alike, leave without waiting."""
        if not dist.is_initialized():
            return
        if together:
            self.barrier()
        dist.destroy_process_group()
        dsa.release_comm()

    def peer_status(self) -> str:
        """Which ranks on this host are gone or stopped; ranks on other hosts cannot be checked from here."""
        import psutil

        host, notes, elsewhere = socket.gethostname(), [], []
        for rank, peer in enumerate(self.peers):
            if peer["host"] != host:
                elsewhere.append(f"rank {rank} ({peer['host']})")
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
        text = "; ".join(notes) or "every rank on this host is still running"
        if elsewhere:
            text += f"; ranks on other hosts cannot be checked from here: {', '.join(elsewhere)}"
        return text

    def end_stopped_peers(self) -> list[str]:
        """For a rank leaving the job because a peer stopped answering: the ranks of this job on this host that are
        stopped (SIGSTOP) ended with SIGKILL, the one signal a stopped process takes; else the job outlives this rank
        by the launcher's grace (DeepSpeed's launcher waits 30 s before its own SIGKILL). Only a process whose start
        time is the one the rank reported (not a reused pid); one under a debugger (tracing stop) is left to the user.
        Returns "rank R (pid P)" of each rank ended."""
        import psutil

        host, ended = socket.gethostname(), []
        for rank, peer in enumerate(self.peers):
            if peer["host"] != host or peer["pid"] == os.getpid():
                continue
            try:
                process = psutil.Process(peer["pid"])
                if process.status() == psutil.STATUS_STOPPED and process.create_time() == peer.get("started"):
                    process.kill()
                    ended.append(f"rank {rank} (pid {peer['pid']})")
            except psutil.Error:
                continue
        return ended


def accelerator_name() -> tuple[str, str]:
    """(device type, device name) this process would train on, before anything is started: ("cuda", "NVIDIA H200")."""
    accel = dsa.accelerator()
    kind = accel.device_name()
    if kind == "cuda":
        return kind, torch.cuda.get_device_name(device_index(accel, dict(os.environ, LOCAL_RANK=os.environ.get(
            "LOCAL_RANK", "0"))))
    return kind, ""


def current_rank() -> int | str:
    """This process's global rank for messages, '?' before the process group exists."""
    return dist.get_rank() if dist.is_initialized() else "?"


def set_threads(threads: int) -> int:
    """torch threads per rank: `threads`; for 0 (auto) OMP_NUM_THREADS where the environment sets it to a whole
    number from 1 to the host's cores (as DeepSpeed's launcher does with --bind_cores_to_rank, or a cluster's job
    environment), else the host's cores divided among its local ranks."""
    if threads <= 0:
        threads = auto_threads()
    torch.set_num_threads(threads)
    return threads


def auto_threads(environ=None) -> int:
    """train.threads=0: OMP_NUM_THREADS where set to 1..cores (`omp_threads`), else cores / local ranks (at least 1)."""
    environ = os.environ if environ is None else environ
    return omp_threads(environ) or max(1, (os.cpu_count() or 1) // _local_ranks(environ))


def omp_threads(environ=None) -> int | None:
    """OMP_NUM_THREADS as the environment sets it, where it is a whole number from 1 to the host's cores."""
    asked = (os.environ if environ is None else environ).get("OMP_NUM_THREADS", "").strip()
    return int(asked) if asked.isdigit() and 1 <= int(asked) <= (os.cpu_count() or 1) else None


def _local_ranks(environ=None) -> int:
    environ = os.environ if environ is None else environ
    return max(1, int(environ.get("LOCAL_SIZE", environ.get("LOCAL_WORLD_SIZE", "1"))))


def rank_cores(allowed: list[int], local_rank: int, local_ranks: int, threads: int) -> list[int] | None:
    """The cores of `allowed` (sorted) local rank `local_rank` of `local_ranks` keeps its `threads` threads on:
    the rank's own slice, `threads` wide; None when the ranks' threads do not fit `allowed` (they would share)."""
    if local_ranks * threads > len(allowed) or not 0 <= local_rank < local_ranks:
        return None
    return allowed[local_rank * threads:(local_rank + 1) * threads]


def pin_cores(mode: str, threads: int, on_cpu: bool) -> str:
    """train.pin_cores: keep this rank's threads (those running now and, since a thread starts on its creator's
    cores, every later one: torch's, gloo's, the batch prefetcher's) on cores of its own. On two CPU cores
    data_2 trained 7-13% faster pinned, the pipelined layouts level (docs/BENCHMARKS.md; why is not measured).
    `auto` pins on a CPU with several local ranks whose threads fit the cores (one process alone is left to the
    OS). Returns what was done, for the run's log."""
    local_ranks = _local_ranks()
    if mode == "off" or (mode == "auto" and (not on_cpu or local_ranks < 2)):
        return "cores: not pinned (train.pin_cores=" + mode + ")"
    if not hasattr(os, "sched_setaffinity"):
        return "cores: not pinned (this OS sets no thread's CPU affinity)"
    allowed = sorted(os.sched_getaffinity(0))
    cores = rank_cores(allowed, int(os.environ.get("LOCAL_RANK", "0")), local_ranks, threads)
    if cores is None:
        return (f"cores: not pinned ({local_ranks} local ranks x {threads} threads do not fit the {len(allowed)} "
                f"cores this process may use)")
    keep_threads_on(cores)
    return f"cores: this rank's threads on {','.join(map(str, cores))} (train.pin_cores={mode})"


def keep_threads_on(cores) -> None:
    """Every thread of this process, those running now and (started by them) later ones, on `cores`."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:  # a thread that ended meanwhile
            pass

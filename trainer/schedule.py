"""The training step as data: per-rank instruction lists, built without a model.

One micro-step (one DeepSpeed micro-batch) on the rank at pipeline stage `stage` of `num_pp`, with
`units` micro-batches of sentences and `chunks` pieces along time:

    forward   for each unit u: encoder chunks (recv, run local encoders, send on), then decoder
              chunks (recv, run local decoders, send on). The encoder output leaves the rank before
              its decoder layers run, so the next stage starts early.
    head      after the forward of all units, on every rank at once (a collective phase):
              the last stage sends each stage its shard of the top outputs, every head replica
              runs attention + softmax + loss forward and backward, and the gradients w.r.t. the
              shards return to the last stage. In pipeline/single/data mode only the last stage
              runs the head, on all rows.
    backward  units in reverse; in each, the decoder chunks first (reverse time), then the encoder
              chunks (reverse time): the previous stage can start on a decoder gradient while this
              one still runs its encoders' backward.
    reduce    the loss all-reduce; at the accumulation boundary the head replicas' gradients
              into the owner (last stage), DeepSpeed's replica all-reduce, the optimizer step and
              the owner's broadcast of the updated head.

`replay` executes all ranks' lists abstractly and proves that every send meets a receive and every
collective is entered by every rank of its group, so a schedule that would deadlock fails a test.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Instr:
    """op: one of OPS. unit/chunk: which pipeline unit. kind: 'enc' | 'dec'. peer: stage to talk to."""

    op: str
    unit: int = -1
    chunk: int = -1
    kind: str = ""
    peer: int = -1

    def __str__(self) -> str:
        parts = [self.op]
        if self.kind:
            parts.append(self.kind)
        if self.unit >= 0:
            parts.append(f"u{self.unit}")
        if self.chunk >= 0:
            parts.append(f"c{self.chunk}")
        if self.peer >= 0:
            parts.append(f"peer {self.peer}")
        return " ".join(parts)


OPS = (
    "forward",          # run local layers (kind enc|dec) on (unit, chunk)
    "send_forward",     # activation of (kind, unit, chunk) to stage peer
    "recv_forward",
    "scatter_shard",    # last stage -> peer: its head shard of the top outputs
    "recv_shard",
    "head",             # head forward + backward on this rank's shard
    "gather_grad",      # last stage <- peer: gradient w.r.t. peer's shard
    "send_shard_grad",
    "backward",         # backward through local layers (kind, unit, chunk)
    "send_backward",    # gradient w.r.t. the input of (kind, unit, chunk) to stage peer
    "recv_backward",
    "reduce_head_grads",  # collective over the pipeline's stages, started without blocking right
                          # after the head phase: head replicas' gradients into the owner (last
                          # stage), hybrid only
    "wait_head_grads",  # local: finish it before the optimizer step
    "reduce_grads",     # collective over this stage's replicas (DeepSpeed's data-parallel reduce)
    "reduce_metrics",   # collective over all ranks
    "optimizer_step",
    "broadcast_head",   # collective over the pipeline's stages, non-blocking: the owner's updated
                        # head weights; replicas wait for it before their next head phase
)


def build_schedule(stage: int, num_pp: int, units: int, chunks: int, head_parallel: bool,
                   boundary: bool = True) -> list[Instr]:
    """The instruction list of one micro-step for the rank at `stage`."""
    prog: list[Instr] = []
    first, last = stage == 0, stage == num_pp - 1
    for u in range(units):
        for kind in ("enc", "dec"):
            for c in range(chunks):
                if not first:
                    prog.append(Instr("recv_forward", u, c, kind, stage - 1))
                prog.append(Instr("forward", u, c, kind))
                if not last:
                    prog.append(Instr("send_forward", u, c, kind, stage + 1))
    if head_parallel:
        if last:
            prog += [Instr("scatter_shard", peer=s) for s in range(num_pp - 1)]
            prog.append(Instr("head"))
            prog += [Instr("gather_grad", peer=s) for s in range(num_pp - 1)]
        else:
            prog += [Instr("recv_shard", peer=num_pp - 1), Instr("head"), Instr("send_shard_grad", peer=num_pp - 1)]
    elif last:
        prog.append(Instr("head"))
    if boundary and head_parallel:  # the head's gradients are final: start their reduction now
        prog.append(Instr("reduce_head_grads"))
    for u in reversed(range(units)):
        for kind in ("dec", "enc"):
            for c in reversed(range(chunks)):
                if not last:
                    prog.append(Instr("recv_backward", u, c, kind, stage + 1))
                prog.append(Instr("backward", u, c, kind))
                if not first:
                    prog.append(Instr("send_backward", u, c, kind, stage - 1))
    prog.append(Instr("reduce_metrics"))
    if boundary:
        if head_parallel:
            prog.append(Instr("wait_head_grads"))
        prog.append(Instr("reduce_grads"))
    prog.append(Instr("optimizer_step"))
    if boundary and head_parallel:
        prog.append(Instr("broadcast_head"))
    return prog


def format_schedule(programs: dict[int, list[Instr]]) -> str:
    """Each rank's instruction list, numbered: what `--dry-run` prints."""
    lines = []
    for rank, prog in programs.items():
        lines.append(f"rank {rank} ({len(prog)} instructions)")
        lines += [f"  {i:3d}  {ins}" for i, ins in enumerate(prog)]
    return "\n".join(lines)


_PAIRS = {"send_forward": "recv_forward", "send_backward": "recv_backward",
          "scatter_shard": "recv_shard", "send_shard_grad": "gather_grad"}
_COLLECTIVES = ("reduce_metrics", "reduce_grads", "reduce_head_grads", "broadcast_head")


def replay(programs: dict[int, list[Instr]], groups: dict[str, list[list[int]]]) -> None:
    """Run all ranks' programs abstractly: sends are buffered (non-blocking), receives block until the
    matching message (same op pair, unit, chunk, kind, in FIFO order per channel) is there, and a
    collective blocks until every rank of its group has reached it. Raises RuntimeError naming the
    stuck ranks and their next instructions on deadlock, or on a message nobody receives.

    programs: global rank -> instruction list; `peer` fields are global ranks here.
    groups: collective op -> list of rank groups (each rank in exactly one group per op).
    """
    pc = {r: 0 for r in programs}
    channels: dict[tuple, list] = {}
    waiting: dict[tuple, set] = {}

    def key_of(src: int, dst: int, send_op: str) -> tuple:
        return (src, dst, send_op)

    progress = True
    while progress:
        progress = False
        for r, prog in programs.items():
            while pc[r] < len(prog):
                ins = prog[pc[r]]
                if ins.op in _PAIRS:
                    channels.setdefault(key_of(r, ins.peer, ins.op), []).append((ins.unit, ins.chunk, ins.kind))
                elif ins.op in _PAIRS.values():
                    send_op = next(k for k, v in _PAIRS.items() if v == ins.op)
                    queue = channels.get(key_of(ins.peer, r, send_op), [])
                    if not queue:
                        break
                    got = queue.pop(0)
                    if got != (ins.unit, ins.chunk, ins.kind):
                        raise RuntimeError(f"rank {r} {ins} received {got} from rank {ins.peer}: order mismatch")
                elif ins.op in _COLLECTIVES:
                    group = next(g for g in groups[ins.op] if r in g)
                    arrived = waiting.setdefault((ins.op, tuple(group), _count(prog, pc[r], ins.op)), set())
                    arrived.add(r)
                    if len(arrived) < len(group):
                        break
                pc[r] += 1
                progress = True
    stuck = {r: str(programs[r][pc[r]]) for r in programs if pc[r] < len(programs[r])}
    if stuck:
        raise RuntimeError(f"deadlock: ranks stuck at {stuck}")
    leftovers = {k: v for k, v in channels.items() if v}
    if leftovers:
        raise RuntimeError(f"messages never received: {leftovers}")


def _count(prog: list[Instr], upto: int, op: str) -> int:
    """How many `op` instructions precede position `upto` (identifies the n-th collective)."""
    return sum(1 for ins in prog[:upto] if ins.op == op)


def global_programs(num_pp: int, num_dp: int, units: int, chunks: int, head_parallel: bool,
                    rank_of=None) -> dict[int, list[Instr]]:
    """All ranks' programs with `peer` rewritten from stage ids to global ranks (grid order:
    rank = stage * num_dp + replica, as DeepSpeed's PipeDataParallelTopology numbers them)."""
    rank_of = rank_of or (lambda stage, replica: stage * num_dp + replica)
    out = {}
    for stage in range(num_pp):
        for replica in range(num_dp):
            prog = build_schedule(stage, num_pp, units, chunks, head_parallel)
            out[rank_of(stage, replica)] = [
                Instr(i.op, i.unit, i.chunk, i.kind, rank_of(i.peer, replica)) if i.peer >= 0 else i for i in prog]
    return out

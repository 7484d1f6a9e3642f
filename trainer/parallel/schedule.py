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
    reduce    at the accumulation boundary the head replicas' gradients into the owner (last stage),
              DeepSpeed's replica all-reduce, the optimizer step and the owner's broadcast of the
              updated head; then the loss sums' all-reduce.

`trainer.parallel.walk.replay` executes all ranks' lists abstractly and proves that every send meets a
receive and every collective is entered by every rank of its group, on gloo and on NCCL, so a schedule
that would deadlock fails a test.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Op:
    """An instruction type. `kind` says how it meets other ranks, which is all the replay, the
    interpreter's timing and the timeline need to know:

        compute     local work (kernels, the optimizer)
        send        point-to-point, non-blocking; `pairs` names the receive that takes it
        recv        point-to-point, blocks until the matching send arrives
        collective  entered by every rank of `group` (a name of `layout.group_members`), in order;
                    `asynchronous` ones are started without waiting
        wait        local: finishes what it `completes` (an async collective, or every pending send)

    These rules are applied in one place, `trainer.parallel.walk` (the replay and the simulator), and
    the interpreter keeps an async op's handle until the op that completes it.
    """

    name: str
    kind: str
    group: str = ""
    pairs: str = ""
    eval: bool = False  # part of the forward-only program (dev loss)
    asynchronous: bool = False  # a collective started without waiting; a later wait (or the next step) ends it
    completes: str = ""  # a wait: the async op it finishes ("send": every pending send)
    doc: str = ""


KINDS = ("compute", "send", "recv", "collective", "wait")
# where an instruction's time goes on a timeline (trainer.observe.timeline): computing, blocked on a peer's
# message (pipeline bubbles + transfer), or communicating (sends, collectives, waits for them)
KIND_CATEGORY = {"compute": "busy", "recv": "waiting", "send": "communicating", "collective": "communicating",
                 "wait": "communicating"}
OPS: dict[str, Op] = {op.name: op for op in (
    Op("forward", "compute", eval=True, doc="run local layers (kind enc|dec) on (unit, chunk)"),
    Op("send_forward", "send", pairs="recv_forward", eval=True, doc="activation of (kind, unit, chunk) to stage peer"),
    Op("recv_forward", "recv", pairs="send_forward", eval=True),
    Op("scatter_shard", "send", pairs="recv_shard", eval=True,
       doc="last stage -> peer: its head shard of the top outputs"),
    Op("recv_shard", "recv", pairs="scatter_shard", eval=True),
    Op("head", "compute", eval=True, doc="head forward (+ backward when training) on this rank's shard"),
    Op("send_shard_grad", "send", pairs="gather_grad", doc="gradient w.r.t. this rank's shard to the last stage"),
    Op("gather_grad", "recv", pairs="send_shard_grad"),
    Op("backward", "compute", doc="backward through local layers (kind, unit, chunk)"),
    Op("weight_grads", "compute", doc="the LSTM weight gradients the backward deferred (parallel_layout."
                                      "defer_weight_grads), after this rank's last backward"),
    Op("head_weight_grads", "compute", doc="the head projection's weight gradient its backward deferred (parallel_"
                                           "layout.defer_head_weight_grads): where the rank would wait"),
    Op("send_backward", "send", pairs="recv_backward",
       doc="gradient w.r.t. the input of (kind, unit, chunk) to stage peer"),
    Op("recv_backward", "recv", pairs="send_backward"),
    Op("reduce_head_grads", "collective", group="pipe", asynchronous=True,
       doc="started without blocking right after the head phase: head replicas' gradients summed into "
           "the owner (last stage); hybrid only"),
    Op("wait_head_grads", "wait", completes="reduce_head_grads", doc="finish reduce_head_grads before the optimizer step"),
    Op("reduce_metrics", "collective", group="world", eval=True,
       doc="loss sums of the accumulation window (training; at its boundary) or micro-batch (evaluation)"),
    Op("reduce_grads", "collective", group="data", doc="DeepSpeed's all-reduce over this stage's replicas"),
    Op("optimizer_step", "compute"),
    Op("broadcast_head", "collective", group="pipe", asynchronous=True,
       doc="non-blocking: the owner's updated head weights; replicas wait for it before their next head"),
    Op("flush_sends", "wait", eval=True, completes="send",
       doc="wait until every non-blocking send of the micro-step is done"),
)}


@dataclass(frozen=True)
class Instr:
    """op: a name in OPS. unit/chunk: which pipeline unit. kind: 'enc' | 'dec'. peer: the stage to talk
    to (point-to-point), or the root stage of a rooted collective (reduce into it, broadcast from it)."""

    op: str
    unit: int = -1
    chunk: int = -1
    kind: str = ""
    peer: int = -1

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"unknown instruction {self.op!r}")

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


HEAD_SCHEDULES = ("after_forward", "per_unit")


def head_owner(unit: int, num_pp: int) -> int:
    """per_unit: the stage that runs the head of `unit`."""
    return unit % num_pp


def build_schedule(stage: int, num_pp: int, units: int, chunks: int, head_parallel: bool,
                   boundary: bool = True, head_schedule: str = "after_forward",
                   defer_weight_grads: bool = False, head_blocks: list | None = None,
                   defer_head_weight_grads: bool = False) -> list[Instr]:
    """The instruction list of one micro-step for the rank at `stage`.

    head_schedule (hybrid only):
        after_forward  after the forward of all units, every stage runs its shard of the whole replica
                       (a phase all stages enter together)
        per_unit       the head of unit u runs on stage u % num_pp, on the whole unit: the last stage
                       runs its own units' heads between its forwards and starts their backward
                       without waiting for any other stage; it sends the other units' top outputs to
                       their stages once it has received its last forward input (not earlier: on
                       NCCL a send blocks until received, and the previous stage, still sending its
                       forwards, would be sending at the same time), and those run their heads
                       while the last stage is still busy

    head_blocks (hybrid, head_split=time; one unit): [start, stop) of the decoder time chunks whose head
                   each stage runs, on every row. The last stage sends each other stage its block (and
                   the encoder's top outputs) once its last forward input is in, runs its own block's
                   head and starts its backward at once; it takes stage s's gradients just before its
                   backward reaches s's block, and stage s sends them right after receiving the
                   backward of the chunk after its block (a pair's messages keep one order).

    defer_weight_grads: on every stage but the first, each backward computes only the gradient the stage
    below waits for; the weight gradients of all of them follow the rank's last backward
    (`weight_grads`), in what would otherwise be the drain bubble before the optimizer step. The first
    stage hands nothing on, so it computes them at once: deferred, they would only wait for its
    backward's receives and then run on the step's critical path.

    defer_head_weight_grads: a head's backward computes only the gradient the LSTM stages wait for, and the
    projection's weight gradient follows (`head_weight_grads`) where the rank would otherwise wait: a stage
    before the last that ran a head (hybrid), just before its first receive of a backward (while the last stage
    runs its backward), and then starts the head gradients' reduction; the last stage, after its last backward
    (while the stages before it run theirs), but only where no head reduction is waiting for it (pipeline: one
    head). In the hybrid the last stage's reduction starts right after its head phase, before any backward
    message, as on every other stage: on NCCL a rank's collectives and its sends keep one order, so starting it
    after the backward there would make the earlier stages' receives wait on a collective they are already in.
    """
    b = _StageProgram(stage, num_pp, units, chunks, head_parallel, boundary,
                      per_unit=head_parallel and head_schedule == "per_unit",
                      blocks=head_blocks if head_parallel else None, defer_head=defer_head_weight_grads)
    b.forward()
    b.head_phase()
    b.backward()
    if defer_weight_grads and stage > 0:
        b.add("weight_grads")
    if b.defer_head and b.last and not head_parallel:
        b.head_grads_final()
    b.step()
    return b.prog


@dataclass
class _StageProgram:
    """Builds one stage's program in four parts (forward, head phase, backward, the step)."""

    stage: int
    num_pp: int
    units: int
    chunks: int
    head_parallel: bool
    boundary: bool
    per_unit: bool
    blocks: list | None = None  # head_split=time: each stage's block of decoder time chunks
    defer_head: bool = False  # the head projection's weight gradient where the rank would wait
    head_dw_due: bool = False  # ... still to be placed, before this stage's first receive of a backward
    prog: list = field(default_factory=list)

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.num_pp - 1

    def add(self, op: str, unit: int = -1, chunk: int = -1, kind: str = "", peer: int = -1) -> None:
        self.prog.append(Instr(op, unit, chunk, kind, peer))

    def forward(self) -> None:
        """For each unit: encoder chunks (recv, run local encoders, send on), then decoder chunks. per_unit:
        the last stage runs its own units' heads in between, and sends the others' top outputs once its
        last forward input is in."""
        stage, last = self.stage, self.last
        for u in range(self.units):
            for kind in ("enc", "dec"):
                for c in range(self.chunks):
                    if not self.first:
                        self.add("recv_forward", u, c, kind, stage - 1)
                    if self.blocks and last and (kind, c) == ("dec", self.chunks - 1):
                        for s in range(self.num_pp - 1):  # every forward input is in: the blocks can go
                            self.add("scatter_shard", peer=s)
                    self.add("forward", u, c, kind)
                    if not last:
                        self.add("send_forward", u, c, kind, stage + 1)
            if self.per_unit and last:
                if u == self.units - 1:  # every forward input is in: the other stages' units can go
                    for v in range(self.units):
                        if head_owner(v, self.num_pp) != stage:
                            self.add("scatter_shard", unit=v, peer=head_owner(v, self.num_pp))
                if head_owner(u, self.num_pp) == stage:
                    self.add("head", unit=u)

    def head_phase(self) -> None:
        """After the forward: the head (its shard, or the units it owns) and the start of the head
        gradients' reduction into the last stage."""
        owner = self.num_pp - 1
        if self.blocks:
            if not self.last:
                self.add("recv_shard", peer=owner)
            self.add("head")
        elif self.per_unit:
            if not self.last:
                for u in range(self.stage, self.units, self.num_pp):
                    self.add("recv_shard", unit=u, peer=owner)
                    self.add("head", unit=u)
        elif self.head_parallel:
            if self.last:
                for s in range(self.num_pp - 1):
                    self.add("scatter_shard", peer=s)
                self.add("head")
                for s in range(self.num_pp - 1):
                    self.add("gather_grad", peer=s)
            else:
                self.add("recv_shard", peer=owner)
                self.add("head")
                self.add("send_shard_grad", peer=owner)
        elif self.last:
            self.add("head")
        if not self.defer_head or (self.last and self.head_parallel):
            self.start_head_reduce()
        elif not self.last:  # a stage before the last that ran a head: its deferred gradient before it waits
            self.head_dw_due = any(i.op == "head" for i in self.prog)

    def start_head_reduce(self) -> None:
        """The head's gradients are final: start their reduction into the last stage (hybrid, at the boundary)."""
        if self.boundary and self.head_parallel:
            self.add("reduce_head_grads", peer=self.num_pp - 1)

    def head_grads_final(self) -> None:
        """defer_head_weight_grads: the projection's weight gradient, then the head gradients' reduction."""
        self.add("head_weight_grads")
        self.start_head_reduce()
        self.head_dw_due = False



    def backward(self) -> None:
        """Units in reverse; in each, the decoder chunks first (reverse time), then the encoder chunks.
        per_unit: unit u's head gradients go back to the last stage when it needs them, just before its
        backward of u, which comes right after it sent the backward of u + 1 on: its owner sends them
        right after receiving that (a pair's messages keep one order on both sides, as NCCL needs)."""
        stage, owner_stage = self.stage, self.num_pp - 1
        mine = self.per_unit and not self.last
        if mine and head_owner(self.units - 1, self.num_pp) == stage:
            self.add("send_shard_grad", unit=self.units - 1, peer=owner_stage)
        for u in reversed(range(self.units)):
            if self.per_unit and self.last and head_owner(u, self.num_pp) != stage:
                self.add("gather_grad", unit=u, peer=head_owner(u, self.num_pp))
            for kind in ("dec", "enc"):
                for c in reversed(range(self.chunks)):
                    if not self.last:
                        if self.head_dw_due:  # before the first wait for the last stage's backward
                            self.head_grads_final()
                        self.add("recv_backward", u, c, kind, stage + 1)
                        if mine and (kind, c) == ("enc", 0) and u > 0 and head_owner(u - 1, self.num_pp) == stage:
                            self.add("send_shard_grad", unit=u - 1, peer=owner_stage)
                        if self.blocks and kind == "dec" and c == self.blocks[stage][1]:
                            self.add("send_shard_grad", peer=owner_stage)
                    elif self.blocks and kind == "dec":
                        for s in range(self.num_pp - 1):  # stage s's gradients, before its block's backward
                            if self.blocks[s][1] - 1 == c:
                                self.add("gather_grad", peer=s)
                    self.add("backward", u, c, kind)
                    if not self.first:
                        self.add("send_backward", u, c, kind, stage - 1)

    def step(self) -> None:
        """At the accumulation boundary: the reductions, the optimizer step, the owner's broadcast of the
        updated head, and the window's loss sums (read back with the step's gradient norm; summed last,
        so that no rank waits for the slowest one's backward before its own optimizer step)."""
        if self.boundary:
            if self.head_parallel:
                self.add("wait_head_grads")
            self.add("reduce_grads")
        self.add("optimizer_step")
        if self.boundary and self.head_parallel:
            self.add("broadcast_head", peer=self.num_pp - 1)
        if self.boundary:
            self.add("reduce_metrics")
        self.add("flush_sends")


def eval_program(program: list[Instr]) -> list[Instr]:
    """The forward-only part of a training program at an accumulation boundary (dev loss): no
    backward, no update; the loss sums of every micro-batch."""
    return [i for i in program if OPS[i.op].eval]


def rank_programs(spec, stage: int) -> dict[bool, list[Instr]]:
    """The training program of the rank at `stage`, at and between accumulation boundaries."""
    from trainer.parallel.layout import head_blocks, time_split

    return {b: build_schedule(stage, spec.num_pp, spec.micro_batches, spec.time_chunks, spec.head_parallel,
                              boundary=b, head_schedule=spec.head_schedule,
                              defer_weight_grads=spec.defer_weight_grads,
                              head_blocks=head_blocks(spec) if time_split(spec) else None,
                              defer_head_weight_grads=spec.defer_head_weight_grads) for b in (True, False)}


def format_schedule(programs: dict[int, list[Instr]]) -> str:
    """Each rank's instruction list, numbered: what `--dry-run` prints."""
    lines = []
    for rank, prog in programs.items():
        lines.append(f"rank {rank} ({len(prog)} instructions)")
        lines += [f"  {i:3d}  {ins}" for i, ins in enumerate(prog)]
    return "\n".join(lines)


def global_programs(spec, boundary: bool = True, forward_only: bool = False) -> dict[int, list[Instr]]:
    """Every rank's program for the layout `spec`, with `peer` rewritten from stage ids to global
    ranks (`layout.rank_of`); `forward_only`: the evaluation programs."""
    from trainer.parallel.layout import rank_of

    out = {}
    for stage in range(spec.num_pp):
        prog = eval_program(rank_programs(spec, stage)[True]) if forward_only else rank_programs(spec, stage)[boundary]
        for replica in range(spec.num_dp):
            out[rank_of(spec, stage, replica)] = [
                Instr(i.op, i.unit, i.chunk, i.kind, rank_of(spec, i.peer, replica)) if i.peer >= 0 else i
                for i in prog]
    return out

"""The one walker of every rank's program: the rules of how instructions meet (`schedule.OPS`), applied
once. The replay (a deadlock proof: `schedule.replay`) and the simulator (what a schedule would take:
`trainer.parallel.simulate`, the planner) are this walk without and with costs; the interpreter executes
the same rules on each rank (`OPS[op].asynchronous` / `completes`).

Rules, by `Op.kind`:
    compute     local work; takes `cost(rank, ins)`
    send        posts a message on the channel of its rank pair and direction. gloo: buffered, the sender
                goes on; nccl: the sender waits until the message is received (an NCCL send of more
                than its buffer waits for the receiver's kernel)
    recv        takes the next message of its channel, which must be the one it expects (a pair's
                messages arrive in order, whatever the instruction); waits until it is there
    collective  waits until every rank of its group has reached it (the n-th one of its name, with the
                same root); `asynchronous` ones are started without waiting, and finished by the wait
                that `completes` them (or, not awaited in this program, at the end or the next step)
    wait        finishes what it `completes`: an async collective, or every pending send ("send")

Costs (seconds), when given: `cost(rank, ins)` the instruction's own time (a send's posting, a receive's
copy-out, a collective's duration once the last rank is there); `transfer(rank, ins)` a message's time on
the wire. Refinements the planner uses, off by default: `inner_sync(rank, ins)` -> (group, seconds before
the meeting, seconds of it) for a compute instruction that meets its group partway (DeepSpeed's step
all-reduces the gradient norm before it updates); `post(rank, ins)` the seconds an asynchronous collective
takes from its caller's own core (on a CPU rank of one thread, gloo's thread moves and sums the bytes on the
core the caller computes on: charged when it is started); `async_at_end=False`: an async collective nobody waits
for here does not hold the rank's end (reported as `RankTime.async_done`); `compute_scale` {(rank, index):
factor} multiplies a compute instruction's cost (ranks sharing a host, `simulate.simulate_shared`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from trainer.parallel.schedule import OPS, Instr

MODES = ("gloo", "nccl")


@dataclass
class RankTime:
    """Where one rank's time went, in seconds."""

    end: float = 0.0
    busy: float = 0.0
    waiting: float = 0.0
    communicating: float = 0.0
    spans: list = field(default_factory=list)  # (op, start, end) like trainer.observe.timeline
    async_done: float = 0.0  # when this rank's last async collective completes
    detail: list = field(default_factory=list)  # keep_spans: (index in program, category, start, end) pieces


def _zero(rank: int, ins: Instr) -> float:
    return 0.0


class _Walk:
    """The state of one walk: clocks, program counters, channels, meetings."""

    def __init__(self, programs, groups, mode, cost, transfer, start, keep_spans, inner_sync, compute_scale,
                 post=None):
        if mode not in MODES:
            raise ValueError(f"walk mode {mode!r}: one of {MODES}")
        self.programs, self.groups, self.mode = programs, groups, mode
        self.cost, self.transfer, self.post = cost or _zero, transfer or _zero, post or _zero
        self.keep_spans, self.inner_sync, self.scale = keep_spans, inner_sync, compute_scale or {}
        self.clock = {r: (start or {}).get(r, 0.0) for r in programs}
        self.pc = {r: 0 for r in programs}
        self.out = {r: RankTime() for r in programs}
        self.channels: dict[tuple, list] = {}  # (src, dst) -> [message dicts], oldest first
        self.posted: dict[int, dict] = {}  # rank -> the message its unfinished send posted
        self.pending_sends = {r: 0.0 for r in programs}  # when the rank's last send is delivered
        self.arrivals: dict[tuple, dict] = {}  # meeting key -> {rank: arrival time}
        self.done_at: dict[tuple, float] = {}  # meeting key -> completion time
        self.async_done = {r: {} for r in programs}  # rank -> {async op: completion time}

    def account(self, r, ins, t0, t1, category, span=True):
        rt = self.out[r]
        setattr(rt, category, getattr(rt, category) + t1 - t0)
        if self.keep_spans:
            rt.detail.append((self.pc[r], category, t0, t1))
            if span:
                rt.spans.append((ins.op, t0, t1))

    def group_of(self, r: int, ins: Instr, name: str) -> list:
        group = next((g for g in self.groups[name] if r in g), None)
        if group is None:
            raise RuntimeError(f"rank {r} {ins}: not a member of any {name!r} group")
        if ins.peer >= 0 and ins.peer not in group:
            raise RuntimeError(f"rank {r} {ins}: root rank {ins.peer} is not in its {name!r} group {group}")
        return group

    def meet(self, r, key, group, t, duration):
        """Arrive at a meeting of `group` at t; the time it is over, or None while others are missing."""
        self.arrivals.setdefault(key, {})[r] = t
        if len(self.arrivals[key]) < len(group):
            return None
        if key not in self.done_at:
            self.done_at[key] = max(self.arrivals[key].values()) + duration
        return self.done_at[key]

    def nth(self, r: int, op: str) -> int:
        """How many `op` instructions precede the current one of rank r (identifies the n-th meeting)."""
        return sum(1 for i in self.programs[r][:self.pc[r]] if i.op == op)

    # ---- one instruction; the time it ends, or None while it waits for another rank ----
    def compute(self, r, ins, t):
        total = self.cost(r, ins) * self.scale.get((r, self.pc[r]), 1.0)
        sync = self.inner_sync(r, ins) if self.inner_sync is not None else None
        if sync is None:
            self.account(r, ins, t, t + total, "busy")
            return t + total
        name, before, duration = sync
        group = self.group_of(r, ins, name)
        done = self.meet(r, (ins.op, "inner", tuple(group), self.nth(r, ins.op)), group, t + before, duration)
        if done is None:
            return None
        t1 = done + max(0.0, total - before)
        self.account(r, ins, t, t + before, "busy", span=False)
        self.account(r, ins, t + before, done, "communicating", span=False)
        self.account(r, ins, done, t1, "busy", span=False)
        if self.keep_spans:
            self.out[r].spans.append((ins.op, t, t1))
        return t1

    def send(self, r, ins, t):
        message = self.posted.get(r)
        if message is None:
            t1 = t + self.cost(r, ins)
            message = {"what": (OPS[ins.op].name, ins.unit, ins.chunk, ins.kind), "posted": t1,
                       "arrive": t1 + self.transfer(r, ins), "taken": None, "transfer": self.transfer(r, ins)}
            self.channels.setdefault((r, ins.peer), []).append(message)
            self.posted[r] = message
            self.account(r, ins, t, t1, "communicating")
            if self.mode == "gloo":
                self.pending_sends[r] = max(self.pending_sends[r], message["arrive"])
        if self.mode == "nccl":
            if message["taken"] is None:
                return None  # not received yet
            end = message["taken"]
            self.account(r, ins, message["posted"], end, "communicating", span=False)
        else:
            end = message["posted"]
        del self.posted[r]
        return end

    def recv(self, r, ins, t):
        queue = self.channels.get((ins.peer, r), [])
        if not queue:
            return None
        message = queue[0]
        if message["what"] != (OPS[ins.op].pairs, ins.unit, ins.chunk, ins.kind):
            got = message["what"]
            raise RuntimeError(f"rank {r} {ins} would receive {got[0]} u{got[1]} c{got[2]} {got[3]} from rank "
                               f"{ins.peer}: messages of a pair arrive in order")
        queue.pop(0)
        # nccl: the transfer starts once both sides are there; gloo: it started when it was sent
        arrive = max(t, message["posted"]) + message["transfer"] if self.mode == "nccl" else message["arrive"]
        message["taken"] = arrive
        ready = max(t, arrive)
        self.account(r, ins, t, ready, "waiting")
        t1 = ready + self.cost(r, ins)
        self.account(r, ins, ready, t1, "communicating")
        return t1

    def collective(self, r, ins, t):
        op = OPS[ins.op]
        group = self.group_of(r, ins, op.group)
        key = (ins.op, tuple(group), ins.peer, self.nth(r, ins.op))
        posted = t + self.post(r, ins) if op.asynchronous else t
        if self.meet(r, key, group, posted, self.cost(r, ins)) is None:
            return None
        if op.asynchronous:
            done = self.async_done[r]
            done[ins.op] = max(done.get(ins.op, 0.0), self.done_at[key])
            if posted > t:
                self.account(r, ins, t, posted, "communicating")
            return posted
        self.account(r, ins, t, self.done_at[key], "communicating")
        return self.done_at[key]

    def wait(self, r, ins, t):
        what = OPS[ins.op].completes
        until = self.pending_sends[r] if what == "send" else self.async_done[r].get(what, 0.0)
        t1 = max(t, until)
        self.account(r, ins, t, t1, "communicating")
        return t1

    def run(self) -> None:
        step = {"compute": self.compute, "send": self.send, "recv": self.recv, "collective": self.collective,
                "wait": self.wait}
        progress = True
        while progress:
            progress = False
            for r, prog in self.programs.items():
                while self.pc[r] < len(prog):
                    ins = prog[self.pc[r]]
                    t1 = step[OPS[ins.op].kind](r, ins, self.clock[r])
                    if t1 is None:
                        break
                    self.clock[r] = t1
                    self.pc[r] += 1
                    progress = True
        stuck = {r: str(self.programs[r][self.pc[r]]) for r in self.programs if self.pc[r] < len(self.programs[r])}
        if stuck:
            raise RuntimeError(f"deadlock ({self.mode}): ranks stuck at {stuck}")
        leftovers = {k: [m["what"] for m in v] for k, v in self.channels.items() if v}
        if leftovers:
            raise RuntimeError(f"messages never received: {leftovers}")


def walk(programs: dict[int, list[Instr]], groups: dict[str, list[list[int]]], *, mode: str = "gloo", cost=None,
         transfer=None, start: dict[int, float] | None = None, keep_spans: bool = False, inner_sync=None,
         async_at_end: bool = True, compute_scale: dict | None = None, post=None) -> dict[int, RankTime]:
    """Walk every rank's program under the rules above: rank -> RankTime (all zero without costs).
    Raises RuntimeError naming the stuck ranks on deadlock, a message received out of order, a message
    nobody receives, or a collective outside its group.

    programs: global rank -> instruction list, `peer` fields global ranks; groups: `layout.group_members`."""
    w = _Walk(programs, groups, mode, cost, transfer, start, keep_spans, inner_sync, compute_scale, post)
    w.run()
    for r, rt in w.out.items():
        rt.async_done = max(w.async_done[r].values(), default=0.0)
        rt.end = max(w.clock[r], rt.async_done) if async_at_end else w.clock[r]
    return w.out


def replay(programs: dict[int, list[Instr]], groups: dict[str, list[list[int]]], mode: str = "gloo") -> None:
    """The deadlock proof: walk every rank's program without costs (raises RuntimeError as `walk`).

    mode  gloo  sends are buffered: a send never blocks (gloo copies the message out)
          nccl  sends block until received: a pair's sends and receives run in order on one stream, so
                two ranks that send to each other at once hang"""
    walk(programs, groups, mode=mode)

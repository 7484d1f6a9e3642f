"""Simulated time for a schedule: every rank's instruction list run under the rules of the replay
(sends are buffered, receives wait for their message, a collective waits for every rank of its
group), with a cost per instruction. What a schedule would take, per rank busy / waiting /
communicating, without running a model: used to compare schedules and by the planner
(launch/plan.py) with the costs of a device profile.

Costs (seconds), from `cost(rank, ins)`:
    compute       the instruction's duration on that rank
    send          the sender's own cost (posting it); the message arrives after `transfer(rank, ins)`
    recv          the receiver's cost once the message is there (copy-out)
    collective    the duration once the last rank of the group has arrived; reduce_head_grads and
                  broadcast_head are started without blocking and finished by a later wait
    wait          only waits (for the async collective, or every pending send)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from trainer.parallel.schedule import OPS, Instr

ASYNC = {"reduce_head_grads": "wait_head_grads", "broadcast_head": None}


@dataclass
class RankTime:
    """Where one rank's time went, in seconds."""

    end: float = 0.0
    busy: float = 0.0
    waiting: float = 0.0
    communicating: float = 0.0
    spans: list = field(default_factory=list)  # (op, start, end) like trainer.timeline


def simulate(programs: dict[int, list[Instr]], groups: dict[str, list[list[int]]], cost, transfer,
             start: dict[int, float] | None = None, keep_spans: bool = False) -> dict[int, RankTime]:
    """Simulated time of one micro-step: rank -> RankTime. `cost(rank, ins)` and `transfer(rank, ins)`
    give seconds. Raises RuntimeError (as the replay does) if the schedule deadlocks."""
    clock = {r: (start or {}).get(r, 0.0) for r in programs}
    pc = {r: 0 for r in programs}
    out = {r: RankTime() for r in programs}
    channels: dict[tuple, list] = {}  # (src, dst, send op) -> [(unit, chunk, kind, arrival)]
    pending_sends = {r: 0.0 for r in programs}  # when the rank's last send is delivered
    arrivals: dict[tuple, dict] = {}  # collective key -> {rank: arrival time}
    done_at: dict[tuple, float] = {}  # collective key -> completion time
    async_done: dict[int, float] = {r: 0.0 for r in programs}  # per rank: its pending async collective

    def account(r, ins, t0, t1, category):
        rt = out[r]
        setattr(rt, category, getattr(rt, category) + t1 - t0)
        if keep_spans:
            rt.spans.append((ins.op, t0, t1))

    progress = True
    while progress:
        progress = False
        for r, prog in programs.items():
            while pc[r] < len(prog):
                ins = prog[pc[r]]
                op = OPS[ins.op]
                t = clock[r]
                if op.kind == "compute":
                    t1 = t + cost(r, ins)
                    account(r, ins, t, t1, "busy")
                elif op.kind == "send":
                    t1 = t + cost(r, ins)
                    arrive = t1 + transfer(r, ins)
                    channels.setdefault((r, ins.peer, op.name), []).append((ins.unit, ins.chunk, ins.kind, arrive))
                    pending_sends[r] = max(pending_sends[r], arrive)
                    account(r, ins, t, t1, "communicating")
                elif op.kind == "recv":
                    queue = channels.get((ins.peer, r, op.pairs), [])
                    if not queue:
                        break
                    unit, chunk, kind, arrive = queue.pop(0)
                    if (unit, chunk, kind) != (ins.unit, ins.chunk, ins.kind):
                        raise RuntimeError(f"rank {r} {ins} received {(unit, chunk, kind)}: order mismatch")
                    ready = max(t, arrive)
                    account(r, ins, t, ready, "waiting")
                    t1 = ready + cost(r, ins)
                    account(r, ins, ready, t1, "communicating")
                elif op.kind == "collective":
                    group = next(g for g in groups[op.group] if r in g)
                    n = sum(1 for i in prog[:pc[r]] if i.op == ins.op)
                    key = (ins.op, tuple(group), n)
                    arrivals.setdefault(key, {})[r] = t
                    if len(arrivals[key]) < len(group):
                        break
                    if key not in done_at:
                        done_at[key] = max(arrivals[key].values()) + cost(r, ins)
                    if ins.op in ASYNC:
                        async_done[r] = max(async_done[r], done_at[key])
                        t1 = t
                    else:
                        t1 = done_at[key]
                        account(r, ins, t, t1, "communicating")
                else:  # wait
                    until = pending_sends[r] if ins.op == "flush_sends" else async_done[r]
                    t1 = max(t, until)
                    account(r, ins, t, t1, "communicating")
                clock[r] = t1
                pc[r] += 1
                progress = True
    stuck = {r: str(programs[r][pc[r]]) for r in programs if pc[r] < len(programs[r])}
    if stuck:
        raise RuntimeError(f"deadlock: ranks stuck at {stuck}")
    for r in programs:
        out[r].end = max(clock[r], async_done[r])
    return out

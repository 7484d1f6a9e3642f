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

Two refinements the planner (trainer.planner) uses, both off by default:
    inner_sync    a compute instruction that meets its group partway through (DeepSpeed's optimizer
                  step all-reduces the gradient norm over the pipeline before it updates): it runs
                  `before` seconds, waits for every rank of the group, then the rest of its cost
    async_at_end  False: an async collective nobody waits for in this program (the head broadcast,
                  awaited by the next step's head) does not hold the rank's end; its completion is
                  reported as `RankTime.async_done` for the caller to carry into the next step
`simulate_shared` adds ranks that share a host's cores and memory: a compute instruction slows down
by a factor while other ranks on its host compute at the same time (found by iterating to a fixed point).
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
    async_done: float = 0.0  # when this rank's last async collective completes
    detail: list = field(default_factory=list)  # keep_spans: (index in program, category, start, end) pieces


def simulate(programs: dict[int, list[Instr]], groups: dict[str, list[list[int]]], cost, transfer,
             start: dict[int, float] | None = None, keep_spans: bool = False, inner_sync=None,
             async_at_end: bool = True, compute_scale: dict | None = None) -> dict[int, RankTime]:
    """Simulated time of one micro-step: rank -> RankTime. `cost(rank, ins)` and `transfer(rank, ins)`
    give seconds. `inner_sync(rank, ins)`: None, or (group name, seconds before the meeting, seconds
    the meeting takes once all are there) for a compute instruction that meets its group partway.
    `compute_scale`: {(rank, index in its program): factor} multiplies that compute instruction's cost.
    Raises RuntimeError (as the replay does) if the schedule deadlocks."""
    clock = {r: (start or {}).get(r, 0.0) for r in programs}
    pc = {r: 0 for r in programs}
    out = {r: RankTime() for r in programs}
    channels: dict[tuple, list] = {}  # (src, dst, send op) -> [(unit, chunk, kind, arrival)]
    pending_sends = {r: 0.0 for r in programs}  # when the rank's last send is delivered
    arrivals: dict[tuple, dict] = {}  # collective key -> {rank: arrival time}
    done_at: dict[tuple, float] = {}  # collective key -> completion time
    async_done: dict[int, float] = {r: 0.0 for r in programs}  # per rank: its pending async collective
    scale = compute_scale or {}

    def account(r, ins, t0, t1, category, span=True):
        rt = out[r]
        setattr(rt, category, getattr(rt, category) + t1 - t0)
        if keep_spans:
            rt.detail.append((pc[r], category, t0, t1))
            if span:
                rt.spans.append((ins.op, t0, t1))

    def meet(r, key, group, t, duration):
        """Arrive at a meeting of `group` at t; the time it is over, or None while others are missing."""
        arrivals.setdefault(key, {})[r] = t
        if len(arrivals[key]) < len(group):
            return None
        if key not in done_at:
            done_at[key] = max(arrivals[key].values()) + duration
        return done_at[key]

    progress = True
    while progress:
        progress = False
        for r, prog in programs.items():
            while pc[r] < len(prog):
                ins = prog[pc[r]]
                op = OPS[ins.op]
                t = clock[r]
                sync = inner_sync(r, ins) if inner_sync is not None and op.kind == "compute" else None
                if sync is not None:
                    name, before, duration = sync
                    group = next(g for g in groups[name] if r in g)
                    n = sum(1 for i in prog[:pc[r]] if i.op == ins.op)
                    total = cost(r, ins) * scale.get((r, pc[r]), 1.0)
                    done = meet(r, (ins.op, "inner", tuple(group), n), group, t + before, duration)
                    if done is None:
                        break
                    t1 = done + max(0.0, total - before)
                    account(r, ins, t, t + before, "busy", span=False)
                    account(r, ins, t + before, done, "communicating", span=False)
                    account(r, ins, done, t1, "busy", span=False)
                    if keep_spans:
                        out[r].spans.append((ins.op, t, t1))
                elif op.kind == "compute":
                    t1 = t + cost(r, ins) * scale.get((r, pc[r]), 1.0)
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
                    if meet(r, key, group, t, cost(r, ins)) is None:
                        break
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
        out[r].async_done = async_done[r]
        out[r].end = max(clock[r], async_done[r]) if async_at_end else clock[r]
    return out


def _overlap(pieces: list, others: list) -> float:
    """Total length of `pieces` ((t0, t1), sorted) covered by the union of `others` (sorted)."""
    merged: list = []
    for a, b in others:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    total, j = 0.0, 0
    for a, b in pieces:
        while j < len(merged) and merged[j][1] <= a:
            j += 1
        k = j
        while k < len(merged) and merged[k][0] < b:
            total += min(b, merged[k][1]) - max(a, merged[k][0])
            k += 1
    return total


def simulate_shared(programs: dict[int, list[Instr]], groups: dict[str, list[list[int]]], cost, transfer,
                    host_of: dict[int, str], slowdown, iterations: int = 12, tolerance: float = 1e-3,
                    **kwargs) -> dict[int, RankTime]:
    """`simulate` for ranks that share a host (cores, caches, memory bandwidth): a compute instruction
    of rank r runs `slowdown(r, ins)` (>= 1) times slower while another rank of its host computes, and
    in proportion to the part of it that overlaps with their compute. The overlaps depend on the
    durations, so this iterates (damped) until no factor moves by more than `tolerance`."""
    scale: dict = {}
    factors = {(r, i): slowdown(r, ins) for r, prog in programs.items() for i, ins in enumerate(prog)
               if OPS[ins.op].kind == "compute"}
    kwargs = {**kwargs, "keep_spans": True}
    for _ in range(max(1, iterations)):
        result = simulate(programs, groups, cost, transfer, compute_scale=scale, **kwargs)
        busy = {r: [(i, t0, t1) for i, cat, t0, t1 in rt.detail if cat == "busy" and t1 > t0]
                for r, rt in result.items()}
        moved, new = 0.0, {}
        for r, pieces in busy.items():
            others = sorted((t0, t1) for q, p in busy.items() if q != r and host_of.get(q) == host_of.get(r)
                            for _, t0, t1 in p)
            by_index: dict = {}
            for i, t0, t1 in pieces:
                by_index.setdefault(i, []).append((t0, t1))
            for i, spans in by_index.items():
                length = sum(b - a for a, b in spans)
                share = _overlap(spans, others) / length if others and length > 0 else 0.0
                target = 1.0 + (factors.get((r, i), 1.0) - 1.0) * share
                old = scale.get((r, i), 1.0)
                new[(r, i)] = 0.5 * (old + target)
                moved = max(moved, abs(new[(r, i)] - old) / old)
        scale = new
        if moved < tolerance:
            break
    return simulate(programs, groups, cost, transfer, compute_scale=scale, **kwargs)

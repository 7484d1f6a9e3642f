"""Simulated time for a schedule, for the planner (launch/plan.py) with the costs of a device profile:
`simulate` is the walk of `trainer.parallel.walk` (the rules of the replay, with a cost per
instruction; what each cost means is written there), and `simulate_shared` adds ranks that share a
host's cores and memory: a compute instruction slows down by a factor while other ranks on its host
compute at the same time (found by iterating to a fixed point).
"""
from __future__ import annotations

from trainer.parallel.schedule import OPS, Instr
from trainer.parallel.walk import RankTime, walk


def simulate(programs: dict[int, list[Instr]], groups: dict[str, list[list[int]]], cost, transfer,
             **kwargs) -> dict[int, RankTime]:
    """Simulated time of one micro-step: rank -> RankTime; the walk of `trainer.parallel.walk` with
    costs (keyword arguments as there: mode, start, keep_spans, inner_sync, async_at_end, compute_scale)."""
    return walk(programs, groups, cost=cost, transfer=transfer, **kwargs)


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

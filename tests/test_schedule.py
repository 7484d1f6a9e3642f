"""Schedule replay without a model: every send meets its receive, every collective is entered by
every rank of its group, for many layouts; and a broken schedule is caught."""
from __future__ import annotations

import pytest

from trainer.parallel.layout import LayoutSpec, group_members
from trainer.parallel.schedule import Instr, build_schedule, format_schedule, global_programs
from trainer.parallel.walk import replay


def _spec(num_pp: int, num_dp: int, units: int = 1, chunks: int = 1, head_parallel: bool = True) -> LayoutSpec:
    mode = "data" if num_pp == 1 else ("hybrid" if head_parallel else "pipeline")
    return LayoutSpec(mode=mode, num_pp=num_pp, num_dp=num_dp, micro_batches=units, time_chunks=chunks)


def _groups(num_pp: int, num_dp: int) -> dict:
    """The process groups the runtime builds for this layout (trainer.parallel.layout.group_members)."""
    return group_members(_spec(num_pp, num_dp))


def _programs(num_pp, num_dp, units, chunks, head_parallel, **kw):
    return global_programs(_spec(num_pp, num_dp, units, chunks, head_parallel), **kw)


MODES = ("gloo", "nccl")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_pp", range(2, 9))
@pytest.mark.parametrize("units,chunks", [(1, 1), (2, 1), (4, 1), (8, 1), (3, 2), (1, 4)])
@pytest.mark.parametrize("head_parallel", [True, False])
def test_pipeline_schedules_never_deadlock(num_pp, units, chunks, head_parallel, mode):
    for boundary in (True, False):
        programs = _programs(num_pp, 1, units, chunks, head_parallel, boundary=boundary)
        replay(programs, _groups(num_pp, 1), mode=mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_pp,num_dp", [(1, 2), (1, 8), (2, 2), (2, 4), (4, 2), (3, 3)])
def test_grid_schedules_never_deadlock(num_pp, num_dp, mode):
    programs = _programs(num_pp, num_dp, 3, 2, head_parallel=num_pp > 1)
    replay(programs, _groups(num_pp, num_dp), mode=mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_pp,units,chunks", [(2, 1, 4), (3, 2, 2), (4, 4, 1)])
def test_deferred_weight_gradients_follow_each_ranks_last_backward(num_pp, units, chunks, mode):
    """parallel_layout.defer_weight_grads: one `weight_grads` per rank of every stage but the first, right
    after its last backward (and its last send_backward), before any reduction; none on the first
    stage, which hands no gradient on; the schedules still replay deadlock-free."""
    from dataclasses import replace

    spec = replace(_spec(num_pp, 1, units, chunks), defer_weight_grads=True)
    for boundary in (True, False):
        programs = global_programs(spec, boundary=boundary)
        for rank, prog in programs.items():
            ops = [i.op for i in prog]
            if rank == 0:
                assert "weight_grads" not in ops
                continue
            assert ops.count("weight_grads") == 1
            at = ops.index("weight_grads")
            assert "backward" not in ops[at:] and "send_backward" not in ops[at:]
            assert ops[at - 1] in ("backward", "send_backward")
        replay(programs, group_members(spec), mode=mode)
    assert "weight_grads" not in [i.op for p in global_programs(_spec(num_pp, 1, units, chunks)).values() for i in p]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("head_parallel,num_dp,units,chunks,extra", [
    (True, 1, 1, 1, {}), (True, 1, 3, 2, {}), (True, 2, 2, 2, {}), (False, 1, 2, 3, {}),
    (True, 2, 1, 4, {"head_split": "time"}),
    (True, 1, 2, 2, {"defer_weight_grads": True})])
@pytest.mark.parametrize("num_pp", [2, 3, 4])
def test_deferred_head_weight_gradient_fills_each_ranks_wait(num_pp, head_parallel, num_dp, units, chunks, extra,
                                                            mode):
    """parallel_layout.defer_head_weight_grads: one `head_weight_grads` on every rank that ran a head, except the
    last stage of a hybrid (its head reduction must start before its backward messages, for NCCL): on a stage
    before the last just before its first receive of a backward (its wait for the last stage), then the head
    gradients' reduction; on the last stage of a pipeline after its last backward (and its deferred LSTM weight
    gradients); the schedules replay deadlock-free on gloo and NCCL."""
    from dataclasses import replace

    if extra.get("head_split") and chunks < num_pp:
        pytest.skip("a layout the trainer refuses")
    spec = replace(_spec(num_pp, num_dp, units, chunks, head_parallel), defer_head_weight_grads=True, **extra)
    for boundary in (True, False):
        programs = global_programs(spec, boundary=boundary)
        for rank, prog in programs.items():
            ops = [i.op for i in prog]
            last = rank >= (num_pp - 1) * num_dp
            deferred = "head" in ops and not (last and head_parallel)
            assert ops.count("head_weight_grads") == (1 if deferred else 0), (rank, ops)
            if not deferred:
                assert not head_parallel and not last or (last and head_parallel)
                continue
            at = ops.index("head_weight_grads")
            assert ops.index("head") < at
            if last:
                assert "backward" not in ops[at:] and ops[at - 1] in ("send_backward", "backward", "weight_grads")
            else:
                assert ops[at + 1:].index("recv_backward") <= 1 and "recv_backward" not in ops[:at]
            if head_parallel and boundary:
                assert ops[at + 1] == "reduce_head_grads" and ops.count("reduce_head_grads") == 1
        replay(programs, group_members(spec), mode=mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_pp,num_dp,chunks,shares", [(2, 1, 2, ()), (2, 1, 4, ()), (2, 2, 5, (3, 1)),
                                                          (3, 1, 3, ()), (4, 1, 8, (3, 2, 2, 1)), (8, 1, 8, ())])
def test_head_cut_along_time_never_deadlocks(num_pp, num_dp, chunks, shares, mode):
    """head_split=time: the last stage sends each stage its block after its last forward input, and takes
    each stage's gradients just before its backward reaches that block; every stage runs one head."""
    from dataclasses import replace

    from trainer.parallel.layout import head_blocks

    spec = replace(_spec(num_pp, num_dp, 1, chunks), head_split="time", head_shares=shares)
    blocks = head_blocks(spec)
    assert blocks[0][0] == 0 and blocks[-1][1] == chunks and all(a < b for a, b in blocks)
    for kw in ({"boundary": True}, {"boundary": False}, {"forward_only": True}):
        programs = global_programs(spec, **kw)
        replay(programs, group_members(spec), mode=mode)
        for prog in programs.values():
            assert [i.op for i in prog].count("head") == 1
    last = global_programs(spec)[(num_pp - 1) * num_dp]
    at = {str(i): n for n, i in enumerate(last)}
    for s, (_, stop) in enumerate(blocks[:-1]):
        peer = s * num_dp
        assert at[f"scatter_shard peer {peer}"] > at[f"recv_forward dec u0 c{chunks - 1} peer {(num_pp - 2) * num_dp}"]
        assert at[f"gather_grad peer {peer}"] == at[f"backward dec u0 c{stop - 1}"] - 1 - sum(
            1 for t, (_, b) in enumerate(blocks[:-1]) if b == stop and t > s)


@pytest.mark.parametrize("mode", MODES)
def test_every_shipped_config_never_deadlocks(mode):
    """The layouts of ds_configs/*.json, training (at and between accumulation boundaries) and
    forward-only, on the transport of each device."""
    import json

    from tests.conftest import REPO

    for path in sorted((REPO / "ds_configs").glob("*.json")):
        layout = json.loads(path.read_text())["parallel_layout"]
        world = layout.get("num_pp", 1) * layout.get("num_dp", 1)
        spec = LayoutSpec.from_ds_config({"parallel_layout": layout}, world)
        for kw in ({"boundary": True}, {"boundary": False}, {"forward_only": True}):
            replay(global_programs(spec, **kw), group_members(spec), mode=mode)


def test_nccl_mode_catches_crossing_sends_that_gloo_buffers():
    """Two ranks that send to each other at once: gloo copies both messages out and goes on; on NCCL
    each send waits for a receive the other rank only posts after its own send: a hang."""
    programs = {0: [Instr("send_forward", 0, 0, "enc", 1), Instr("recv_backward", 0, 0, "enc", 1)],
                1: [Instr("send_backward", 0, 0, "enc", 0), Instr("recv_forward", 0, 0, "enc", 0)]}
    groups = {"world": [[0, 1]], "pipe": [[0, 1]], "data": [[0], [1]]}
    replay(programs, groups, mode="gloo")
    with pytest.raises(RuntimeError, match=r"deadlock \(nccl\)"):
        replay(programs, groups, mode="nccl")


def test_nccl_mode_catches_the_old_per_unit_schedule():
    """The per_unit head schedule as it was: the last stage sent unit 0's shard to stage 0 right after
    its forward, while stage 0 was still sending its later units' activations the other way."""
    spec = LayoutSpec(mode="hybrid", num_pp=2, num_dp=1, micro_batches=2, head_schedule="per_unit")
    programs = global_programs(spec)
    last = programs[1]
    scatter = next(i for i in last if i.op == "scatter_shard")
    last.remove(scatter)
    last.insert(next(k for k, i in enumerate(last) if i.op == "forward" and i.unit == 0 and i.kind == "dec") + 1,
                scatter)
    replay(programs, group_members(spec), mode="gloo")  # buffered sends: fine on the CPU
    with pytest.raises(RuntimeError, match=r"deadlock \(nccl\).*send_forward enc u1"):
        replay(programs, group_members(spec), mode="nccl")


def test_a_pair_keeps_one_order_for_every_kind_of_message():
    """gloo and NCCL match a pair's messages in order, whatever our op names: a receive that would take
    another op's message is caught in both modes."""
    programs = {0: [Instr("send_forward", 0, 0, "enc", 1), Instr("scatter_shard", peer=1)],
                1: [Instr("recv_shard", peer=0), Instr("recv_forward", 0, 0, "enc", 0)]}
    groups = {"world": [[0, 1]], "pipe": [[0, 1]], "data": [[0], [1]]}
    for mode in MODES:
        with pytest.raises(RuntimeError, match="arrive in order"):
            replay(programs, groups, mode=mode)


def test_every_unit_and_chunk_runs_forward_and_backward_once():
    for stage in range(3):
        prog = build_schedule(stage, 3, units=4, chunks=2, head_parallel=True)
        for op in ("forward", "backward"):
            done = sorted((i.kind, i.unit, i.chunk) for i in prog if i.op == op)
            assert done == sorted((k, u, c) for k in ("enc", "dec") for u in range(4) for c in range(2))
        # the encoder output leaves before the local decoder runs
        fwd = [(i.op, i.kind, i.unit, i.chunk) for i in prog]
        if stage < 2:
            assert fwd.index(("send_forward", "enc", 0, 1)) < fwd.index(("forward", "dec", 0, 0))
        # backward: decoder chunks first, in reverse time
        bwd = [(i.kind, i.chunk) for i in prog if i.op == "backward" and i.unit == 3]
        assert bwd == [("dec", 1), ("dec", 0), ("enc", 1), ("enc", 0)]


def test_head_phase_only_in_hybrid_on_every_stage():
    hybrid = [build_schedule(s, 4, 2, 1, True) for s in range(4)]
    pipeline = [build_schedule(s, 4, 2, 1, False) for s in range(4)]
    assert all(sum(i.op == "head" for i in p) == 1 for p in hybrid)
    assert [sum(i.op == "head" for i in p) for p in pipeline] == [0, 0, 0, 1]
    assert all(not any(i.op == "reduce_head_grads" for i in p) for p in pipeline)


def test_replay_catches_a_deadlock():
    programs = _programs(3, 1, 2, 1, True)
    # stage 1 waits for a gradient before it has sent its forward activation: a cycle
    prog = programs[1]
    i = next(k for k, ins in enumerate(prog) if ins.op == "send_forward")
    prog.insert(i, Instr("recv_backward", 0, 0, "enc", 2))
    with pytest.raises(RuntimeError, match="deadlock"):
        replay(programs, _groups(3, 1))


def test_replay_catches_a_missing_collective_and_a_lost_message():
    programs = _programs(2, 2, 1, 1, True)
    programs[3] = [i for i in programs[3] if i.op != "reduce_grads"]
    with pytest.raises(RuntimeError, match="deadlock"):
        replay(programs, _groups(2, 2))
    programs = _programs(2, 1, 1, 1, True)
    programs[1] = [i for i in programs[1] if i.op != "recv_forward" or i.kind != "dec"]
    with pytest.raises(RuntimeError):
        replay(programs, _groups(2, 1))


def test_dry_run_prints_every_rank(capsys):
    text = format_schedule(_programs(2, 1, 2, 1, True))
    assert "rank 0" in text and "rank 1" in text and "scatter_shard" in text and "recv_shard" in text


@pytest.mark.parametrize("num_pp,num_dp,units,chunks,head_parallel", [
    (2, 1, 2, 1, True), (4, 1, 3, 2, True), (3, 1, 2, 2, False), (1, 4, 1, 1, False), (2, 2, 2, 2, True),
    (4, 2, 1, 3, True)])
def test_eval_programs_never_deadlock(num_pp, num_dp, units, chunks, head_parallel):
    """The forward-only program (dev loss) is replayed too, with the groups the runtime builds."""
    from trainer.parallel.schedule import OPS

    programs = _programs(num_pp, num_dp, units, chunks, head_parallel, forward_only=True)
    assert all(OPS[i.op].eval for prog in programs.values() for i in prog)
    assert all(not any(i.op in ("backward", "optimizer_step", "reduce_grads") for i in p) for p in programs.values())
    for mode in MODES:
        replay(programs, _groups(num_pp, num_dp), mode=mode)


def test_replay_uses_each_ops_group():
    """A collective checked against the wrong ranks is caught: the replay takes every collective's group
    from the op (schedule.OPS), over the members the runtime builds (layout.group_members)."""
    groups = _groups(2, 2)
    replay(_programs(2, 2, 1, 1, True), groups)
    swapped = dict(groups, pipe=groups["data"])  # what a runtime reducing head gradients over replicas would do
    with pytest.raises(RuntimeError, match="root rank 2 is not in its 'pipe' group"):
        replay(_programs(2, 2, 1, 1, True), swapped)


def test_every_op_has_a_kind_and_collectives_a_group():
    from trainer.parallel.schedule import KINDS, OPS

    for op in OPS.values():
        assert op.kind in KINDS
        assert bool(op.group) == (op.kind == "collective"), op.name
        if op.kind in ("send", "recv"):
            assert OPS[op.pairs].pairs == op.name and OPS[op.pairs].kind != op.kind
    with pytest.raises(ValueError, match="unknown instruction"):
        Instr("teleport")


@pytest.mark.parametrize("num_pp", [2, 3, 4])
@pytest.mark.parametrize("units", [4, 5, 8])
@pytest.mark.parametrize("chunks", [1, 2])
@pytest.mark.parametrize("mode", MODES)
def test_per_unit_head_schedules_never_deadlock(num_pp, units, chunks, mode):
    spec = LayoutSpec(mode="hybrid", num_pp=num_pp, num_dp=1, micro_batches=units, time_chunks=chunks,
                      head_schedule="per_unit")
    for boundary in (True, False):
        replay(global_programs(spec, boundary=boundary), group_members(spec), mode=mode)
    replay(global_programs(spec, forward_only=True), group_members(spec), mode=mode)
    grid = LayoutSpec(mode="hybrid", num_pp=num_pp, num_dp=2, micro_batches=units, head_schedule="per_unit")
    replay(global_programs(grid), group_members(grid), mode=mode)


def test_per_unit_heads_run_where_they_should():
    """Each unit's head runs once, on stage u % num_pp; the last stage runs its own units' heads
    between its forwards and starts the backward of its last unit before waiting for anyone."""
    progs = {s: build_schedule(s, 2, units=4, chunks=1, head_parallel=True, head_schedule="per_unit") for s in (0, 1)}
    heads = {s: [i.unit for i in p if i.op == "head"] for s, p in progs.items()}
    assert heads == {0: [0, 2], 1: [1, 3]}
    last = [str(i) for i in progs[1]]
    assert last.index("head u1") < last.index("forward enc u2 c0")  # between forwards
    assert last.index("backward dec u3 c0") < min(i for i, s in enumerate(last) if s.startswith("gather_grad"))
    assert [i.unit for i in progs[1] if i.op == "gather_grad"] == [2, 0]  # each just before its unit's backward
    # the other stages' shards leave once the last forward input is in (NCCL: no crossing sends)
    assert last.index("recv_forward dec u3 c0 peer 0") < last.index("scatter_shard u0 peer 0")

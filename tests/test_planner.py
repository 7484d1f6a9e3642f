"""The planner: the simulator's refinements, the cost model on synthetic profiles (known numbers, no
training), candidate layouts, launch/plan.py's output and --write-config, the GPU profile, and a
calibration of tiny shapes (slow)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, run_cli
from tests.planner_profiles import measured_profile, write
from trainer.config import ModelConfig, load_config, merge_overrides
from trainer.data import collate
from trainer.parallel.layout import LayoutSpec, group_members
from trainer.parallel.schedule import Instr, global_programs
from trainer.parallel.simulate import simulate, simulate_shared
from trainer.planner.candidates import enumerate_layouts
from trainer.planner.costs import MicroStepCosts, encoder_counts
from trainer.planner.fit import Curve, nnls
from trainer.planner.profile import MeasuredDevice, ProfileError, load, resolve
from trainer.planner.shapes import Cut, ModelDims, stages_of
from trainer.training import memory

VOCAB = 50


def _dims(layers=2, hidden=8, dropout=0.0):
    return ModelDims.build(ModelConfig(emb_dim=hidden, hidden=hidden, layers=layers, dropout=dropout), VOCAB, VOCAB)


def _profile(tmp_path, dims, **kw):
    model = {"emb_dim": dims.emb, "hidden": dims.hidden, "layers": dims.layers, "attention": dims.attention,
             "src_vocab": VOCAB, "tgt_vocab": VOCAB}
    return load(str(write(tmp_path / "p.json", measured_profile(model, **kw))))


def _batch(rows=16, src=(12,), tgt=(10,), seed=0):
    rng = np.random.default_rng(seed)
    s = [rng.integers(4, VOCAB, int(src[i % len(src)])) for i in range(rows)]
    t = [rng.integers(4, VOCAB, int(tgt[i % len(tgt)])) for i in range(rows)]
    return collate(s, t)


def _step(device, dims, spec, batch, shared=False, contention=None):
    costs = MicroStepCosts(device, dims, spec, stages_of(dims, spec), Cut(batch, spec), 2)
    kw = dict(inner_sync=costs.inner_sync, async_at_end=False)
    if shared:
        out = simulate_shared(costs.programs, group_members(spec), costs.cost, costs.transfer,
                              {r: "h" for r in costs.programs}, costs.slowdown, **kw)
    else:
        out = simulate(costs.programs, group_members(spec), costs.cost, costs.transfer, **kw)
    return max(rt.end for rt in out.values()), costs


# ---- the simulator's refinements ----
def test_inner_sync_meets_the_group_partway():
    programs = {0: [Instr("optimizer_step")], 1: [Instr("optimizer_step")]}
    groups = {"pipe": [[0, 1]], "world": [[0, 1]], "data": [[0], [1]]}
    cost = {0: 1.0, 1: 3.0}
    out = simulate(programs, groups, lambda r, i: cost[r], lambda r, i: 0.0,
                   inner_sync=lambda r, i: ("pipe", 0.5 * cost[r], 0.1))
    # rank 0 arrives at 0.5, rank 1 at 1.5; the meeting ends at 1.6; each then does its second half
    assert out[0].end == pytest.approx(2.1) and out[1].end == pytest.approx(3.1)
    assert out[0].busy == pytest.approx(1.0) and out[0].communicating == pytest.approx(1.1)
    assert out[1].communicating == pytest.approx(0.1)


def test_async_broadcast_can_be_left_to_the_next_step():
    spec = LayoutSpec("hybrid", 2, 1)
    programs = global_programs(spec)
    slow = lambda r, i: 5.0 if i.op == "broadcast_head" else 0.01  # noqa: E731
    held = simulate(programs, group_members(spec), slow, lambda r, i: 0.0)
    left = simulate(programs, group_members(spec), slow, lambda r, i: 0.0, async_at_end=False)
    for r in programs:
        assert held[r].end == pytest.approx(left[r].async_done) and left[r].end < left[r].async_done - 4


def test_an_async_collectives_post_is_taken_from_its_callers_clock_and_nothing_else():
    """On a CPU rank of one thread gloo's thread works on the caller's core: an async reduce of the head's
    gradients took 7-8.5 ms from the compute beside it (13 ms alone, 9 ms of CPU; journal 2026-12-07). The walk
    charges `post` to the caller when it starts the collective; the collective itself still runs after it."""
    programs = {r: [Instr("reduce_head_grads", peer=1), Instr("forward")] for r in (0, 1)}
    groups = {"pipe": [[0, 1]], "world": [[0, 1]], "data": [[0], [1]]}
    cost = lambda r, i: 2.0 if i.op == "reduce_head_grads" else 1.0  # noqa: E731
    free = simulate(programs, groups, cost, lambda r, i: 0.0)
    charged = simulate(programs, groups, cost, lambda r, i: 0.0, post=lambda r, i: 0.25 * (r + 1))
    for r in (0, 1):
        assert free[r].end == pytest.approx(2.0) and free[r].communicating == 0.0  # the forward hides it
        assert charged[r].communicating == pytest.approx(0.25 * (r + 1))
        assert charged[r].busy == pytest.approx(1.0)
        assert charged[r].async_done == pytest.approx(0.5 + 2.0)  # from the later rank's post
        assert charged[r].end == pytest.approx(2.5)


def test_the_profiles_transfer_lines_take_their_own_columns(tmp_path):
    """p2p points are [bytes, one-way ms, posting ms]: the one-way line was fitted to the last column, the
    posting, so that a message of 8 MB cost 0.1 ms for 3.5 (2026-12-01 to 2026-12-07). A verb's third column is
    its CPU time, the price of starting it asynchronously on a one-thread rank; a profile without it prices
    that at nothing."""
    model = {"emb_dim": 8, "hidden": 8, "layers": 2, "attention": "general", "src_vocab": 50, "tgt_vocab": 60}
    base = measured_profile(model)
    base["transfers"]["gloo"]["p2p"] = [[b, 0.2 + 4e-4 * b / 1000, 0.1] for b in (1000, 1000000)]
    dev = MeasuredDevice(load(str(write(tmp_path / "a.json", base))), "bf16", 1)
    post, arrive = dev.p2p(1000000)
    assert post == pytest.approx(0.1e-3) and arrive == pytest.approx(0.6e-3)
    assert dev.collective_cpu("reduce", 1000000, 2) == 0.0
    base["transfers"]["gloo"]["reduce"] = [[b, 0.05 + 1e-6 * b, 0.5e-6 * b] for b in (1000, 1000000)]
    dev = MeasuredDevice(load(str(write(tmp_path / "b.json", base))), "bf16", 1)
    assert dev.collective("reduce", 1000000, 2) == pytest.approx(1.05e-3)
    assert dev.collective_cpu("reduce", 1000000, 2) == pytest.approx(0.5e-3)
    assert dev.collective_cpu("broadcast", 1000000, 2) == 0.0 and dev.collective_cpu("reduce", 1000000, 1) == 0.0


def test_shared_host_slows_only_overlapping_compute():
    groups = {"world": [[0, 1]], "pipe": [[0, 1]], "data": [[0], [1]]}
    f = Instr("forward", 0, 0, "enc")
    together = {0: [f], 1: [f]}  # both compute from t=0
    out = simulate_shared(together, groups, lambda r, i: 1.0, lambda r, i: 0.0, {0: "h", 1: "h"}, lambda r, i: 2.0)
    assert out[0].end == pytest.approx(2.0, rel=1e-2) and out[1].end == pytest.approx(2.0, rel=1e-2)
    apart = {0: [f, Instr("send_forward", 0, 0, "enc", 1)], 1: [Instr("recv_forward", 0, 0, "enc", 0), f]}
    compute = lambda r, i: 1.0 if i.op == "forward" else 0.0  # noqa: E731
    out = simulate_shared(apart, groups, compute, lambda r, i: 0.0, {0: "h", 1: "h"}, lambda r, i: 2.0)
    assert out[1].end == pytest.approx(2.0, rel=1e-3)  # one after the other: no slowdown
    out = simulate_shared(together, groups, lambda r, i: 1.0, lambda r, i: 0.0, {0: "a", 1: "b"}, lambda r, i: 2.0)
    assert out[0].end == pytest.approx(1.0)  # different hosts


def test_fits():
    a = np.random.default_rng(1).random((30, 3))
    assert np.allclose(nnls(a, a @ [2.0, 0.0, 1.0]), [2.0, 0.0, 1.0], atol=1e-8)
    assert (nnls(a, a @ [1.0, -1.0, 1.0]) >= 0).all()  # never a negative cost
    c = Curve([4, 1, 16], [4, 1, 16])
    assert c(8) == pytest.approx(8) and c(32) == pytest.approx(32) and c(0) == pytest.approx(1)


# ---- the cost model on a synthetic profile ----
def test_lstm_table_fits_and_interpolates(tmp_path):
    dims = _dims()
    dev = MeasuredDevice(_profile(tmp_path, dims), "bf16", 1, dims)
    assert dev.lstm_fused("fwd", 8, 8, 8, 10) == pytest.approx((0.1 + 10 * (0.01 + 0.008)) / 1000)
    assert dev.lstm_fused("bwd", 8, 8, 64, 4) == pytest.approx((0.1 + 4 * 2 * (0.01 + 0.064)) / 1000)
    assert dev.lstm_packed("fwd", 8, 8, [4, 4, 2]) == pytest.approx(
        (0.1 + 1.5 * (3 * 0.01 + 0.001 * 10)) / 1000)
    assert MeasuredDevice(_profile(tmp_path, dims), "bf16", 2, dims).lstm_fused("fwd", 8, 8, 8, 10) == pytest.approx(
        dev.lstm_fused("fwd", 8, 8, 8, 10) / 2)
    assert encoder_counts([5, 3, 3, 1], 1, 5) == [3, 3, 1, 1]


def test_single_step_is_the_sum_of_its_instructions(tmp_path):
    dims = _dims()
    dev = MeasuredDevice(_profile(tmp_path, dims), "bf16", 1, dims)
    spec = LayoutSpec("single", 1, 1)
    step, costs = _step(dev, dims, spec, _batch())
    assert step == pytest.approx(sum(costs.cost(0, i) for i in costs.programs[0]))
    head = next(i for i in costs.programs[0] if i.op == "head")
    tokens = 16 * 11  # every target has 10 pieces + EOS
    assert costs.parts[(0, head)]["head"] == pytest.approx((0.1 + 0.01 * tokens) / 1000)
    opt = next(i for i in costs.programs[0] if i.op == "optimizer_step")
    params = sum(p.count for p in dims.layer_params) + dims.head_params.count
    assert costs.parts[(0, opt)]["optimizer"] == pytest.approx((0.5 + 1e-5 * params) / 1000, rel=1e-6)


def test_a_host_rank_pays_for_the_mask_rows_it_draws_and_an_accelerator_for_the_micro_batch(tmp_path):
    """trainer.model.dropout on the host draws the row blocks a rank computes: a data-parallel replica's masks cost
    what its rows do (two replicas of 16 rows: 8 blocks between them, as one process's), a head shard's too; the
    roofline (a GPU) draws each site for the whole micro-batch on every rank."""
    dims = _dims(dropout=0.3)
    dev = MeasuredDevice(_profile(tmp_path, dims), "bf16", 1, dims)
    mask = lambda costs, rank: sum(v.get("mask", 0.0) for (r, _), v in costs.parts.items() if r == rank)  # noqa: E731
    batch = _batch(rows=32)
    _, single = _step(dev, dims, LayoutSpec("single", 1, 1), batch)
    _, data = _step(dev, dims, LayoutSpec("data", 1, 2), batch)
    fixed = dev.dropout_mask(1) - (dev.dropout_mask(2) - dev.dropout_mask(1))  # the line's per-draw term
    sites = 2 + 2 * dims.layers + 1  # embeddings, every layer's output on both sides, the head
    assert mask(data, 0) == pytest.approx(mask(data, 1))
    assert mask(data, 0) + mask(data, 1) == pytest.approx(mask(single, 0) + sites * fixed)
    _, hybrid = _step(dev, dims, LayoutSpec("hybrid", 2, 1), batch)
    head = lambda costs, rank: sum(v.get("mask", 0.0) for (r, i), v in costs.parts.items()  # noqa: E731
                                   if r == rank and i.op == "head")
    assert head(hybrid, 0) + head(hybrid, 1) == pytest.approx(head(single, 0) + fixed)
    from trainer.planner.roofline import RooflineDevice
    roofline = RooflineDevice(load(resolve("h200")), "bf16", "nvlink", dims)
    _, gpu_single = _step(roofline, dims, LayoutSpec("single", 1, 1), batch)
    _, gpu_data = _step(roofline, dims, LayoutSpec("data", 1, 2), batch)
    assert mask(gpu_data, 0) == pytest.approx(mask(gpu_single, 0))


def test_ragged_sources_take_the_packed_path_for_their_tail(tmp_path):
    dims = _dims()
    dev = MeasuredDevice(_profile(tmp_path, dims), "bf16", 1, dims)
    spec = LayoutSpec("single", 1, 1)
    even, _ = _step(dev, dims, spec, _batch(src=(12,)))
    ragged, costs = _step(dev, dims, spec, _batch(src=(12, 6)))
    chunk = costs.cut.chunk(0, "enc", 0, 0)
    assert min(chunk.lengths) == 7 and max(chunk.lengths) == 13  # with EOS
    assert ragged > even  # fewer real steps, but the tail runs the packed path (1.5x per step here) in a second call
    fused_only = dev.lstm_fused("fwd", 8, 8, 16, 7) + dev.lstm_packed("fwd", 8, 8, [8] * 6)
    assert costs._lstm("fwd", "enc", 1, 8, chunk) == pytest.approx(fused_only + dev.copy_bytes(2 * 16 * 13 * 8 * 2))


def test_parallel_layouts_split_the_work(tmp_path):
    dims = _dims(layers=2)
    dev = MeasuredDevice(_profile(tmp_path, dims, p2p_latency=0.0, p2p_byte=0.0), "bf16", 1, dims)
    batch = _batch(rows=32, src=(30,), tgt=(30,))
    single, _ = _step(dev, dims, LayoutSpec("single", 1, 1), batch)
    data, _ = _step(dev, dims, LayoutSpec("data", 1, 2), batch)
    hybrid, costs = _step(dev, dims, LayoutSpec("hybrid", 2, 1), batch)
    assert data < single and hybrid < single
    heads = [i for r in (0, 1) for i in costs.programs[r] if i.op == "head"]
    shares = [costs.parts[(r, i)]["head"] for r, i in zip((0, 1), heads)]
    assert shares[0] == pytest.approx(shares[1])  # equal shards of equal sentences
    assert sum(shares) == pytest.approx((0.2 + 0.01 * 32 * 31) / 1000)
    # the stack of a 2-stage pipeline: more units overlap the stages when the LSTM steps dominate and
    # cost in proportion to their rows (no fixed cost per call or step)
    stack = MeasuredDevice(_profile(tmp_path, dims, lstm_call=0.0, lstm_step=0.0, head_token=1e-5, p2p_latency=0.0, p2p_byte=0.0),
                           "bf16", 1, dims)
    u1, _ = _step(stack, dims, LayoutSpec("pipeline", 2, 1, micro_batches=1), batch)
    u4, _ = _step(stack, dims, LayoutSpec("pipeline", 2, 1, micro_batches=4), batch)
    assert u4 < 0.8 * u1


def test_contention_slows_two_ranks_on_one_host(tmp_path):
    dims = _dims()
    batch = _batch(rows=32, src=(20,), tgt=(20,))
    spec = LayoutSpec("hybrid", 2, 1)
    free = MeasuredDevice(_profile(tmp_path, dims), "bf16", 1, dims)
    busy = MeasuredDevice(_profile(tmp_path, dims, contention={"lstm": 1.5, "head": 1.5}), "bf16", 1, dims)
    t_free, _ = _step(free, dims, spec, batch, shared=True)
    t_busy, _ = _step(busy, dims, spec, batch, shared=True)
    assert 1.1 * t_free < t_busy < 1.5 * t_free
    single = LayoutSpec("single", 1, 1)
    assert _step(busy, dims, single, batch, shared=True)[0] == pytest.approx(_step(free, dims, single, batch)[0])
    # a whole step's factor (the ceiling's measurement), where calibrated, holds for every component
    whole = MeasuredDevice(_profile(tmp_path, dims, contention={"lstm": 1.5, "head": 1.0, "step": 1.2}), "bf16", 1, dims)
    assert whole.slowdown("lstm") == whole.slowdown("head") == whole.slowdown("copy") == 1.2


def test_bf16_gradient_sums_are_priced_by_their_own_line_where_calibrated(tmp_path):
    dims = _dims()
    plain = MeasuredDevice(_profile(tmp_path, dims), "bf16", 1, dims)  # a profile from before the bf16 line
    slow = MeasuredDevice(_profile(tmp_path, dims, bf16_sum_byte=3e-6), "bf16", 1, dims)
    n = 1_000_000
    assert slow.collective("all_reduce", n, 2, itemsize=2) == pytest.approx((0.05 + 3e-6 * n) / 1000)
    assert slow.collective("all_reduce", n, 2) == pytest.approx(plain.collective("all_reduce", n, 2, itemsize=2))
    assert slow.collective("reduce", n, 2, itemsize=2) == pytest.approx((0.05 + 1e-6 * n) / 1000)  # sums only
    batch = _batch(rows=32, src=(20,), tgt=(20,))
    data = LayoutSpec("data", 1, 2)
    assert _step(slow, dims, data, batch)[0] > _step(plain, dims, data, batch)[0]


def test_messages_carry_the_interpreters_shapes(tmp_path):
    dims = _dims()
    dev = MeasuredDevice(_profile(tmp_path, dims), "bf16", 1, dims)
    batch = _batch(rows=10, src=(9, 5), tgt=(7, 3))
    spec = LayoutSpec("hybrid", 2, 1, micro_batches=2, time_chunks=2)
    _, costs = _step(dev, dims, spec, batch)
    for (rank, ins), nbytes in costs.sizes.items():
        if ins.op == "send_forward":
            unit = costs.cut.units(0)[ins.unit]
            width = unit.src.shape[1] if ins.kind == "enc" else unit.tgt_in.shape[1]
            assert nbytes == unit.size * [(width + 1) // 2, width // 2][ins.chunk] * dims.hidden * 2
        if ins.op == "scatter_shard":
            piece = costs.cut.piece(0, 0)
            assert piece.size == 5 and nbytes == 5 * (piece.src.shape[1] + piece.tgt_in.shape[1]) * dims.hidden * 2


@pytest.mark.parametrize("devices", [2, 4, 8])
def test_candidates_are_layouts_the_trainer_accepts_with_unique_instructions(devices):
    cfg = ModelConfig(layers=4)
    cands, invalid = enumerate_layouts(devices, cfg, min_batch=16, global_batch=64)
    modes = {c.spec.mode for c in cands}
    assert {"single", "data", "pipeline", "hybrid"} <= modes
    # left out: 3 replicas of a batch of 64 (uneven), 4 replicas x 8 units (32 sentences per batch, more than 16)
    assert (invalid > 0) == (devices > 2)
    assert {c.ranks for c in cands} >= {1, 2, devices}  # GPUs: layouts on fewer devices too
    for c in cands:
        c.spec.check_model(cfg, 16, 64 // c.spec.num_dp)
        assert LayoutSpec.from_ds_config({"parallel_layout": c.layout_json()}, c.ranks) == c.spec
        for prog in global_programs(c.spec).values():
            assert len(set(prog)) == len(prog)  # costs are keyed by (rank, instruction)


def test_every_shipped_layout_is_one_the_planner_can_choose():
    """parallel_layout auto chooses among the planner's candidates: every layout ds_configs/ ships is one of them
    (hybrid_2_wide's head cut along time was not, so auto could never pick the fastest wide layout)."""
    import json

    from trainer.parallel.layout import layout_world
    from tests.conftest import REPO

    cfg = ModelConfig(layers=4)
    missing = []
    for path in sorted((REPO / "ds_configs").glob("*.json")):
        ds = json.loads(path.read_text())
        world = layout_world(ds)
        spec = LayoutSpec.from_ds_config(ds, world)
        cands, _ = enumerate_layouts(world, cfg, min_batch=8, global_batch=ds["train_micro_batch_size_per_gpu"] *
                                     spec.num_dp)
        if spec not in {c.spec for c in cands}:
            missing.append(path.name)
    assert not missing, f"shipped layouts the planner never ranks: {missing}"
    wide = next(c for c in enumerate_layouts(2, cfg, 8, 64)[0] if c.spec.head_split == "time"
                and c.spec.time_chunks == 4)
    assert wide.label() == "hybrid 2 u1 c4 head by time" and wide.layout_json()["head_split"] == "time"


def test_a_profile_for_another_model_is_refused(tmp_path):
    dims = _dims()
    with pytest.raises(ProfileError, match="calibrated for another model.*hidden: 8 there, 16 here"):
        MeasuredDevice(_profile(tmp_path, dims), "bf16", 1, _dims(hidden=16))
    with pytest.raises(ProfileError, match="not calibrated for 4 thread"):
        MeasuredDevice(_profile(tmp_path, dims), "bf16", 4, dims)
    bad = tmp_path / "bad.json"
    bad.write_text('{"device": {}, "layers": ')
    with pytest.raises(ProfileError, match="bad.json:1: invalid JSON"):
        load(str(bad))
    broken = _profile(tmp_path, dims)
    broken["layers"]["bf16"]["1"]["head"][0][-1] = float("inf")
    with pytest.raises(ProfileError, match=r"layers\.bf16\.1\.head: must be a non-empty list of lists of finite"):
        MeasuredDevice(broken, "bf16", 1, dims)
    gpu = load(resolve("h200"))
    gpu["roofline"]["memory_tb_s"]["value"] = 0
    from trainer.planner.roofline import RooflineDevice
    with pytest.raises(ProfileError, match=r"roofline\.memory_tb_s: must be a finite number > 0"):
        RooflineDevice(gpu, "bf16", "nvlink", dims)


# ---- launch/plan.py ----
def _tiny_cfg(tiny_data):
    return ["model.emb_dim=16", "model.hidden=16", "model.layers=2", "model.dropout=0.1", f"data.dir={tiny_data}",
            "data.min_batch_sentences=8", "model.bidirectional_bottom=false", "model.attention=general"]


def _tiny_profile(tmp_path, tiny_data, **kw):
    from trainer.data import read_manifest

    vocab = read_manifest(str(tiny_data))["vocab"]
    model = {"emb_dim": 16, "hidden": 16, "layers": 2, "attention": "general", "src_vocab": vocab["src_size"],
             "tgt_vocab": vocab["tgt_size"]}
    return write(tmp_path / "cpu.json", measured_profile(model, **kw))


def test_plan_ranks_layouts_and_writes_a_loadable_config(tiny_data, tmp_path, capsys):
    from trainer.ds_config import check_batch
    from trainer.parallel.deepspeed_json import load_ds_config
    from trainer.planner.cli import main

    out = tmp_path / "best.json"
    main(["--devices", "2", "--profile", str(_tiny_profile(tmp_path, tiny_data)), "--steps", "3",
          "--deepspeed_config", str(REPO / "ds_configs" / "hybrid_2.json"), "--write-config", str(out),
          *_tiny_cfg(tiny_data)])
    text = capsys.readouterr().out
    table = [line for line in text.splitlines() if line.startswith("| 1 |")]
    assert table and "tokens/s" in text and "predicted busy / waiting / communicating % per rank" in text
    first = table[0].split("|")[2].strip()
    ds = load_ds_config(str(out), max_steps=10)
    spec = LayoutSpec.from_ds_config(ds, ds["parallel_layout"]["num_pp"] * ds["parallel_layout"]["num_dp"])
    check_batch(ds, str(out), spec.num_dp)
    assert ds["train_micro_batch_size_per_gpu"] * spec.num_dp == 64  # hybrid_2's global micro-batch kept
    assert ds["optimizer"] == json.loads((REPO / "ds_configs" / "hybrid_2.json").read_text())["optimizer"]
    assert f"wrote {out}: {first}" in text
    with pytest.raises(FileExistsError, match="never overwrites"):
        main(["--devices", "2", "--profile", str(tmp_path / "cpu.json"), "--steps", "1", "--write-config", str(out),
              *_tiny_cfg(tiny_data)])


def test_every_printed_plan_names_what_its_prices_rest_on_and_marks_predictions(tiny_data, tmp_path, capsys, monkeypatch):
    """Issue 42: '3.6 ms/step, 750014 tokens/s' for 4 GPUs said nothing of estimates never checked on a GPU."""
    from trainer.planner.cli import main
    from trainer.planner.profile import provenance

    main(["--devices", "2", "--profile", "h200", "--steps", "1", "--top", "3", *_tiny_cfg(tiny_data)])
    lines = capsys.readouterr().out.splitlines()
    source = ("prices: h200.json, NVIDIA H200: of its 30 numbers 21 measured on NVIDIA H200 (2026-12-04), 2 from the "
              "datasheet, 7 estimates never checked on a GPU; every figure below is a prediction from them, not a "
              "measurement")
    header = next(i for i, line in enumerate(lines) if line.startswith("| # |"))
    assert source in lines[:header], lines
    assert all(f"predicted {what}" in lines[header] for what in ("step ms", "tokens/s", "speed-up", "busy"))
    assert any(line.startswith("one device (single): predicted ") for line in lines[:header])
    assert lines[-1].startswith("predicted best of each mode on all 2 device(s): ")
    # a calibrated machine's profile: where and when it was measured; one from before `measured_on` still reads
    old = load(str(_tiny_profile(tmp_path, tiny_data)))
    monkeypatch.setenv(memory.ALLOCATOR_ENV, "glibc")  # what a training process would run under here
    assert provenance(old) == ("prices: cpu.json, measured by python launch/plan.py --calibrate on synthetic (2 cores), "
                               "date not recorded (a profile from before dates were kept), allocator not recorded "
                               "(before 2026-12-07: glibc) where training runs under glibc: prices may be off, "
                               "calibrate again; every figure below is a prediction from them, not a measurement")
    new = {**old, "measured_on": {"device": "Intel(R) Xeon(R) Processor (2 cores)", "date": "2026-12-04"},
           "conditions": {"quick": True, "allocator": "glibc"}}
    assert provenance(new).startswith("prices: cpu.json, measured by python launch/plan.py --calibrate --quick (fewer "
                                      "shapes and repeats) on Intel(R) Xeon(R) Processor (2 cores), 2026-12-04, under "
                                      "glibc; ")
    # calibrated under another allocator than training runs with: said, with what to do
    other = {**new, "conditions": {"allocator": "libmimalloc.so.3"}}
    assert ", under libmimalloc.so.3 where training runs under glibc: prices may be off, calibrate again; " in \
        provenance(other)
    # another GPU's datasheet profile: the one number it borrows from this workplace's H200 says so
    from trainer.planner.profile import datasheet_profile, planner_profile

    sheet = {**planner_profile(datasheet_profile("NVIDIA A100-SXM4-80GB")), "_path": "a100.json"}
    assert provenance(sheet).startswith("prices: a100.json, NVIDIA A100-SXM4-80GB: of its 26 numbers 1 measured on "
                                        "this workplace's H200 (2026-10-28 and 2026-11-04), 2 from the datasheet, 23 "
                                        "estimates never checked on a GPU")


def test_a_profiles_strings_reach_the_terminal_printable_and_bounded(tiny_data, tmp_path, capsys):
    """A profile is a file a user hands over: its device name, `measured_on` and allocator were printed in the
    plan's prices line as the file gave them (terminal escapes, newlines, up to the 4 MB a profile may be)."""
    from trainer.planner.cli import main

    path = _tiny_profile(tmp_path, tiny_data)
    hostile = json.loads(path.read_text())
    hostile["device"]["name"] = "\x1b[2J\x1b]0;pwned\x07" + "A" * 100_000
    hostile["measured_on"] = {"device": "line one\nline two\r\x1b[31m", "date": "\u009b2026"}
    hostile["conditions"] = {"allocator": "\x00" * 5000}
    path.write_text(json.dumps(hostile))
    main(["--devices", "2", "--profile", str(path), "--steps", "1", "--top", "2", *_tiny_cfg(tiny_data)])
    out = capsys.readouterr().out
    assert not any(c in out for c in "\x1b\x07\x00\r\x9b"), "a control character reached the terminal"
    prices = next(line for line in out.splitlines() if line.startswith("prices: "))
    assert "on line one\\nline two\\r\\x1b[31m, \\x9b2026, under \\x00\\x00" in prices
    assert "more characters)" in prices and len(prices) < 2000
    assert max(map(len, out.splitlines())) < 2000


def test_scale_batch_grows_the_global_batch_with_the_devices(tiny_data, tmp_path, capsys):
    """Issue 42: the planner kept the global batch whatever the device count; GPU users grow it with the GPU count.
    --scale-batch plans every layout at the base's batch per rank x --devices and compares tokens/s with one
    device at the batch per rank."""
    from trainer.parallel.deepspeed_json import load_ds_config
    from trainer.planner import plan
    from trainer.planner.cli import main

    single, hybrid = (json.loads((REPO / "ds_configs" / f"{n}.json").read_text()) for n in ("single", "hybrid_2"))
    assert plan.batch_per_rank(single) == 64 and plan.batch_per_rank(hybrid) == 32  # 64 pairs on its 2 ranks
    with pytest.raises(ValueError, match="--scale-batch: the base's global micro-batch of 33 pairs does not divide"):
        plan.batch_per_rank({**hybrid, "train_micro_batch_size_per_gpu": 33})
    profile_path, out = _tiny_profile(tmp_path, tiny_data, threads=(1,)), tmp_path / "best.json"
    main(["--devices", "2", "--profile", str(profile_path), "--steps", "2", "--scale-batch", "--write-config", str(out),
          *_tiny_cfg(tiny_data)])
    text = capsys.readouterr().out
    assert ("128 pairs per global micro-batch x 1 (64 per device x 2: --scale-batch); speed-up: predicted tokens/s over "
            "one device's at 64 pairs") in text
    assert "one device (single 1 thread at 64 pairs): predicted " in text
    written = load_ds_config(str(out), max_steps=10)
    assert written["train_micro_batch_size_per_gpu"] * written["parallel_layout"]["num_dp"] == 128
    cfg = load_config(None, _tiny_cfg(tiny_data))
    profile = load(str(profile_path))
    grown, base = plan.workload(cfg, single, 2, global_batch=128), plan.workload(cfg, single, 2)
    ranked, one, _ = plan.rank_layouts(grown, profile, 2, baseline_work=base)
    assert one.global_batch == 64 and {p.global_batch for p in ranked} == {128}
    assert all(p.speedup == pytest.approx(p.tokens_per_s / one.tokens_per_s) for p in ranked if not p.screened_only)
    assert max(grown.tokens(w) for w in grown.windows) > max(base.tokens(w) for w in base.windows)
    from types import SimpleNamespace

    from trainer.planner.cli import batch_words

    assert batch_words(base, one, SimpleNamespace(scale_batch=False, devices=2)) == (  # without it: the base's 64
        "64 pairs per global micro-batch x 1 (the base's, kept for every layout; --scale-batch grows it with the devices)")


def test_a_base_with_bf16_auto_is_planned_in_the_precision_a_launch_would_choose(tiny_data, tmp_path, capsys):
    """bf16.enabled "auto" was priced as bf16 everywhere: on a CPU that emulates bf16 (10x slower) the plan
    ranked layouts in a precision the run would never train in."""
    from trainer.planner.cli import main

    base = json.loads((REPO / "ds_configs" / "hybrid_2.json").read_text())
    auto = tmp_path / "auto.json"
    auto.write_text(json.dumps({**base, "bf16": {"enabled": "auto"}}))
    path = _tiny_profile(tmp_path, tiny_data)
    slow = json.loads(path.read_text())  # the same machine, every bf16 layer 10x fp32's time
    for table in slow["layers"]["bf16"].values():
        for entries in table["lstm"].values():
            for kind, rows in entries.items():
                entries[kind] = [[*r[:-1], 10 * r[-1]] for r in rows]
        table["head"] = [[*r[:-1], 10 * r[-1]] for r in table["head"]]
    (tmp_path / "slow.json").write_text(json.dumps(slow))
    for prof, want in ((path, "bf16"), (tmp_path / "slow.json", "fp32"), ("h200", "bf16")):
        out = tmp_path / f"best_{want}_{len(str(prof))}.json"
        main(["--devices", "2", "--profile", str(prof), "--steps", "2", "--deepspeed_config", str(auto),
              "--write-config", str(out), *_tiny_cfg(tiny_data)])
        assert json.loads(out.read_text())["bf16"] == {"enabled": "auto"}  # its launch decides on its device
        text = capsys.readouterr().out
        line = text.splitlines()[0]
        assert line.startswith(f"precision: bf16.enabled=auto planned as {want}: "), line
        assert "layers, vocab" in text and f"; {want}; " in text.split("\n")[1]  # the plan's own line says it
    assert "datasheet has bf16" in line
    explicit = tmp_path / "bf16.json"
    explicit.write_text(json.dumps({**json.loads((REPO / "ds_configs" / "hybrid_2.json").read_text()),
                                    "bf16": {"enabled": True}}))
    main(["--devices", "2", "--profile", str(path), "--steps", "2", "--deepspeed_config", str(explicit),
          *_tiny_cfg(tiny_data)])
    assert "precision:" not in capsys.readouterr().out  # an explicit precision is planned as given, in silence


def test_plan_says_it_prices_the_fused_lstm_kernel(tiny_data, tmp_path, capsys):
    from trainer.planner.cli import main

    main(["--devices", "2", "--profile", str(_tiny_profile(tmp_path, tiny_data)), "--steps", "1",
          *_tiny_cfg(tiny_data), "model.lstm_kernel=stepwise"])
    assert "NOTE: model.lstm_kernel=stepwise: the profiles price torch's fused LSTM" in capsys.readouterr().out


def test_plan_prefers_no_communication_when_links_are_slow(tiny_data, tmp_path):
    from trainer.planner import plan

    cfg = load_config(None, _tiny_cfg(tiny_data))
    ds = json.loads((REPO / "ds_configs" / "single.json").read_text())
    work = plan.workload(cfg, ds, steps=2)
    # one thread calibrated: the 2-thread single process is no candidate here (it would scale perfectly)
    fast = load(str(_tiny_profile(tmp_path, tiny_data, p2p_latency=0.0, p2p_byte=0.0, head_token=0.05, threads=(1,))))
    ranked, one, _ = plan.rank_layouts(work, fast, devices=2)
    assert ranked[0].candidate.ranks == 2 and ranked[0].speedup > 1.2
    for p in ranked:  # the rank that ends the step accounts for all of it (the rest of a rank's step is idle)
        sums = [f["busy"] + f["waiting"] + f["communicating"] for f in p.fractions.values()]
        assert 0.9 < max(sums) <= 1.0 + 1e-9 and min(sums) > 0
    slow = load(str(_tiny_profile(tmp_path, tiny_data, p2p_latency=500.0, p2p_byte=0.0, threads=(1,))))
    ranked, _, _ = plan.rank_layouts(work, slow, devices=2)
    assert ranked[0].candidate.spec.mode == "single"


def test_launch_plan_bad_input_is_one_line(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text("[]")
    proc = run_cli([sys.executable, "launch/plan.py", "--devices", "2", "--profile", str(bad)], check=False, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert proc.stderr.startswith(f"error: {bad}: not a device profile")


# ---- the GPU profile ----
def test_gpu_profile_states_a_source_for_every_number_and_plans(tiny_data):
    from trainer.planner import plan

    profile = load(resolve("h200"))

    def leaves(node, path=()):
        if isinstance(node, dict) and "value" in node:
            yield path, node
        elif isinstance(node, dict):
            for k, v in node.items():
                yield from leaves(v, (*path, k))
    numbers = list(leaves(profile["roofline"]))
    assert len(numbers) > 15
    for path, node in numbers:
        assert node["source"].split(":")[0] in ("measured", "datasheet", "estimate", "cuDNN runs fp32 LSTMs on TF32 "
                                                "by default (torch.backends.cudnn.allow_tf32)"), path
    cfg = load_config(None, merge_overrides(_tiny_cfg(tiny_data), ["model.hidden=512", "model.emb_dim=512",
                                                                   "model.layers=4", "data.min_batch_sentences=32"]))
    ds = {**json.loads((REPO / "ds_configs" / "single.json").read_text()), "train_micro_batch_size_per_gpu": 128}
    work = plan.workload(cfg, ds, steps=2)
    best = {}
    for link in ("nvlink", "pcie"):
        ranked, one, _ = plan.rank_layouts(work, profile, devices=4, link=link)
        best[link] = {p.candidate.spec.mode: p for p in reversed(ranked)}
        assert one.step_s > 0 and all(p.step_s > 0 for p in ranked)
    assert best["pcie"]["data"].step_s > best["nvlink"]["data"].step_s  # the whole model crosses the link


def test_shipped_profiles_are_named_package_data_and_what_the_format_code_writes():
    import os
    import tomllib

    from trainer.planner import profile as profiles

    assert "h200" in profiles.shipped() and resolve("h200") == os.path.join(profiles.PROFILES, "h200.json")
    assert resolve("my_machine.json") == "my_machine.json"  # a path: as given
    assert resolve(str(REPO / "x" / "h200")) == str(REPO / "x" / "h200")
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["trainer"]
    shipped = sorted(p.relative_to(REPO / "trainer").as_posix() for p in (REPO / "trainer").glob("planner/profiles/*"))
    assert shipped and all(any(Path(f).match(g) for g in globs) for f in shipped), (shipped, globs)
    # h200.json is the second GPU check's device profile with the roofline section the format's code writes, and the
    # prices `python -m benchmarks.planner gpu-prices` measured from that check: not written by hand
    from benchmarks.planner import gpu_prices

    check = REPO / "benchmarks" / "results" / "gpu" / "2026-12-04-v2"
    shipped = load(resolve("h200"))
    written = profiles.planner_profile(json.loads((check / "device_profile.json").read_text()))
    priced = {*gpu_prices.FITTED, *gpu_prices.LATENCY, "lstm_stack_step_ratio", "lstm_step_device_us"}
    assert ({k: v for k, v in shipped["roofline"].items() if k not in priced}
            == {k: v for k, v in written["roofline"].items() if k not in priced})
    assert all(shipped["roofline"][k]["source"].startswith("measured: ") for k in priced), priced
    assert shipped["calibration"]["check"] == check.name and shipped["device"] == written["device"]
    with pytest.raises(ProfileError, match="--device-name 'NVIDIA X1': no datasheet entry"):
        profiles.datasheet_profile("NVIDIA X1")


def test_a_device_profile_puts_each_measured_number_beside_the_datasheet_with_its_source():
    import time

    from trainer.planner.profile import device_profile, planner_profile, provenance

    measured = {"compute": {"bf16": {"gemm": [{"m": 8, "n": 8, "k": 8, "ms": 1.0, "tflops": 700.0}], "lstm": []}},
                "rates": {"copy_tb_s": 4.0, "host_to_device_gb_s": 50.0, "device_to_host_gb_s": 51.0},
                "op_overhead_us": 6.0}
    got = device_profile({"name": "NVIDIA H200 NVL", "type": "cuda"}, measured)
    assert got["datasheet"]["name"] == "NVIDIA H200 NVL" and got["links"]["nvlink_gb_s"] == 900.0
    assert got["links"]["host_to_device_gb_s"] == 50.0 and got["links"]["allreduce"] is None
    assert got["memory"] == {"copy_tb_s": 4.0} and got["host"] == {"op_overhead_us": 6.0}
    assert got["sources"]["links.nvlink_gb_s"].startswith("datasheet:") and "host.op_overhead_us" in got["sources"]
    roof = planner_profile(got)["roofline"]
    assert roof["gemm_tflops"]["bf16"] == {"value": 700.0,
                                           "source": "measured: largest torch matmul of compute.bf16.gemm (8x8x8)"}
    assert roof["op_overhead_us"]["value"] == 6.0 and roof["memory_tb_s"]["value"] == 4.0
    today = time.strftime("%Y-%m-%d", time.gmtime())
    assert got["measured_on"] == {"device": "NVIDIA H200 NVL", "date": today}  # where and when the check ran
    assert (f"of its 27 numbers 5 measured on NVIDIA H200 NVL ({today}), 2 from the datasheet, 20 estimates "
            in provenance({**planner_profile(got), "_path": "planner_profile.json"}))  # matmul x2, rates, copy, op time
    cpu = device_profile({"name": "x86_64", "type": "cpu", "threads": 2}, {**measured, "rates": {"copy_tb_s": 0.01}})
    assert cpu["datasheet"] is None and cpu["links"]["nvlink_gb_s"] is None


# ---- calibration ----
def test_the_calibration_times_the_head_with_the_loss_settings_training_runs(tiny_data, monkeypatch):
    """The head's table is timed with the loss chunk and projection a training run takes on this machine
    (trainer.training.tuning), not the head's construction defaults."""
    import torch

    from trainer.data import read_manifest
    from trainer.planner import calibrate
    from trainer.planner.shapes import ModelDims

    cfg = load_config(None, _tiny_cfg(tiny_data) + ["train.loss_chunk_rows=64", "train.loss_projection=whole"])
    vocab = read_manifest(str(tiny_data))["vocab"]
    dims = ModelDims.build(cfg.model, vocab["src_size"], vocab["tgt_size"])
    heads, build = [], calibrate.build_head
    monkeypatch.setattr(calibrate, "build_head", lambda *a, **k: heads.append(build(*a, **k)) or heads[-1])
    sizes = calibrate.Sizes(True, 16)
    points = calibrate.head_points(cfg, dims, torch.float32, calibrate.head_pieces(cfg, 16, sizes)[:1], sizes)
    assert len(points) == 1 and points[0][-1] > 0
    assert heads[0].loss_chunk_rows == 64 and heads[0].loss_projection == "whole"


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_calibration_of_tiny_shapes_writes_a_profile_the_planner_reads(tiny_data, tmp_path):
    from trainer.planner import plan
    from trainer.planner.calibrate import calibrate

    cfg = load_config(None, _tiny_cfg(tiny_data))
    out = tmp_path / "cpu.json"
    calibrate(cfg, str(out), quick=True, global_batch=16)
    profile = load(str(out))
    assert profile["conditions"]["quick"] and "load_average_before" in profile["conditions"]
    assert set(profile["conditions"]["beside"]) == {"others", "steal"}  # the machine's other work meanwhile
    assert profile["conditions"]["allocator"] in ("glibc", memory.training_allocator())
    assert profile["measured_on"]["date"] >= "2026-12-04" and profile["measured_on"]["device"].endswith(" cores)")
    for precision in ("bf16", "fp32"):
        for threads in ("1", "2"):
            table = profile["layers"][precision][threads]
            assert all(p[-1] > 0 for p in table["head"]) and all(p[-1] > 0 for p in table["optimizer"])
            assert set(table["overhead"]["instruction_ms"]) >= {"forward", "backward", "head", "optimizer_step"}
        assert set(profile["contention"][precision]) == {"lstm", "head", "embedding", "mask", "copy", "optimizer",
                                                         "step"}
    assert len(profile["transfers"]["gloo"]["p2p"]) == len(profile["transfers"]["gloo"]["all_reduce_bf16"]) == 2
    ds = {**json.loads((REPO / "ds_configs" / "single.json").read_text()), "train_micro_batch_size_per_gpu": 16}
    work = plan.workload(cfg, ds, steps=1)
    ranked, one, _ = plan.rank_layouts(work, profile, devices=2)
    assert one.step_s > 0 and {p.candidate.spec.mode for p in ranked} >= {"single", "data", "hybrid", "pipeline"}
    with pytest.raises(FileExistsError):
        calibrate(cfg, str(out), quick=True)


def test_each_simulated_step_is_kept_and_the_per_step_error_is_a_median(tiny_data, tmp_path):
    from benchmarks.planner.__main__ import WARMUP, step_error_median
    from trainer.planner import plan

    cfg = load_config(None, _tiny_cfg(tiny_data))
    ds = json.loads((REPO / "ds_configs" / "single.json").read_text())
    work = plan.workload(cfg, ds, steps=3)
    profile = load(str(_tiny_profile(tmp_path, tiny_data, threads=(1,))))
    ranked, one, _ = plan.rank_layouts(work, profile, devices=2)
    for p in [one, *ranked]:
        assert len(p.steps_s) == len(work.windows)  # 3 steps: fewer than the 4 screening ones, all simulated
        assert sum(p.steps_s) / len(p.steps_s) == pytest.approx(p.step_s)
    # step by step, after the warm-up steps: one slow step (noise) moves the mean, not the median
    rows = [{"step": i + 1, "step_time_s": 9.0} for i in range(WARMUP)] + \
        [{"step": WARMUP + 1 + i, "step_time_s": t} for i, t in enumerate([1.0, 2.0, 10.0])]
    assert step_error_median([1.1, 2.2, 1.0], rows) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="2 predicted steps against 3 measured"):
        step_error_median([1.0, 2.0], rows)


def test_validate_rounds_take_the_median_round_and_each_steps_median(tmp_path):
    from types import SimpleNamespace

    from benchmarks.planner.__main__ import WARMUP, run_name, validation_row

    assert run_name("bf16", "hybrid_2 u1 c1", 0, tmp_path) == tmp_path / "runs" / "val_bf16_hybrid_2_u1_c1"
    assert run_name("bf16", "hybrid_2 u1 c1", 2, tmp_path).name == "val_bf16_hybrid_2_u1_c1_r3"
    done = []
    for rnd, times in enumerate(([1.0, 1.0, 1.0], [2.0, 2.0, 0.5], [1.5, 1.5, 1.5])):  # s per step after warm-up
        run = run_name("fp32", "data_2", rnd, tmp_path)
        run.mkdir(parents=True)
        steps = [9.0] * WARMUP + times
        (run / "metrics.jsonl").write_text("".join(json.dumps({"step": i + 1, "step_time_s": t}) + "\n"
                                                   for i, t in enumerate(steps)))
        done.append((run, {"step_ms_mean": 1000 * sum(times) / 3, "step_ms_median": 0.0, "timing": {0: {"r": rnd}}}))
    pred = SimpleNamespace(steps_s=[1.5, 1.5, 1.0], op_seconds={}, fractions={})
    row = validation_row("fp32", "data_2", 1250.0, pred, done)
    # means 1000 / 1500 / 1500 ms: the median round is a 1500 ms one (round 3 sorts after round 2 stably)
    assert row["measured_ms"] == pytest.approx(1500.0) and row["error"] == pytest.approx(1250 / 1500 - 1)
    assert row["errors_by_round"] == pytest.approx([0.25, 1250 / 1500 - 1, 1250 / 1500 - 1])
    # each step's median over the rounds: 1.5, 1.5, 1.0 -> the prediction is exact step by step
    assert row["step_error_median"] == pytest.approx(0.0)


def test_validate_measures_how_far_apart_the_ranks_step_by_step():
    from benchmarks.common import rank_skew
    from benchmarks.planner.__main__ import WARMUP

    def row(step, busy0, busy1, comm0, comm1):  # fractions of a 100 ms step
        return {"step": step, "step_time_s": 0.1, "rank0/busy": busy0, "rank1/busy": busy1, "rank0/communicating": comm0,
                "rank1/communicating": comm1, "rank0/waiting": 0.0, "rank1/waiting": 0.0}

    rows = [row(i + 1, 0.5, 0.5, 0.5, 0.5) for i in range(WARMUP)]  # warm-up steps: not counted
    rows += [row(WARMUP + 1, 0.8, 0.6, 0.2, 0.4), row(WARMUP + 2, 0.6, 0.9, 0.4, 0.1)]
    skew = rank_skew(rows)
    assert skew["busy_diff_ms"] == pytest.approx(25.0)  # 20 and 30 ms apart
    assert skew["comm_wait_ms"] == pytest.approx([30.0, 25.0]) and skew["comm_wait_least_ms"] == pytest.approx(15.0)
    assert rank_skew([{"step": 9, "step_time_s": 0.1, "rank0/busy": 1.0}]) is None  # one rank


@pytest.mark.parametrize("scale", [[], ["--scale-batch"]])
def test_a_plan_of_bf16_auto_is_the_plan_of_the_precision_it_chose(tiny_data, tmp_path, capsys, scale):
    """Every shipped JSON says "auto": the ranking made to choose the precision is the plan printed (reused, not
    ranked a third time), line for line the plan of a JSON that names that precision, --scale-batch included."""
    from trainer.planner.cli import main

    path = _tiny_profile(tmp_path, tiny_data)
    base = json.loads((REPO / "ds_configs" / "hybrid_2.json").read_text())
    printed = {}
    for name, bf16 in (("auto", "auto"), ("bf16", True), ("fp32", False)):
        (tmp_path / f"{name}.json").write_text(json.dumps({**base, "bf16": {"enabled": bf16}}))
        main(["--devices", "2", "--profile", str(path), "--steps", "2", *scale, "--deepspeed_config",
              str(tmp_path / f"{name}.json"), *_tiny_cfg(tiny_data)])
        printed[name] = capsys.readouterr().out.splitlines()
    chose = printed["auto"][0].split(" planned as ")[1].split(":")[0]
    assert chose in ("bf16", "fp32") and printed["auto"][1:] == printed[chose]


def test_a_calibration_is_busy_by_what_else_ran_not_by_its_own_two_processes():
    """The load average after a calibration counts its own contention phase (two processes on two cores): a quiet
    2-core machine's calibration was flagged busy at 1.58 (AMD EPYC, 2026-12-07). What else ran decides now."""
    from trainer.planner.calibrate import conditions

    quiet = conditions((0.8, 1.0, 1.7), (1.9, 1.3, 1.7), {"others": 0.02, "steal": 0.0}, 120.0, False)
    assert quiet["quiet"] and "warning" not in quiet and quiet["load_average_after"] == [1.9, 1.3, 1.7]
    beside = conditions((0.8, 1.0, 1.7), (1.9, 1.3, 1.7), {"others": 0.45, "steal": 0.01}, 120.0, False)
    assert beside["warning"] == ("other processes took 0.45 cores and the hypervisor 0.01 during it (> 0.1): measured "
                                 "on a busy machine, the numbers are not worth planning with")
    stolen = conditions((0.8, 1.0, 1.7), (1.0, 1.0, 1.0), {"others": 0.0, "steal": 0.3}, 120.0, False)
    assert not stolen["quiet"]
    # a load average before it counts work that just ended: what ran beside it decides where that is known
    assert conditions((1.64, 1.4, 1.4), (1.3, 1.4, 1.4), {"others": 0.005, "steal": 0.002}, 110.0, False)["quiet"]
    before = conditions((3.4, 1.0, 1.0), (1.0, 1.0, 1.0), None, 120.0, True)  # no /proc/stat
    assert before["warning"].startswith("load average 3.4 > 1.5 before it: measured on a busy machine")

"""ZeRO stage 1 (`zero_optimization.stage: 1`): DeepSpeed's optimizer keeps each replica's fp32 master and optimizer
state of one partition of the flat parameters; the schedule still sums the replicas' gradients
(trainer/parallel/deepspeed_zero.py). As real gloo jobs of the in-process harness (tests/harness.py):

- its step equals single's (no ZeRO) in every layout, with SGD at lr 1 (the step is the clipped gradient) and with
  Adam over several steps (the sharded moments);
- checkpoints stay per (global layer, parameter name): a run moves from a ZeRO grid to single without ZeRO to a
  ZeRO data_2 and continues single's uninterrupted run;
- each replica holds 1/num_dp of the masters and moments (the bytes, per rank).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import REPO
from tests.parallel_jobs import steps_then_save, train_steps
from tests.test_parallel_parity import LAYOUTS, MODEL, TOL, _compare, _ds

ZERO = {"zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True}  # SGD: untested with ZeRO


def _zero_ds(micro: int, layout: dict, zero: bool = True, **precision) -> dict:
    ds = _ds(micro, layout, **precision)
    return {**ds, **ZERO} if zero else ds


def _params(out: list) -> dict:
    params = {}
    for rank_out in out:
        params.update(rank_out["params"])
    return params


@pytest.fixture(scope="module")
def single14(workers, tiny_data, tmp_path_factory):
    out = workers.run(1, train_steps, [f"data.dir={tiny_data}", *MODEL], _ds(14, {"mode": "single"}),
                      str(tmp_path_factory.mktemp("z14")), 2)
    return out[0]["rows"], _params(out)


@pytest.mark.parametrize("name", ["data_2", "grid_2x2", "hybrid_2"])
def test_zero1_step_equals_singles_step(workers, tiny_data, tmp_path, single14, name):
    """ZeRO-1 over the replicas (data_2, the 2x2 grid) and over one (hybrid_2: a partition of the whole stage):
    the same loss, global gradient norm and weights as single without ZeRO, to fp32 summation order."""
    world, _, layout = LAYOUTS[name]
    ds = _zero_ds(14 // layout.get("num_dp", 1), layout)
    out = workers.run(world, train_steps, [f"data.dir={tiny_data}", *MODEL], ds, str(tmp_path / name), 2)
    _compare(single14, (out[0]["rows"], _params(out)), f"{name} ZeRO-1")


def test_zero1_in_fp16_equals_fp16_single(workers, tiny_data, tmp_path):
    """fp16 with ZeRO-1 on the 2x2 grid: ZeRO's own loss scaler (2^16) scales the loss, its step divides it out;
    single's fp16 step without ZeRO, to an fp16 rounding of a weight."""
    ref = workers.run(1, train_steps, [f"data.dir={tiny_data}", *MODEL], _ds(14, {"mode": "single"}, fp16=True),
                      str(tmp_path / "single"), 2)
    layout = LAYOUTS["grid_2x2"][2]
    out = workers.run(4, train_steps, [f"data.dir={tiny_data}", *MODEL], _zero_ds(7, layout, fp16=True),
                      str(tmp_path / "grid"), 2)
    _compare((ref[0]["rows"], _params(ref)), (out[0]["rows"], _params(out)), "grid_2x2 fp16 ZeRO-1", tol=1e-3)


def test_zero1_fp16_overflow_skips_the_step_and_holds_the_lr(workers, tiny_data, tmp_path):
    """An fp16 overflow with ZeRO-1 (data_2): the step is skipped on every replica, the master partitions and the
    LR stay; ZeRO's loss scaler halves the scale after `fp16.hysteresis` (2) overflows, as DeepSpeed's does."""
    from tests.parallel_jobs import overflow_steps

    ds = _zero_ds(7, LAYOUTS["data_2"][2], fp16=True)
    ds["fp16"]["initial_scale_power"] = 24
    ds["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0.1, "warmup_max_lr": 1.0,
                                                      "warmup_num_steps": 10, "warmup_type": "linear"}}
    out = workers.run(2, overflow_steps, [f"data.dir={tiny_data}", *MODEL], ds, str(tmp_path / "z"), 10)
    steps = out[0]["steps"]
    print([(s["skipped"], s["lr"], s["scale"]) for s in steps])
    assert steps[0]["skipped"] and not steps[-1]["skipped"], steps
    lr = 0.1
    for s in steps:
        if s["skipped"]:
            assert not s["moved"] and s["lr"] == lr and s["scale"][1] in (s["scale"][0], s["scale"][0] / 2), s
        else:
            assert s["moved"] and s["scale"][1] == s["scale"][0], s
        lr = s["lr"]
    assert lr > 0.1 and steps[-1]["scale"][1] < steps[0]["scale"][0], steps
    assert [[(s["skipped"], s["lr"]) for s in o["steps"]] for o in out[1:]] == [[(s["skipped"], s["lr"]) for s in steps]]


def _adam_ds(micro: int, layout: dict, zero: bool, bf16: bool = False) -> dict:
    """The shipped recipe (Adam, warm-up then decay, clipping 1.0), 2 accumulation steps."""
    ds = json.loads((REPO / "ds_configs" / "single.json").read_text())
    ds.update(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=2, parallel_layout=layout,
              bf16={"enabled": bf16}, zero_optimization={"stage": 1 if zero else 0})
    ds["scheduler"]["params"].update(warmup_num_steps=2)  # its length: train.max_steps
    return ds


ADAM = [*MODEL, "model.dropout=0", "train.max_steps=6"]


@pytest.fixture(scope="module")
def adam_single(workers, tiny_data, tmp_path_factory):
    out = workers.run(1, train_steps, [f"data.dir={tiny_data}", *ADAM], _adam_ds(14, {"mode": "single"}, False),
                      str(tmp_path_factory.mktemp("adam")), 6)
    return out[0]["rows"], _params(out)


def _losses_agree(ref_rows: list, rows: list, label: str, tol: float = 1e-5) -> None:
    by_step = {r["step"]: r["loss"] for r in ref_rows}
    assert rows, label
    worst = max(abs(r["loss"] - by_step[r["step"]]) for r in rows)
    print(f"{label}: max |loss - single| = {worst:.3g} over steps {[r['step'] for r in rows]}")
    assert worst < tol, (label, rows)


def test_zero1_with_adam_follows_single_step_by_step(workers, tiny_data, tmp_path, adam_single):
    """Adam's moments live only in the partition's owner: over 6 steps the 2x2 grid with ZeRO-1 keeps single's
    loss at every step and ends at its weights."""
    layout = LAYOUTS["grid_2x2"][2]
    out = workers.run(4, train_steps, [f"data.dir={tiny_data}", *ADAM], _adam_ds(7, layout, True), str(tmp_path / "g"),
                      6)
    ref_rows, ref_params = adam_single
    assert ref_rows[-1]["loss"] < ref_rows[0]["loss"] - 1e-3  # Adam moved the model
    _losses_agree(ref_rows, out[0]["rows"], "grid_2x2 ZeRO-1 Adam")
    worst = max(float(np.abs(_params(out)[k] - v).max()) for k, v in ref_params.items())
    assert worst < 1e-5, worst


def test_a_run_moves_between_zero_and_layouts_through_its_checkpoints(workers, tiny_data, tmp_path, adam_single):
    """Steps 1-2 on the 2x2 grid with ZeRO-1, 3-4 on single without ZeRO, 5-6 on data_2 with ZeRO-1, each resuming
    the last one's checkpoint: the files hold whole parameters (gathered from the partitions, cut into them
    again), so the run continues single's uninterrupted one."""
    run = str(tmp_path / "run")
    legs = [("grid_2x2", 4, 7, LAYOUTS["grid_2x2"][2], True), ("single", 1, 14, {"mode": "single"}, False),
            ("data_2", 2, 7, LAYOUTS["data_2"][2], True)]
    for i, (name, world, micro, layout, zero) in enumerate(legs):
        resume = ["train.resume=auto"] if i else []
        out = workers.run(world, steps_then_save, [f"data.dir={tiny_data}", *ADAM, *resume],
                          _adam_ds(micro, layout, zero), run, 2)
        assert [r["step"] for r in out[0]["rows"]] == [2 * i + 1, 2 * i + 2], out[0]["rows"]
        assert all(o["zero_stage"] == int(zero) for o in out)
        _losses_agree(adam_single[0], out[0]["rows"], f"leg {i + 1}: {name}{' ZeRO-1' if zero else ''}")
    worst = max(float(np.abs(_params(out)[k] - v).max()) for k, v in adam_single[1].items())
    assert worst < 1e-5, worst


def test_each_replica_holds_its_share_of_the_optimizer_memory(workers, tiny_data, tmp_path):
    """bf16 data_2: without ZeRO each replica keeps fp32 masters and Adam's two moments of every weight; with
    ZeRO-1 half of them (to the alignment padding of the last partition and Adam's step counters: one per tensor
    without ZeRO, one per flat group with it)."""
    layout = LAYOUTS["data_2"][2]
    bytes_ = {}
    for zero in (False, True):
        out = workers.run(2, steps_then_save, [f"data.dir={tiny_data}", *ADAM], _adam_ds(7, layout, zero, bf16=True),
                          str(tmp_path / f"zero{int(zero)}"), 1)
        bytes_[zero] = [o["optimizer_bytes"] for o in out]
    print(f"optimizer bytes per rank, bf16 data_2: without ZeRO {bytes_[False]}, ZeRO-1 {bytes_[True]}")
    whole = bytes_[False][0]
    assert bytes_[False] == [whole, whole] and whole > 0
    for share in bytes_[True]:
        assert abs(share - whole / 2) <= 3 * 4 * 64, (share, whole)  # 64 fp32 elements of 3 kinds


def test_zero_stage_2_and_3_and_offloading_are_refused_before_anything_is_built(tmp_path):
    from trainer.ds_config import DSConfigError
    from trainer.parallel.deepspeed_json import load_ds_config

    def path(zero: dict, **extra) -> str:
        ds = json.loads((REPO / "ds_configs" / "data_2.json").read_text())
        ds["zero_optimization"] = zero
        ds.update(extra)
        p = tmp_path / "ds.json"
        p.write_text(json.dumps(ds))
        return str(p)

    for zero, expected in (
            ({"stage": 2}, r"zero_optimization.stage=2 is not supported: ZeRO-2 partitions the gradients .*; use "
                           r"stage 1 \(the optimizer state and fp32 masters sharded over the replicas\)"),
            ({"stage": 3}, r"zero_optimization.stage=3 is not supported: .*; use stage 1"),
            ({"stage": 4}, r"zero_optimization.stage=4: must be an integer in 0..3"),
            ({"stage": 1, "offload_optimizer": {"device": "cpu"}},
             r'zero_optimization.offload_optimizer={"device": "cpu"}: offloading is not supported .*drop it')):
        with pytest.raises(DSConfigError, match=expected) as err:
            load_ds_config(path(zero), 100)
        assert "\n" not in str(err.value)
    with pytest.raises(DSConfigError, match=r'zero_optimization.stage=1 with optimizer.type="SGD": DeepSpeed tests '
                                            r'ZeRO with adagrad, adam, adamw, lion only; .*zero_allow_untested'):
        load_ds_config(path({"stage": 1}, optimizer={"type": "SGD", "params": {"lr": 1.0}}), 100)
    assert load_ds_config(path({"stage": 1, "offload_optimizer": {"device": "none"}}), 100)["zero_optimization"]
